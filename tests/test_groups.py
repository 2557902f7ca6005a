"""Subgroups, non-members, group names, destroy and init again, identity from MPI."""

import pytest
from launch import assert_all_ranks_ok, run_ranks


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_groups_and_lifetime(nprocs):
    run = run_ranks(nprocs, "groups.py")
    assert_all_ranks_ok(run, nprocs)
