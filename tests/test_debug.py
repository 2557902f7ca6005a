"""Debug mode: a mismatched call raises on every rank with a table, and nothing is posted."""

import re

import pytest
from launch import assert_all_ranks_ok, run_ranks


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("what, column", [("dtype", "dtype"), ("shape", "numel"), ("op", "reduce_op"), ("root", "root")])
def test_mismatched_calls_raise_on_every_rank(nprocs, what, column):
    run = run_ranks(nprocs, "debug_mode.py", what, env={"HPCCOMM_DEBUG": "1"})
    assert_all_ranks_ok(run, nprocs)
    # Found anywhere in a line: some launchers (MPICH's hydra) interleave ranks' output.
    mismatches = re.findall(r"MISMATCH rank=(\d+) first-line=[^\n]*?\('(\w+)' differs\)", run.output)
    assert sorted(rank for rank, _ in mismatches) == [str(r) for r in range(nprocs)], run.output[-4000:]
    assert all(found == column for _, found in mismatches), mismatches
    assert "  rank  op" in run.output  # the per-rank table


def test_torch_distributed_debug_detail_turns_it_on():
    run = run_ranks(2, "debug_mode.py", "shape", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert_all_ranks_ok(run, 2)
    assert len(re.findall(r"MISMATCH rank=\d", run.output)) == 2, run.output[-4000:]
