"""Subgroups, non-members, group names, destroy and init again, identity from MPI, on each transport."""

import pytest
from launch import assert_all_ranks_ok, run_ranks, world_sizes
from transports import TRANSPORTS


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("nprocs", world_sizes(1, 2, 3, 4))
def test_groups_and_lifetime(nprocs, transport):
    run = run_ranks(nprocs, "groups.py", env=transport)
    assert_all_ranks_ok(run, nprocs)
