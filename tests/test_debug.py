"""Debug mode: a mismatched call raises on every rank with a table, and nothing is posted."""

import pytest
from launch import assert_all_ranks_ok, run_ranks


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("what, column", [("dtype", "dtype"), ("shape", "numel"), ("op", "reduce_op"), ("root", "root")])
def test_mismatched_calls_raise_on_every_rank(nprocs, what, column):
    run = run_ranks(nprocs, "debug_mode.py", what, env={"HPCCOMM_DEBUG": "1"})
    assert_all_ranks_ok(run, nprocs)
    mismatches = run.lines("MISMATCH")
    assert len(mismatches) == nprocs, run.output[-4000:]
    assert all(f"'{column}' differs" in line for line in mismatches), mismatches
    assert "  rank  op" in run.output  # the per-rank table


def test_torch_distributed_debug_detail_turns_it_on():
    run = run_ranks(2, "debug_mode.py", "shape", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert_all_ranks_ok(run, 2)
    assert len(run.lines("MISMATCH")) == 2, run.output[-4000:]
