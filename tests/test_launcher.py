"""hpccomm-run: the matching launcher, sane defaults, srun inside Slurm, clear errors."""

import os
import shutil
import subprocess
import sys

import pytest
from launch import run_ranks

LAUNCHER = os.path.join(os.path.dirname(sys.executable), "hpccomm-run")


def dry_run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [LAUNCHER, "--dry-run", *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )


def test_more_ranks_than_cores_and_no_pinning():
    nprocs = max(3, (os.cpu_count() or 1) + 1)
    run = run_ranks(nprocs, "affinity.py")
    assert run.returncode == 0, run.output[-4000:]
    lines = run.lines("AFFINITY")
    assert len(lines) == nprocs, run.output[-4000:]
    for line in lines:
        fields = dict(field.split("=") for field in line.split()[1:])
        assert fields["cpus"] == fields["of"], f"rank pinned: {line}"


def test_uses_the_mpiexec_of_the_loaded_mpi():
    proc = dry_run("-n", "2", "python", "x.py")
    assert proc.returncode == 0, proc.stderr
    command = proc.stdout.split()
    venv_bin = os.path.dirname(sys.executable)
    assert command[0] in (os.path.join(venv_bin, "mpiexec"), os.path.join(venv_bin, "mpirun")), command
    assert command[-2:] == ["python", "x.py"]
    from hpccomm_run import mpi_flavour

    if mpi_flavour() == "openmpi":
        assert "--oversubscribe" in command and command[command.index("--bind-to") + 1] == "none"


@pytest.mark.skipif(shutil.which("srun") is None, reason="Slurm's srun is not installed")
def test_inside_a_slurm_allocation_it_uses_srun():
    proc = dry_run("-n", "4", "python", "x.py", env={"SLURM_JOB_ID": "42"})
    assert proc.returncode == 0, proc.stderr
    command = proc.stdout.split()
    assert command[0] == "srun" and "--ntasks=4" in command
    assert any(arg.startswith("--mpi=pmi") for arg in command)


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
