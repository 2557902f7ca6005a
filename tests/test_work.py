"""Work: async progress without waiting, wait(timeout), futures, ordering."""

import pytest
from launch import assert_all_ranks_ok, run_ranks, world_sizes


@pytest.mark.parametrize("nprocs", world_sizes(2, 3))
@pytest.mark.parametrize("progress_thread", ["1", "0"])
def test_work_semantics(nprocs, progress_thread):
    """With and without the progress thread (the path a thread level below MULTIPLE takes)."""
    run = run_ranks(nprocs, "work.py", env={"HPCCOMM_PROGRESS_THREAD": progress_thread})
    assert_all_ranks_ok(run, nprocs)
