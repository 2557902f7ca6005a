"""Ending a job: exit without destroy, or with async work in flight, never crashes or hangs (each transport).

A prototype crashed 2 runs in 3 on exit through its communication thread, so
each mode runs three times.
"""

import pytest
from launch import run_ranks
from transports import TRANSPORTS


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("mode", ["no-destroy", "pending-async", "destroy"])
@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_exit_is_clean(mode, attempt, transport):
    run = run_ranks(3, "lifecycle.py", mode, env=transport, limit_s=60)
    assert not run.timed_out, f"exit hung:\n{run.output[-4000:]}"
    assert run.returncode == 0, f"exit code {run.returncode}:\n{run.output[-4000:]}"
    assert len(run.lines("EXITING")) == 3
