"""hpccomm-run: the matching launcher, settings valid for the loaded MPI, srun inside Slurm, clear errors.

Runs against whichever MPI mpi4py loads here: an MPI wheel or a system MPI
(CI: both wheels, Debian's Open MPI 4.1 and MPICH).
"""

import os
import shutil
import subprocess
import sys

import hpccomm_run
import mpi_library
import pytest
from launch import HPCCOMM_RUN, run_ranks, skip_unless_ci


def dry_run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*HPCCOMM_RUN, "--dry-run", *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, **(env or {})},
    )


def command_of(proc: subprocess.CompletedProcess) -> list[str]:
    """The launcher command: the last line of --dry-run's output."""
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1].split()


def exported(proc: subprocess.CompletedProcess) -> dict[str, str]:
    """NAME -> value of the dry run's `export NAME=value  # reason` lines; each must give a reason."""
    settings = {}
    for line in proc.stdout.splitlines():
        if line.startswith("export "):
            assignment, _, reason = line[len("export "):].partition("  # ")
            assert reason.strip(), f"no reason given: {line}"
            name, _, value = assignment.partition("=")
            settings[name] = value
    return settings


def launched(run, nprocs: int) -> list[dict[str, str]]:
    """Each rank's LAUNCHED fields; fails unless every rank reported and the run succeeded."""
    assert not run.timed_out and run.returncode == 0, run.output[-4000:]
    ranks = [dict(field.split("=", 1) for field in line.split()[1:]) for line in run.lines("LAUNCHED")]
    assert sorted(int(r["rank"]) for r in ranks) == list(range(nprocs)), run.output[-4000:]
    assert all(r["size"] == str(nprocs) for r in ranks), run.output[-4000:]
    return ranks


def test_more_ranks_than_cores_and_no_pinning():
    nprocs = max(3, (os.cpu_count() or 1) + 1)
    # Intel MPI's hydra pins each rank to its share of the cores by default, and hpccomm-run leaves that on
    # (docs/launching.md, measured there); I_MPI_PIN=0 in the environment, the way off, must reach it.
    env = {"I_MPI_PIN": "0"} if mpi_library.is_intel() else None
    run = run_ranks(nprocs, "affinity.py", env=env, launcher=HPCCOMM_RUN)
    assert run.returncode == 0, run.output[-4000:]
    lines = run.lines("AFFINITY")
    assert len(lines) == nprocs, run.output[-4000:]
    for line in lines:
        fields = dict(field.split("=") for field in line.split()[1:])
        assert fields["cpus"] == fields["of"], f"rank pinned: {line}"


def test_uses_the_mpiexec_of_the_loaded_mpi():
    proc = dry_run("-n", "2", sys.executable, "x.py")
    command = command_of(proc)
    assert mpi_library.launcher_runs_library(command[0]), f"{command[0]} is not {mpi_library.library_version()}"
    assert command[-2:] == [sys.executable, "x.py"]
    # The dry run names the launcher and the MPI it belongs to (as the launcher's --version says).
    family = "Intel MPI" if mpi_library.is_intel() else {"openmpi": "Open MPI", "mpich": "MPICH's hydra"}[
        mpi_library.family()]
    assert f"# launcher: {command[0]} ({family} " in proc.stdout, proc.stdout
    if mpi_library.family() == "openmpi":
        assert "--oversubscribe" in command and command[command.index("--bind-to") + 1] == "none"
        assert "--noprefix" in command


def test_intel_mpi_and_its_mpiexec_are_named_and_matched(tmp_path):
    """Pure logic, on every MPI: Intel MPI's version texts (those of the impi-rt 2021.18.1 wheel) are
    read as Intel MPI, whose launcher (a build of hydra) starts it and MPICH, not Open MPI."""
    text = "Intel(R) MPI Library 2021.18.1 for Linux* OS\n\n"
    assert hpccomm_run.parse_library_version(text) == ("intel", (2021, 18, 1))
    library = hpccomm_run.MpiLibrary("intel", (2021, 18, 1))
    assert library.name == "Intel MPI 2021.18.1"
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'Intel(R) MPI Library for Linux* OS, Version 2021.18.1 Build 20260626 (id: b44796a)'\n"
                    "echo 'Copyright 2003-2026, Intel Corporation.'\n")
    fake.chmod(0o755)
    launcher = hpccomm_run.identify_launcher(str(fake))
    assert (launcher.family, launcher.version) == ("intel", (2021, 18, 1))
    assert launcher.name == f"{fake} (Intel MPI 2021.18.1)"
    assert launcher.runs(library) and launcher.runs(hpccomm_run.MpiLibrary("mpich", (4, 0, 2)))
    assert not launcher.runs(hpccomm_run.MpiLibrary("openmpi", (5, 0, 11)))
    # Nothing is added on one node: Intel MPI's pinning is left on, and no Open MPI variable is set.
    assert hpccomm_run.single_node_defaults(library) == [] and hpccomm_run.library_defaults(library) == []


