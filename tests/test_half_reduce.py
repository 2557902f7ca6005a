"""bfloat16/float16 reduction kernels (compiled and torch) at 1-3 ranks."""

import pytest
from launch import assert_all_ranks_ok, run_ranks, world_sizes


@pytest.mark.parametrize("nprocs", world_sizes(1, 3))
def test_half_reduction_kernels(nprocs):
    run = run_ranks(nprocs, "half_reduce.py")
    assert_all_ranks_ok(run, nprocs)


def test_collectives_with_torch_half_kernels():
    """The torch fallback end to end: the every-collective checker with compiled kernels turned off."""
    run = run_ranks(3, "collectives.py", env={"HPCCOMM_HALF_KERNELS": "torch"}, limit_s=300)
    assert_all_ranks_ok(run, 3)
