"""The node-local shared-memory collectives, forced onto every size, at 2-4 ranks."""

import pytest
from hpccomm.transports import shm

#: Variants of hpccomm's own engine (streaming stores, torch's half kernels, no progress thread), the same under
#: every torch release and MPI: CI runs them in its first step only (.ci/run).
ONCE = pytest.mark.one_environment
from launch import assert_all_ranks_ok, run_ranks, world_sizes

# Every collective takes the shared-memory path, in 64-byte chunks (1 KiB slots).
SHM_EVERYWHERE = {"HPCCOMM_SHM_MIN_BYTES": "1", "HPCCOMM_SHM_SLOT_BYTES": "1024"}


@pytest.mark.parametrize("nprocs", world_sizes(2, 3, 4))
def test_shared_memory_collectives(nprocs):
    run = run_ranks(nprocs, "shm.py", env=SHM_EVERYWHERE, limit_s=300)
    assert_all_ranks_ok(run, nprocs)


@ONCE
def test_shared_memory_collectives_streaming_every_result():
    # Non-temporal stores for every result, in chunks of up to 1 KiB: unaligned heads and tails everywhere.
    env = {**SHM_EVERYWHERE, "HPCCOMM_SHM_SLOT_BYTES": "16384", "HPCCOMM_SHM_STREAM_MIN_BYTES": "0"}
    run = run_ranks(3, "shm.py", env=env, limit_s=300)
    assert_all_ranks_ok(run, 3)


@ONCE
def test_shared_memory_collectives_with_torch_half_kernels():
    run = run_ranks(2, "shm.py", "every_dtype", env={**SHM_EVERYWHERE, "HPCCOMM_HALF_KERNELS": "torch"}, limit_s=300)
    assert_all_ranks_ok(run, 2)


@ONCE
def test_shared_memory_collectives_without_progress_thread():
    run = run_ranks(3, "shm.py", "async", env={**SHM_EVERYWHERE, "HPCCOMM_PROGRESS_THREAD": "0"}, limit_s=300)
    assert_all_ranks_ok(run, 3)


def test_every_collective_with_shared_memory_everywhere():
    run = run_ranks(3, "collectives.py", env=SHM_EVERYWHERE, limit_s=300)
    assert_all_ranks_ok(run, 3)


@pytest.mark.parametrize("listed, cpus", [("0-7,64-71\n", 16), ("3\n", 1), ("0-1\n", 2)])
def test_cpus_sharing_a_cache_from_sysfs(tmp_path, listed, cpus):
    (tmp_path / "shared_cpu_list").write_text(listed)
    assert shm._cpus_sharing(str(tmp_path)) == cpus


@pytest.mark.parametrize("text, size", [("8192K", 8 << 20), ("32M", 32 << 20), ("512", 512)])
def test_cache_size_from_sysfs(text, size):
    assert shm._bytes(text) == size


def test_each_rank_shares_the_cache_it_uses():
    cache, _sharing = shm.last_level_cache()
    assert shm.cache_share_bytes(1) == cache
    assert shm.cache_share_bytes(1000) < shm.cache_share_bytes(2) <= cache
