"""CUDA tensors on a GPU: what tests/gpu/acceptance.sh runs on the GPU machine (skipped without a GPU).

tests/gpu/ranks/cuda_ops.py, on 2 ranks (one GPU may serve both): every
reduce op and dtype, every other collective and point-to-point call, sizes
up to 64 MiB, non-contiguous tensors; a producer on a side stream and a
consumer after ``wait()``, 1,000 loops; tensors dropped right after an async
call; the compute stream running during a collective; CUDA graph capture
refused; a missing peer timing out; DDP on CUDA against single-process
training, FSDP2 on a CUDA device mesh. Also ``hpccomm info`` naming the route
for CUDA tensors. Each on every path: ``staged`` (through host memory),
``ucc`` (UCC on device memory, host-gated, every collective on UCC, in-place
reductions through the group's scratch), ``ucc-triggered`` (the same, posted
on an execution engine: ``HPCCOMM_UCC_TRIGGERED=1``) and ``mpi`` (a
CUDA-aware MPI on device memory); all but the first run where
``HPCCOMM_GPU_PATHS`` lists them (tests/gpu/acceptance.sh lists the ucc ones
once it has built UCC with CUDA, mpi where the MPI is CUDA-aware) and skip
otherwise, saying so. The ordering
logic itself is tested on the CPU as well (tests/test_host_staged.py,
tests/test_ucc_cuda.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from launch import assert_all_ranks_ok, run_ranks

GPU_RANKS = Path(__file__).parent / "ranks"

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no GPU here: tests/gpu/acceptance.sh runs these on the GPU machine"
)


#: The environment of each CUDA path: every collective on it.
PATHS = {
    "staged": {"HPCCOMM_TRANSPORT": "cuda:staged"},
    "ucc": {"HPCCOMM_TRANSPORT": "cuda:ucc", "HPCCOMM_CUDA_STAGED_MAX_BYTES": "0"},
    "ucc-triggered": {"HPCCOMM_TRANSPORT": "cuda:ucc", "HPCCOMM_CUDA_STAGED_MAX_BYTES": "0",
                      "HPCCOMM_UCC_TRIGGERED": "1"},
    "mpi": {"HPCCOMM_TRANSPORT": "cuda:mpi", "HPCCOMM_CUDA_STAGED_MAX_BYTES": "0"},
}


def path_env(path: str) -> dict[str, str]:
    if path not in os.environ.get("HPCCOMM_GPU_PATHS", "staged").split():
        pytest.skip(f"HPCCOMM_GPU_PATHS does not list {path} (tests/gpu/acceptance.sh lists ucc once UCC is built, "
                    "mpi where the MPI is CUDA-aware)")
    return PATHS[path]


#: Each check of cuda_ops.py is bounded (rankcheck's RANKCHECK_LIMIT_S: a hung check prints HUNG with its
#: top frame and every stack, and ends the rank), and so is the whole job: the acceptance run then goes on to
#: its next part. The slowest check on an H100 shared by two ranks (1,000 small all-reduces on the UCC path at
#: about 14 ms each, 2026-11-27) took about 15 s; a pass of every check about 45 s.
CHECK_LIMIT_S = 60
JOB_LIMIT_S = 180


@pytest.mark.parametrize("path", PATHS)
def test_cuda_tensors_on_two_ranks(path):
    env = {**path_env(path), "RANKCHECK_LIMIT_S": str(CHECK_LIMIT_S)}
    run = run_ranks(2, str(GPU_RANKS / "cuda_ops.py"), env=env, limit_s=JOB_LIMIT_S, stacks_on_timeout=True)
    assert_all_ranks_ok(run, 2)


@pytest.mark.parametrize("path", PATHS)
def test_info_names_the_route_for_cuda_tensors(path):
    env = {**os.environ, **path_env(path)}
    proc = subprocess.run([sys.executable, "-m", "hpccomm", "info"], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("route for CUDA tensors") == 1, proc.stdout
    assert f"route for CUDA tensors: {path.split('-')[0]} " in proc.stdout, proc.stdout
    if path == "ucc-triggered":
        assert "triggered on a stream" in proc.stdout, proc.stdout
