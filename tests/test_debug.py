"""Debug mode: a mismatched call raises on every rank with a table, and nothing is posted.

One job per size runs every kind of mismatch in turn (each job's start costs more than its checks).
"""

import re

import pytest
from launch import assert_all_ranks_ok, run_ranks, world_sizes

#: what rank 1 gets wrong -> the column of the table that must name it
COLUMNS = {"dtype": "dtype", "shape": "numel", "op": "reduce_op", "root": "root"}


@pytest.mark.parametrize("nprocs", world_sizes(2, 3))
def test_mismatched_calls_raise_on_every_rank(nprocs):
    run = run_ranks(nprocs, "debug_mode.py", *COLUMNS, env={"HPCCOMM_DEBUG": "1"})
    assert_all_ranks_ok(run, nprocs)
    assert "UNEXPECTED" not in run.output, run.output[-4000:]
    # Found anywhere in a line: some launchers (MPICH's hydra) interleave ranks' output.
    mismatches = re.findall(r"MISMATCH rank=(\d+) what=(\w+) first-line=[^\n]*?\('(\w+)' differs\)", run.output)
    for what, column in COLUMNS.items():
        found = sorted((rank, named) for rank, was, named in mismatches if was == what)
        assert found == [(str(r), column) for r in range(nprocs)], (what, run.output[-4000:])
    assert "  rank  op" in run.output  # the per-rank table


def test_torch_distributed_debug_detail_turns_it_on():
    run = run_ranks(2, "debug_mode.py", "shape", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert_all_ranks_ok(run, 2)
    assert len(re.findall(r"MISMATCH rank=\d", run.output)) == 2, run.output[-4000:]
