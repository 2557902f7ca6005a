"""The node-local shared-memory all-reduce, forced onto every size, at 2-4 ranks."""

import pytest
from launch import assert_all_ranks_ok, run_ranks

# Every all-reduce takes the shared-memory path, in 1 KiB chunks.
SHM_EVERYWHERE = {"HPCCOMM_SHM_MIN_BYTES": "1", "HPCCOMM_SHM_SLOT_BYTES": "1024"}


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_shared_memory_all_reduce(nprocs):
    run = run_ranks(nprocs, "shm.py", env=SHM_EVERYWHERE, limit_s=300)
    assert_all_ranks_ok(run, nprocs)


def test_shared_memory_all_reduce_with_torch_half_kernels():
    run = run_ranks(2, "shm.py", env={**SHM_EVERYWHERE, "HPCCOMM_HALF_KERNELS": "torch"}, limit_s=300)
    assert_all_ranks_ok(run, 2)


def test_shared_memory_all_reduce_without_progress_thread():
    run = run_ranks(3, "shm.py", env={**SHM_EVERYWHERE, "HPCCOMM_PROGRESS_THREAD": "0"}, limit_s=300)
    assert_all_ranks_ok(run, 3)


def test_every_collective_with_all_reduce_on_shared_memory():
    run = run_ranks(3, "collectives.py", env=SHM_EVERYWHERE, limit_s=300)
    assert_all_ranks_ok(run, 3)
