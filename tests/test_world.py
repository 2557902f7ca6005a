"""How hpccomm starts MPI: settings chosen for the loaded library, and the thread level it got.

hpccomm loads the library without starting it, sets what applies to that
library and version (hpccomm_run.library_defaults), then starts MPI; a program
that started MPI first keeps its start, and a thread level below
MPI_THREAD_MULTIPLE is reported once.
"""

import os
import subprocess
import sys

import mpi_library
from launch import assert_all_ranks_ok, run_ranks

# Singleton start: no launcher's variables, nothing preset that hpccomm might set.
_PROBE = """
import os
import hpccomm
before = sorted(k for k in os.environ if k.startswith("OMPI_"))
hpccomm.identity()
after = sorted(k for k in os.environ if k.startswith("OMPI_"))
print("BEFORE", *before)
print("AFTER", *after)
"""


def test_mpi_starts_with_only_settings_its_library_has():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "PMIX", "MASTER_"))}
    if mpi_library.family() == "openmpi" and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = dict(line.split(" ", 1) if " " in line else (line, "") for line in proc.stdout.splitlines())
    preset = {"OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"}
    before, after = set(lines["BEFORE"].split()) - preset, set(lines["AFTER"].split()) - preset
    assert not before, f"import hpccomm set {before} before MPI started"
    if mpi_library.family() == "mpich":
        assert not after, f"hpccomm set Open MPI settings for {mpi_library.library_version()[:40]}: {after}"
        return
    params = mpi_library.ompi_info_lists("--param", "coll", "libnbc", "--level", "9")
    for name in after:
        # Every setting names a parameter this Open MPI has.
        assert name.removeprefix("OMPI_MCA_") in params, f"{name} is not a parameter of {mpi_library.ompi_info()}"
    assert "OMPI_MCA_coll_libnbc_iallreduce_algorithm" in after


def test_mpi_started_by_hpccomm_offers_thread_multiple_and_says_nothing():
    run = run_ranks(2, "world.py", "hpccomm")
    assert_all_ranks_ok(run, 2)
    assert "not MPI_THREAD_MULTIPLE" not in run.output, run.output[-4000:]


def test_a_lower_thread_level_is_reported_once_and_async_work_still_completes():
    run = run_ranks(2, "world.py", "serialized")
    assert_all_ranks_ok(run, 2)
    said = [line for line in run.output.splitlines() if "not MPI_THREAD_MULTIPLE" in line]
    assert len(said) == 1, run.output[-4000:]
    assert said[0].startswith("hpccomm: ") and "MPI_THREAD_SERIALIZED" in said[0], said[0]
    assert mpi_library.release() in said[0], said[0]
