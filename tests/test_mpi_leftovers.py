"""tests/mpi_leftovers.py: only the MPI libraries' files that appeared since, and that no live process uses, go.

No MPI job: the files are made here, in a directory of the test's own, and
held open or mapped by child processes as a live rank holds its segment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

import mpi_leftovers
import pytest

pytestmark = pytest.mark.one_environment

#: A child that opens (or also maps) the file named by argv[1], says so, and waits for its stdin to close.
#: Mapped with libc's mmap, then closed: Python's mmap would keep a duplicate descriptor open.
HOLD = """
import ctypes, mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
if sys.argv[2] == "map":
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    assert libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) not in (None, ctypes.c_void_p(-1).value)
    os.close(fd)
print("holding", flush=True)
sys.stdin.read()
"""


def _holder(path, how):
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(path), how], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "holding"
    return child


def test_only_the_new_unused_files_of_mpi_libraries_are_removed(tmp_path):
    for name in ("sm_segment.old.0.1.0", "hpccomm-1-abc"):
        (tmp_path / name).write_bytes(b"\0" * 4096)
    before = mpi_leftovers.mpi_files(str(tmp_path))
    assert before == {"sm_segment.old.0.1.0"}
    new = ["sm_segment.n1.0.a13a0000.0", "vader_segment.n1.2a.0", "mpich_shm_2028a9d2_0",
           "mpich_shm_open_0", "mpich_shm_mapped_0", "not_mpi_0"]
    for name in new:
        (tmp_path / name).write_bytes(b"\0" * 4096)
    opened = _holder(tmp_path / "mpich_shm_open_0", "open")
    mapped = _holder(tmp_path / "mpich_shm_mapped_0", "map")
    try:
        removed = mpi_leftovers.remove_left(before, str(tmp_path))
        left = sorted(path.name for path in tmp_path.iterdir())
    finally:
        for child in (opened, mapped):
            child.stdin.close()
            child.wait(timeout=30)
    assert removed == ["mpich_shm_2028a9d2_0", "sm_segment.n1.0.a13a0000.0", "vader_segment.n1.2a.0"]
    assert left == ["hpccomm-1-abc", "mpich_shm_mapped_0", "mpich_shm_open_0", "not_mpi_0", "sm_segment.old.0.1.0"]
    # Once nothing holds them, they go too.
    assert mpi_leftovers.remove_left(before, str(tmp_path)) == ["mpich_shm_mapped_0", "mpich_shm_open_0"]


def _until_named(pid, name):
    """Wait until process ``pid`` bears ``name``: Popen returns once the exec has begun, and the kernel renames
    the process a moment later: read at once, its name was still "python" (3 of 100 runs of this test failed so
    here, and one CI, on 2026-12-04)."""
    deadline = time.monotonic() + 30  # only against a hang: a process that never execs
    while True:
        with open(f"/proc/{pid}/comm") as comm:
            if comm.read().strip() == name:
                return
        assert time.monotonic() < deadline, f"process {pid} never became {name}"
        time.sleep(0.001)


def test_what_killed_launchers_left_goes_once_its_owner_is_gone(tmp_path):
    (tmp_path / "ompi.1").mkdir()  # from before: stays
    before = mpi_leftovers.launcher_files(str(tmp_path))
    assert before == {"ompi.1"}
    ended = subprocess.Popen(["true"])
    ended.wait(timeout=30)
    for owner in (ended.pid, os.getpid()):  # prterun's session directory, named by its PID
        (tmp_path / f"ompi.{owner}" / "1" / "0").mkdir(parents=True)
        (tmp_path / f"ompi.{owner}" / "pmix.vm.tool").write_text("uri")
    for name in ("hydra_hwloc_xmlfile_a1B2c3", "ompi.vm.0", "not_a_launcher"):
        (tmp_path / name).write_text("x")
    # A process that may be hydra's keeps every new hydra file (it does not name its mpiexec).
    proxy = tmp_path / "hydra_pmi_proxy"
    proxy.symlink_to(shutil.which("sleep"))
    running = subprocess.Popen([str(proxy), "60"])
    try:
        _until_named(running.pid, proxy.name)
        removed = mpi_leftovers.remove_launcher_leftovers(before, str(tmp_path))
    finally:
        running.kill()
        running.wait(timeout=30)
    assert removed == [f"ompi.{ended.pid}"]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        ["ompi.1", f"ompi.{os.getpid()}", "hydra_hwloc_xmlfile_a1B2c3", "ompi.vm.0", "not_a_launcher",
         "hydra_pmi_proxy"])
    assert mpi_leftovers.remove_launcher_leftovers(before, str(tmp_path)) == ["hydra_hwloc_xmlfile_a1B2c3"]


def test_empty_session_folders_that_appeared_go_and_the_rest_stays(tmp_path):
    uid = os.getuid()
    (tmp_path / f"ompi.vm.{uid}" / "jf.0" / "111").mkdir(parents=True)  # from before: stays
    before = mpi_leftovers.launcher_files(str(tmp_path))
    assert before == {f"ompi.vm.{uid}", f"ompi.vm.{uid}/jf.0", f"ompi.vm.{uid}/jf.0/111"}
    for job in (f"ompi.vm.{uid}/jf.0/222", f"ompi.vm.{uid}/jf.0/333/0", f"ompi.n1.{uid}/jf.0/444",
                f"ompi.vm.{uid + 1}/jf.0/5"):  # a job still running (333), another user's tree
        (tmp_path / job).mkdir(parents=True)
    ended = subprocess.Popen(["true"])
    ended.wait(timeout=30)
    for owner in (ended.pid, os.getpid()):  # Open MPI 4 mpirun's session directory, named by its PID
        (tmp_path / f"ompi.vm.{uid}" / f"pid.{owner}" / "0").mkdir(parents=True)
        (tmp_path / f"ompi.vm.{uid}" / f"pid.{owner}" / "contact.txt").write_text("uri")
    removed = mpi_leftovers.remove_launcher_leftovers(before, str(tmp_path))
    assert removed == [f"ompi.n1.{uid}/jf.0/444", f"ompi.vm.{uid}/jf.0/222", f"ompi.n1.{uid}/jf.0",
                       f"ompi.vm.{uid}/pid.{ended.pid}", f"ompi.n1.{uid}"]
    left = sorted(str(path.relative_to(tmp_path)) for path in tmp_path.glob("*/*/*"))
    assert left == sorted([f"ompi.vm.{uid + 1}/jf.0/5", f"ompi.vm.{uid}/jf.0/111", f"ompi.vm.{uid}/jf.0/333",
                           f"ompi.vm.{uid}/pid.{os.getpid()}/0", f"ompi.vm.{uid}/pid.{os.getpid()}/contact.txt"])


#: An MPI singleton that names its MPI library once MPI is up, and finalizes once its stdin closes.
SINGLETON = """
import sys
from mpi4py import MPI
print(MPI.Get_library_version().split(",")[0], flush=True)
sys.stdin.read()
"""


def test_what_a_real_singleton_leaves_goes_once_it_ended(tmp_path):
    before = mpi_leftovers.launcher_files(str(tmp_path))
    singleton = subprocess.Popen([sys.executable, "-c", SINGLETON], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        library = singleton.stdout.readline().strip()
        mpi_leftovers.remove_launcher_leftovers(before, str(tmp_path))
        running = sorted(mpi_leftovers.launcher_files(str(tmp_path)))
    finally:
        singleton.stdin.close()
        assert singleton.wait(timeout=60) == 0
    # Open MPI 5's running job keeps its folders (its job's holds the rank's); other MPI libraries make none.
    assert all(mpi_leftovers.SESSION_TREE.match(name.split("/")[0]) for name in running)
    assert len(running) == 3 if library.startswith("Open MPI v5") else not running, (library, running)
    mpi_leftovers.remove_launcher_leftovers(before, str(tmp_path))
    assert [path.name for path in tmp_path.iterdir()] == []


def test_the_sweep_looks_in_tmp_too_whatever_tmpdir_says(tmp_path, monkeypatch):
    # The MPICH wheel's hydra writes its file to /tmp with TMPDIR set elsewhere (as CI sets it).
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # what TMPDIR would make it
    before = mpi_leftovers.launcher_files_everywhere()
    assert sorted(before) == sorted(["/tmp", str(temp)])
    ended = subprocess.Popen(["true"])
    ended.wait(timeout=30)
    (temp / f"ompi.{ended.pid}").mkdir()
    assert mpi_leftovers.remove_launcher_leftovers_everywhere(before) == [str(temp / f"ompi.{ended.pid}")]
