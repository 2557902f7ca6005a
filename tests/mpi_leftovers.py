"""The shared-memory files MPI libraries leave in /dev/shm when their ranks are killed, found and removed.

Open MPI's shared-memory transport (``sm_segment.<host>.<uid>.<job>.<rank>``,
``vader_segment.*`` before Open MPI 5) and MPICH's (``mpich_shm_*``) remove
their files at MPI_Finalize; a rank killed before then (SIGKILL, MPI_Abort,
a fault-tolerant job's victims) leaves them on tmpfs, that is, in memory,
for good (Open MPI's are 16 MiB each). Many tests kill ranks on purpose, so conftest.py removes,
after each test, the files of these names that appeared during it and that no
live process holds open or mapped (an MPI job of someone else's, started
meanwhile, keeps its own). hpccomm's own segments are not among them: its
tests assert that none is left (tests/ranks/segments.py).

Launchers killed on purpose, or past a test's limit (tests/launch.py), leave
files in the temporary directory as well: Open MPI 5's ``prterun`` its session
directory ``ompi.<its PID>``, MPICH's and Intel MPI's hydra ``mpiexec`` the
topology file it hands its proxies (``hydra_hwloc_xmlfile_*``). Each removes
its own when it exits, so conftest.py removes those that appeared during a
test once their owner is gone (:func:`remove_launcher_leftovers`), in the
temporary directory and in /tmp, where the MPICH wheel's hydra writes its
file whatever ``TMPDIR`` says (CI sets ``TMPDIR``; 7 files stayed in /tmp).

Open MPI 5 without ``prterun`` (a singleton, a rank ``srun`` starts) keeps
its session directory in ``ompi.<node>.<uid>/jf.0/<job>``, and at
MPI_Finalize it removes only the rank's own folder in it: every such job
leaves an empty folder behind, the first also the tree above it (Open MPI
pull request 13261, open). conftest.py removes the empty folders that
appeared during a test; a live job's folder holds its rank's, so it stays.
Open MPI 4's ``mpirun`` keeps its session directory in the same tree, as
``pid.<its PID>``, and leaves it when killed: it goes once its owner is gone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

SHM_DIR = "/dev/shm"
#: File names of the MPI libraries' shared-memory transports.
MPI_SHM_NAME = re.compile(r"^(sm_segment\.|vader_segment\.|mpich_shm_)")
#: What launchers leave in the temporary directory: prterun's session directory (group: its PID), hydra's file.
PRTERUN_DIR = re.compile(r"^ompi\.(\d+)$")
HYDRA_FILE = re.compile(r"^hydra_hwloc_xmlfile_")
#: The command names (/proc/PID/comm) of hydra's processes, any of which may still read its file.
HYDRA_COMMANDS = re.compile(r"^(mpiexec|mpirun|hydra)")
#: Open MPI 5's session directory tree where no prterun made it: ``ompi.<node>.<uid>``.
SESSION_TREE = re.compile(r"^ompi\.[^/]+\.(\d+)$")
#: Open MPI 4's ``mpirun`` session directory in that tree (group: its PID).
MPIRUN_DIR = re.compile(r"^ompi\.[^/]+\.\d+/pid\.(\d+)$")


def mpi_files(directory: str = SHM_DIR) -> set[str]:
    """The names in ``directory`` that an MPI library's shared-memory transport makes."""
    try:
        return {name for name in os.listdir(directory) if MPI_SHM_NAME.match(name)}
    except OSError:
        return set()


def in_use(paths: set[str]) -> set[str]:
    """Those of ``paths`` some live process has open or mapped (from every readable /proc/PID/fd and maps)."""
    used: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target in paths:
                    used.add(target)
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    path = line.rstrip("\n").split(maxsplit=5)[-1]
                    if path.endswith(" (deleted)"):
                        continue
                    if path in paths:
                        used.add(path)
        except OSError:
            continue  # ended meanwhile, or not ours to read
    return used


