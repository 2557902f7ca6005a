"""Failures end jobs fast and say why (raise, sys.exit(3), SIGKILL); stuck collectives time out; abort.

Each case runs at 2 and 3 ranks, on each transport, and asserts both the time bound and the message.
"""

import time

import pytest
from launch import run_ranks
from transports import ON_UCC, TRANSPORTS, needs_ucc

FAIL_FAST_S = 10.0  # every rank ends within this long after one rank fails
# Every all-reduce on the node-local shared-memory path: its waits must fail the same way.
SHM = {"HPCCOMM_SHM_MIN_BYTES": "1"}


def ready_time(run) -> float:
    stamps = [float(line.split("t=")[1]) for line in run.lines("READY")]
    assert stamps, f"ranks never got ready:\n{run.output[-4000:]}"
    return max(stamps)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize(
    "mode, evidence",
    [
        ("raise", ["rank 1", "ValueError: rank 1 fails on purpose"]),
        ("exit3", ["rank(s) 1 left the job"]),
        ("sigkill", ["1"]),
    ],
)
def test_one_rank_failing_ends_the_job_fast(nprocs, mode, evidence, transport):
    run = run_ranks(nprocs, "failures.py", mode, env=transport, limit_s=120)
    check_failed_fast(run, mode, evidence)


def test_a_rank_leaving_during_a_shared_memory_all_reduce_ends_the_job_fast():
    check_failed_fast(run_ranks(3, "failures.py", "exit3", env=SHM, limit_s=120), "exit3", ["rank(s) 1 left the job"])


def check_failed_fast(run, mode, evidence):
    ended = time.time()
    assert not run.timed_out, f"job hung after rank 1 failed ({mode}):\n{run.output[-4000:]}"
    assert run.returncode != 0, f"launcher exited 0 although rank 1 failed:\n{run.output[-4000:]}"
    took = ended - ready_time(run)
    assert took < FAIL_FAST_S, f"job took {took:.1f}s to end after the failure"
    assert "UNEXPECTED" not in run.output
    for fragment in evidence:
        assert fragment in run.output, f"output does not say {fragment!r}:\n{run.output[-4000:]}"
    if mode == "sigkill":
        lowered = run.output.lower()
        assert "signal 9" in lowered or "killed" in lowered or "exit code: 9" in lowered, run.output[-4000:]


# Each stuck-operation case on MPI, on the shared-memory path, and on UCC.
STUCK = [
    pytest.param(2, {}, id="2"),
    pytest.param(3, {}, id="3"),
    pytest.param(3, SHM, id="3-shm"),
    pytest.param(2, ON_UCC, id="2-ucc", marks=needs_ucc),
    pytest.param(3, ON_UCC, id="3-ucc", marks=needs_ucc),
]


@pytest.mark.parametrize("nprocs, env", STUCK)
def test_a_skipped_collective_times_out_with_a_clear_error(nprocs, env):
    timeout_s = 3.0
    run = run_ranks(nprocs, "failures.py", "skip", str(timeout_s), env=env, limit_s=120)
    assert not run.timed_out and run.returncode == 0, run.output[-4000:]
    timeouts = run.lines("TIMEOUT")
    assert len(timeouts) == nprocs - 1, run.output[-4000:]
    for line in timeouts:
        after = float(line.split("after=")[1].split()[0])
        assert timeout_s <= after < timeout_s + 5, line
        assert "all_reduce #2" in line and f"({nprocs} ranks)" in line and "did not complete within" in line
    assert len(run.lines("EXITED")) == nprocs, "destroy or exit hung after the timeout"


@pytest.mark.parametrize("nprocs, env", STUCK)
def test_abort_fails_pending_work_and_refuses_later_calls(nprocs, env):
    run = run_ranks(nprocs, "failures.py", "abort", env=env, limit_s=120)
    assert not run.timed_out and run.returncode == 0, run.output[-4000:]
    aborted = run.lines("ABORTED")
    assert len(aborted) == nprocs - 1 and all("was aborted" in line for line in aborted), run.output[-4000:]
    assert all(float(line.split("after=")[1].split()[0]) < 2 for line in aborted)
    refused = run.lines("REFUSED")
    assert len(refused) == nprocs - 1 and all("aborted" in line for line in refused)
    assert len(run.lines("EXITED")) == nprocs
