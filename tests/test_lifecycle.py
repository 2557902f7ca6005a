"""Ending a job: exit without destroy, or with async work in flight, never crashes or hangs (each transport).

A prototype crashed 2 runs in 3 on exit through its communication thread. Each
mode runs once per transport here, and CI runs it again with each of its other
MPIs (.ci/run: the MPICH wheel, Debian's MPICH and Open MPI), so every CI run
ends each mode four times on MPI.
"""

import pytest
from launch import run_ranks
from transports import ON_UCC, needs_ucc

RUNS = [pytest.param({}, id="mpi"), pytest.param(ON_UCC, id="ucc", marks=needs_ucc)]


@pytest.mark.parametrize("transport", RUNS)
@pytest.mark.parametrize("mode", ["no-destroy", "pending-async", "destroy"])
def test_exit_is_clean(mode, transport):
    run = run_ranks(3, "lifecycle.py", mode, env=transport, limit_s=60)
    assert not run.timed_out, f"exit hung:\n{run.output[-4000:]}"
    assert run.returncode == 0, f"exit code {run.returncode}:\n{run.output[-4000:]}"
    assert len(run.lines("EXITING")) == 3