def remove_left(before: set[str], directory: str = SHM_DIR) -> list[str]:
    """Remove the MPI files that appeared since ``before`` (a :func:`mpi_files`) and no process uses; their names."""
    new = {os.path.join(directory, name) for name in mpi_files(directory) - before}
    if not new:
        return []
    removed = []
    for path in sorted(new - in_use(new)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append(os.path.basename(path))
    return removed


def launcher_files(directory: str | None = None) -> set[str]:
    """The names in ``directory`` (the temporary directory) that a launcher makes: see the module docstring.

    A session tree of this user's (:data:`SESSION_TREE`) counts with each
    folder in it, and those in its job families (``ompi.vm.0/jf.0/4217962496``).
    """
    directory = directory or tempfile.gettempdir()
    try:
        names = os.listdir(directory)
    except OSError:
        return set()
    found = {name for name in names if PRTERUN_DIR.match(name) or HYDRA_FILE.match(name)}
    for tree in names:
        owner = SESSION_TREE.match(tree)
        if owner is None or int(owner.group(1)) != os.getuid():
            continue
        below = _folders(os.path.join(directory, tree))
        if below is None:  # not a folder
            continue
        found.add(tree)
        for name in below:
            found.add(f"{tree}/{name}")
            if name.startswith("jf."):
                found.update(f"{tree}/{name}/{job}" for job in _folders(os.path.join(directory, tree, name)) or ())
    return found


def _folders(path: str) -> list[str] | None:
    """The names of the folders in ``path``; None if it is not a folder (or is gone)."""
    try:
        with os.scandir(path) as entries:
            return [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return None


def launcher_files_everywhere() -> dict[str, set[str]]:
    """:func:`launcher_files` of each directory a launcher writes to: the temporary directory and /tmp."""
    return {directory: launcher_files(directory) for directory in {tempfile.gettempdir(), "/tmp"}}


def remove_launcher_leftovers_everywhere(before: dict[str, set[str]]) -> list[str]:
    """:func:`remove_launcher_leftovers` in each directory of ``before`` (a :func:`launcher_files_everywhere`)."""
    return [os.path.join(directory, name) for directory, names in sorted(before.items())
            for name in remove_launcher_leftovers(names, directory)]


def remove_launcher_leftovers(before: set[str], directory: str | None = None) -> list[str]:
    """Remove what launchers made since ``before`` (a :func:`launcher_files`) and left behind; their names.

    A ``prterun`` session directory goes once no process has its PID; a hydra
    file once no hydra process runs (the file does not name its ``mpiexec``,
    so one of another job, started meanwhile, keeps every new file). In a
    session tree, Open MPI 4's ``mpirun`` folder goes as ``prterun``'s does,
    any other folder if it is empty, the deepest first.
    """
    directory = directory or tempfile.gettempdir()
    new = sorted(launcher_files(directory) - before, key=lambda name: (-name.count("/"), name))
    hydra_runs = any(HYDRA_FILE.match(name) for name in new) and _hydra_running()
    removed = []
    for name in new:
        path = os.path.join(directory, name)
        owner = PRTERUN_DIR.match(name) or MPIRUN_DIR.match(name)
        if owner is None and ("/" in name or SESSION_TREE.match(name)):
            try:
                os.rmdir(path)
            except OSError:  # not empty: a live job's, or gone meanwhile
                continue
        elif owner is not None:
            if os.path.exists(f"/proc/{owner.group(1)}"):
                continue
            shutil.rmtree(path, ignore_errors=True)
        elif hydra_runs:
            continue
        else:
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
        removed.append(name)
    return removed


def _hydra_running() -> bool:
    """Whether any live process may be hydra's: an ``mpiexec``, ``mpirun`` or ``hydra_*`` (Open MPI's ``mpirun`` too)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if HYDRA_COMMANDS.match(comm.read().strip()):
                    return True
        except OSError:
            continue
    return False
