"""Every collective x dtype x reduce op at 1-4 ranks (odd sizes catch algorithm bugs), on each transport."""

import pytest
from launch import assert_all_ranks_ok, run_ranks, world_sizes
from transports import TRANSPORTS


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("nprocs", world_sizes(1, 2, 3, 4))
def test_every_collective_dtype_and_reduce_op(nprocs, transport):
    run = run_ranks(nprocs, "collectives.py", env=transport, limit_s=300)
    assert_all_ranks_ok(run, nprocs)
