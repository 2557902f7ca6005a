"""Ending a job: exit without destroy, or with async work in flight, never crashes or hangs (each transport).

A prototype crashed 2 runs in 3 on exit through its communication thread, so
each mode runs three times on MPI; on UCC, whose teardown shares that thread
and adds its own (team, context, library), once per mode, for CI's time.
"""

import pytest
from launch import run_ranks
from transports import ON_UCC, needs_ucc

RUNS = [*(pytest.param({}, id=f"mpi-{attempt}") for attempt in (1, 2, 3)),
        pytest.param(ON_UCC, id="ucc", marks=needs_ucc)]


@pytest.mark.parametrize("transport", RUNS)
@pytest.mark.parametrize("mode", ["no-destroy", "pending-async", "destroy"])
def test_exit_is_clean(mode, transport):
    run = run_ranks(3, "lifecycle.py", mode, env=transport, limit_s=60)
    assert not run.timed_out, f"exit hung:\n{run.output[-4000:]}"
    assert run.returncode == 0, f"exit code {run.returncode}:\n{run.output[-4000:]}"
    assert len(run.lines("EXITING")) == 3
