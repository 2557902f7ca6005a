"""torch's flight recorder on hpccomm: a rank that skipped a collective is named by torch's analyzer.

From torch 2.15 torch records every hpccomm operation in its flight recorder;
hpccomm writes each rank's record when the job fails (hpccomm/flight_recorder.py).
Older releases record nothing for a Python backend: there hpccomm writes
nothing, asks no rank for a record, and fails as before (tests/test_failures.py).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch.distributed as dist
from launch import FAIL_FAST_S, ready_time, run_ranks

#: Whether this torch records a Python backend's operations (torch >= 2.15).
RECORDS = hasattr(dist.distributed_c10d, "_maybe_attach_flight_recorder")
TIMEOUT_S = 2  # the default group's timeout in the rank script
WAIT_S = 1  # TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC below


# Where torch records nothing, no job: hpccomm's failure path is then exactly tests/test_failures.py's.
@pytest.mark.parametrize("mode", ["waits", "busy", "busy-tree"] if RECORDS else ["nothing-recorded"])
def test_the_records_name_the_rank_that_skipped_a_collective(tmp_path, monkeypatch, mode):
    if mode == "nothing-recorded":
        from hpccomm import flight_recorder

        monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", str(tmp_path / "trace_"))
        assert not flight_recorder.enabled()  # so a failing rank asks no other rank for a record
        assert flight_recorder.write(0) is False and not list(tmp_path.iterdir())
        assert "none written" in flight_recorder.describe()
        return
    env = {"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "trace_"), "TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC": str(WAIT_S * 1000),
           # Goodbyes over the tree (hpccomm/goodbye_tree.py, from 64 ranks by default) or to every rank.
           "HPCCOMM_GOODBYE_TREE_FROM": "2" if mode == "busy-tree" else "0"}
    run = run_ranks(2, "flight_recorder.py", mode.removesuffix("-tree"), env=env, limit_s=90)
    assert not run.timed_out, run.output[-4000:]
    assert run.returncode != 0, run.output[-4000:]
    assert "uncaught CommTimeoutError: hpccomm all_reduce #5" in run.output, run.output[-4000:]
    assert "UNEXPECTED" not in run.output, run.output[-4000:]
    # Rank 0's timeout, then (where rank 1 cannot answer) torch's bound on a dump, then the abort.
    took = (run.ranks_ended_at or time.time()) - ready_time(run)
    assert took < TIMEOUT_S + WAIT_S + FAIL_FAST_S, f"the job took {took:.1f} s to end"
    written = sorted(path.name for path in tmp_path.iterdir())
    # Waiting in hpccomm, rank 1 wrote its record when rank 0 asked, long before its own 120 s timeout;
    # busy outside hpccomm, it could not, but where goodbyes travel the tree its relay thread took the ask.
    assert written == (["trace_0"] if mode == "busy" else ["trace_0", "trace_1"]), written
    command = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(tmp_path), "--prefix", "trace_"]
    if mode == "busy":
        command.append("--allow-incomplete-ranks")
    analysis = subprocess.run(command, capture_output=True, text=True, timeout=120)
    report = analysis.stdout + analysis.stderr
    assert analysis.returncode == 0, report
    if mode != "busy":
        for fragment in ("sequence number: 5", "collective: hpccomm:all_reduce", "missing ranks: {1}"):
            assert fragment in report, report
    else:  # the analyzer says whose record is missing
        assert "missed FR dumps from ranks ({1})" in report, report
