"""Work: async progress without waiting, wait(timeout), futures, ordering."""

import pytest
from launch import assert_all_ranks_ok, run_ranks


@pytest.mark.parametrize("nprocs", [2, 3])
def test_work_semantics(nprocs):
    run = run_ranks(nprocs, "work.py")
    assert_all_ranks_ok(run, nprocs)
