"""``python -m hpccomm info``: every section, alone and under a launcher, and the settings in effect."""

import json
import os
import subprocess
import sys

import mpi_library
import torch
import torch.distributed as dist
from launch import run_ranks

SECTIONS = ("== versions", "== MPI", "== paths", "== launcher", "== topology", "== settings")


def info_alone(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpccomm", "info", *args], capture_output=True, text=True,
                          timeout=180, env={**os.environ, **(env or {})})


def test_info_without_a_launcher():
    proc = info_alone(env={"HPCCOMM_SHM_MIN_BYTES": "12345", "HPCCOMM_NO_SUCH_KNOB": "1",
                           "TORCH_FR_DUMP_TEMP_FILE": "/shared/fr/trace_"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "\0" not in out, "info printed a NUL byte (grep then calls its output binary)"
    for section in SECTIONS:
        assert section in out, out
    assert f"torch      {torch.__version__}" in out
    assert "thread level  multiple" in out or "thread level" in out
    for path in ("shared memory", "HPCCOMM_ALGO=", "bfloat16 reduction", "float16 reduction", "UCC", "CUDA"):
        assert path in out, out
    assert "UCC" in out and ("built without UCC" in out or "available" in out)
    # One statement of where CUDA tensors go, from the same resolution the start-up log line uses.
    assert out.count("route for CUDA tensors") == 1, out
    if not torch.cuda.is_available():
        assert "no route for CUDA tensors" in out, out
    # Where a failure writes each rank's flight record: torch records a Python backend's operations from 2.15.
    if hasattr(dist.distributed_c10d, "_maybe_attach_flight_recorder"):
        assert "written on failure to /shared/fr/trace_<rank>" in out, out
    else:
        assert "records no operation of a Python backend (from torch 2.15): none written" in out, out
    assert "started by none (a world of one)" in out
    assert "hpccomm-run    -n 2 python train.py  ->" in out
    assert "               launcher: " in out, out
    assert "1 rank(s) on 1 node(s)" in out
    assert "HPCCOMM_SHM_MIN_BYTES      12345      (environment)" in out, out
    assert "HPCCOMM_PROGRESS_THREAD    True       (default)" in out, out
    assert "HPCCOMM_NO_SUCH_KNOB" in out and "not read by hpccomm" in out


def test_info_json_is_one_record():
    proc = info_alone("--json")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["world_size"] == 1 and record["versions"]["hpccomm"]
    assert {"shared_memory", "half_kernels", "ucc", "cuda", "knobs", "hpccomm_run"} <= set(record)


def test_info_under_a_launcher_shows_every_rank_per_node():
    run = run_ranks(3, "info.py")
    assert run.returncode == 0 and not run.timed_out, run.output[-6000:]
    out = run.output
    assert out.count("== topology") == 1, "only rank 0 prints"
    assert "3 rank(s) on 1 node(s)" in out
    for rank in range(3):
        assert f"| {rank} | {rank}/3 |" in out, out
    launcher = "Open MPI mpirun" if mpi_library.family() == "openmpi" else "MPICH hydra"
    if mpi_library.is_intel():
        launcher = "Intel MPI hydra"
    assert f"started by {launcher}" in out, out


def test_the_launcher_in_use_is_told_by_the_variables_it_sets(monkeypatch):
    """Pure logic, on every MPI: each launcher by the variables its ranks see (Intel MPI 2021.18.1's
    hydra sets MPICH's PMI_RANK/PMI_SIZE and, of its own, I_MPI_HYDRA_UUID)."""
    from hpccomm.cli import environment

    for name in ("OMPI_COMM_WORLD_SIZE", "I_MPI_HYDRA_UUID", "HYDI_CONTROL_FD", "PMI_RANK", "PMI_SIZE",
                 "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_JOB_ID", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert environment.launcher_in_use() == "none (a world of one)"
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "2")
    assert environment.launcher_in_use() == "MPICH hydra mpiexec"
    monkeypatch.setenv("I_MPI_HYDRA_UUID", "d6130000-2666-a5b5-3a61-06001f628866")
    assert environment.launcher_in_use() == "Intel MPI hydra mpiexec"
