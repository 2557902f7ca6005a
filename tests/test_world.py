"""How hpccomm starts MPI: settings chosen for the loaded library, and the thread level it got.

hpccomm loads the library without starting it, sets what applies to that
library and version (hpccomm_run.library_defaults; singleton_defaults where no
launcher started the process), then starts MPI; a program that started MPI
first keeps its start, and a thread level below MPI_THREAD_MULTIPLE is
reported once.
"""

import os
import subprocess
import sys

import hpccomm_run
import mpi_leftovers
import mpi_library
import pytest
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


# A world of one, as a user runs `python train.py` without a launcher.
_ALONE = """
import os
import hpccomm, torch, torch.distributed as dist
dist.init_process_group("hpccomm")
total = torch.ones(4)
dist.all_reduce(total)
print("SUM", int(total.sum()), "WORLD", dist.get_world_size(), "BTL", os.environ.get("OMPI_MCA_btl", "unset"))
dist.destroy_process_group()
with open("/proc/self/maps") as maps:  # MPI finalizes after this, at exit
    paths = {line.split(maxsplit=5)[5].strip().removesuffix(" (deleted)") for line in maps if " /dev/shm/" in line}
print("MAPPED", *sorted(paths))
"""


def _without_launcher() -> dict[str, str]:
    """This environment less every launcher's and MPI's variables: what a process started by hand has."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "PMIX", "MASTER_"))}
    if mpi_library.family() == "openmpi" and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def test_mpi_starts_with_only_settings_its_library_has():
    env = _without_launcher()
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


def test_a_world_of_one_leaves_no_shared_memory_and_passes_no_setting_on():
    """Regression: every process that started Open MPI 5 without a launcher (a singleton: ``python
    train.py``, ``python -m hpccomm info``) left a 16 MiB /dev/shm/sm_segment.* after MPI_Finalize."""
    proc = subprocess.run([sys.executable, "-c", _ALONE], capture_output=True, text=True, timeout=120,
                          env=_without_launcher())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # What hpccomm set for MPI_Init alone is gone once MPI started: a launcher this process starts inherits none of it.
    assert "SUM 4 WORLD 1 BTL unset" in proc.stdout, proc.stdout + proc.stderr
    # The MPI files this process mapped, not all new ones: another MPI job on the machine may make its own meanwhile.
    (mapped,) = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("MAPPED")]
    left = [path for path in mapped if mpi_leftovers.MPI_SHM_NAME.match(os.path.basename(path)) and os.path.exists(path)]
    assert not left, f"a world of one under {mpi_library.library_version()[:40]} left {left}"


@pytest.mark.one_environment
def test_only_open_mpi_5_singletons_get_singleton_settings():
    open_mpi_5 = hpccomm_run.MpiLibrary("openmpi", (5, 0, 11))
    (setting,) = hpccomm_run.singleton_defaults(open_mpi_5, {})
    assert (setting.name, setting.value) == ("OMPI_MCA_btl", "self")
    # A PMIx server's variables (mpirun/prterun, srun --mpi=pmix): a launcher started the process.
    assert hpccomm_run.singleton_defaults(open_mpi_5, {"PMIX_NAMESPACE": "prterun-vm-1@1"}) == []
    assert hpccomm_run.singleton_defaults(open_mpi_5, {"PMIX_SERVER_URI41": "prterun-vm-1@0.0;tcp4://127.0.0.1:1"}) == []
    for other in (hpccomm_run.MpiLibrary("openmpi", (4, 1, 4)), hpccomm_run.MpiLibrary("mpich", (4, 3, 2)),
                  hpccomm_run.MpiLibrary("intel", (2021, 18, 1))):
        assert hpccomm_run.singleton_defaults(other, {}) == [], other
    # A setting the user made stands.
    env = {"OMPI_MCA_btl": "self,tcp"}
    assert hpccomm_run.apply_singleton_defaults(env, open_mpi_5) == [] and env == {"OMPI_MCA_btl": "self,tcp"}
    env = {}
    assert hpccomm_run.apply_singleton_defaults(env, open_mpi_5) == [setting] and env == {"OMPI_MCA_btl": "self"}
