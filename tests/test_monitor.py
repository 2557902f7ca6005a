"""hpccomm.monitored_barrier: passes when all arrive, names missing ranks as Gloo does."""

import pytest
from launch import assert_all_ranks_ok, run_ranks, world_sizes


@pytest.mark.parametrize("nprocs", world_sizes(1, 3))
def test_monitored_barrier(nprocs):
    run = run_ranks(nprocs, "monitor.py", limit_s=120)
    assert_all_ranks_ok(run, nprocs)
