"""CUDA tensors on a GPU: what tests/gpu/acceptance.sh runs on the GPU machine (skipped without a GPU).

tests/gpu/ranks/cuda_ops.py, on 2 ranks (one GPU may serve both): every
reduce op and dtype, every other collective and point-to-point call, sizes
up to 64 MiB, non-contiguous tensors; a producer on a side stream and a
consumer after ``wait()``, 1,000 loops; tensors dropped right after an async
call; the compute stream running during a collective; CUDA graph capture
refused; a missing peer timing out; DDP on CUDA against single-process
training. Also ``hpccomm info`` naming the route for CUDA tensors. The
ordering logic itself is tested on the CPU as well (tests/test_host_staged.py).
"""

from __future__ import annotations

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


def test_cuda_tensors_on_two_ranks():
    assert_all_ranks_ok(run_ranks(2, str(GPU_RANKS / "cuda_ops.py"), limit_s=900), 2)


def test_info_names_the_route_for_cuda_tensors():
    proc = subprocess.run([sys.executable, "-m", "hpccomm", "info"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "hpccomm route for CUDA tensors: staged" in proc.stdout, proc.stdout
