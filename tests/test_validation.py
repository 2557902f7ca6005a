"""Bad input raises a clear error naming op and argument, before any communication."""

import pytest
from launch import assert_all_ranks_ok, run_ranks, world_sizes


@pytest.mark.parametrize("nprocs", world_sizes(2, 3))
def test_bad_input_is_rejected_before_communication(nprocs):
    run = run_ranks(nprocs, "validation.py")
    assert_all_ranks_ok(run, nprocs)