def test_ranks_start_with_transports_their_library_has():
    """Regression: hpccomm-run exported Open MPI 5's BTL name 'sm' to Open MPI 4, which calls it
    'vader'; every rank died in MPI_Init ("the "sm" BTL is no longer available")."""
    ranks = launched(run_ranks(2, "launched.py", launcher=HPCCOMM_RUN), 2)
    if mpi_library.family() == "openmpi":
        for component in ranks[0]["btl"].split(","):
            assert mpi_library.has_btl(component), f"{mpi_library.ompi_info()} has no BTL {component!r}"


@pytest.mark.parametrize("name", ["python", "python3"])
def test_a_bare_python_in_the_command_runs_this_environment(name):
    """Regression: Open MPI's mpiexec run by absolute path (/usr/bin/mpiexec) put its bin directory
    first on the ranks' PATH, so `python3` was the system interpreter (ModuleNotFoundError: hpccomm)."""
    for rank in launched(run_ranks(2, "launched.py", launcher=HPCCOMM_RUN, python=name), 2):
        assert rank["prefix"] == sys.prefix, rank
        # PATH keeps the caller's order (console scripts of this environment stay first).
        assert rank["path0"] == os.environ.get("PATH", "").split(os.pathsep)[0], rank


def test_dry_run_shows_each_setting_with_its_reason():
    proc = dry_run("-n", "2", sys.executable, "x.py", env={"OMPI_MCA_pml": "ob1-from-user"})
    settings = exported(proc)
    if mpi_library.family() == "mpich":
        assert "OMPI_" not in proc.stdout, proc.stdout
        return
    # Every Open MPI setting exists in this library (a wrong name kills MPI_Init, or is ignored).
    for component in settings["OMPI_MCA_btl"].split(","):
        assert mpi_library.has_btl(component), settings
    algorithm = settings.get("OMPI_MCA_coll_libnbc_iallreduce_algorithm")
    if algorithm is not None:
        params = mpi_library.ompi_info_lists("--param", "coll", "libnbc", "--level", "9")
        assert "coll_libnbc_iallreduce_algorithm" in params and f"{algorithm} rabenseifner" in params
    # A value already in the environment wins, and the dry run says so.
    assert "OMPI_MCA_pml" not in settings
    assert "# OMPI_MCA_pml='ob1-from-user' kept from the environment" in proc.stdout, proc.stdout


def test_another_mpis_mpiexec_first_on_path_is_named_and_passed_over(tmp_path):
    other = mpi_library.other_mpi_launcher()
    if other is None:
        skip_unless_ci("no launcher of a second MPI on this machine (CI installs Debian's Open MPI and MPICH)")
    (tmp_path / "mpiexec").symlink_to(other)
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = dry_run("-n", "2", sys.executable, "x.py", env=env)
    assert mpi_library.launcher_runs_library(command_of(proc)[0]), proc.stdout
    said = [line for line in proc.stderr.splitlines() if line.startswith("hpccomm-run:")]
    assert len(said) == 1, proc.stderr
    assert str(tmp_path / "mpiexec") in said[0] and mpi_library.release() in said[0], said[0]
    # And the ranks it starts form one world.
    launched(run_ranks(2, "launched.py", env=env, launcher=HPCCOMM_RUN), 2)


@pytest.mark.skipif(shutil.which("srun") is None, reason="Slurm's srun is not installed")
def test_inside_a_slurm_allocation_it_uses_srun():
    command = command_of(dry_run("-n", "4", "python", "x.py", env={"SLURM_JOB_ID": "42"}))
    assert command[0] == "srun" and "--ntasks=4" in command
    assert f"--mpi={'pmix' if mpi_library.family() == 'openmpi' else 'pmi2'}" in command
    # `python` became this environment's interpreter (hpccomm-run's own, maybe named python3).
    assert os.path.dirname(command[-2]) == os.path.dirname(sys.executable) and command[-1] == "x.py"


@pytest.mark.parametrize("args, message", [(["-n", "0", "python"], "at least 1"), (["-n", "2"], "no command")])
def test_bad_arguments_fail_clearly(args, message):
    proc = dry_run(*args)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_the_launcher_does_not_import_torch():
    # Importing torch costs about a second per launch; the launcher needs none of it.
    probe = "import sys, hpccomm_run; sys.exit(1 if 'torch' in sys.modules or 'hpccomm' in sys.modules else 0)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"importing hpccomm_run pulled in torch or hpccomm\n{proc.stderr}"
