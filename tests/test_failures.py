"""Failures end jobs fast and say why (raise, sys.exit(3), SIGKILL); stuck collectives time out; abort.

Each case runs at 2 and 3 ranks on MPI and at 3 on UCC (its 2-rank runs added CI time and no case the
3-rank ones lack), and asserts both the time bound and the message. The 2-rank runs are marked
``size_variant`` (tests/launch.py size_marks): CI runs them in its first step only.
"""

import pytest
from launch import FAIL_FAST_S, check_failed_fast, run_ranks, size_marks
from transports import ON_UCC, needs_ucc

# Every all-reduce on the node-local shared-memory path: its waits must fail the same way.
SHM = {"HPCCOMM_SHM_MIN_BYTES": "1"}


@pytest.mark.parametrize(
    "nprocs, transport",
    [
        pytest.param(2, {}, id="2-mpi", marks=size_marks(2)),
        pytest.param(3, {}, id="3-mpi", marks=size_marks(3)),
        pytest.param(3, ON_UCC, id="3-ucc", marks=needs_ucc),
    ],
)
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


def test_a_rank_whose_mpi_abort_hangs_still_ends_the_job_fast():
    run = run_ranks(2, "failures.py", "abort-hangs", limit_s=120)
    check_failed_fast(run, "abort-hangs", ["rank 1", "its MPI_Abort hangs", "aborting the job"])


def test_a_rank_leaving_during_a_shared_memory_all_reduce_ends_the_job_fast():
    check_failed_fast(run_ranks(3, "failures.py", "exit3", env=SHM, limit_s=120), "exit3", ["rank(s) 1 left the job"])


@pytest.mark.parametrize("env", [pytest.param({}, id="mpi"), pytest.param(SHM, id="shm")])
def test_a_rank_that_left_after_its_part_is_not_a_failure(env):
    """A verdict on a departed rank comes from what it did, not from how long ago it left."""
    run = run_ranks(3, "failures.py", "late", env=env, limit_s=120)
    assert not run.timed_out and run.returncode == 0, run.output[-4000:]
    (line,) = run.lines("GATHERED")
    assert "got=[0, 1, 2]" in line, line
    assert float(line.split("after=")[1].split()[0]) >= 1.5, f"the gather did not wait for rank 0: {line}"
    assert len(run.lines("EXITED")) == 3


def test_a_receive_fails_only_once_the_departed_sender_left_it_unsent():
    run = run_ranks(2, "failures.py", "p2p", limit_s=120)
    assert not run.timed_out and run.returncode == 0, run.output[-4000:]
    (received,) = run.lines("RECEIVED")
    assert "value=7" in received, received
    (gone,) = run.lines("GONE")
    assert "recv #" in gone and "rank(s) 0 left the job without taking part" in gone, gone
    # Rank 0 serves the store, which at exit waits for the others: fail-fast's goodbye must not wait with it.
    assert float(gone.split("after=")[1].split()[0]) < FAIL_FAST_S, gone
    assert len(run.lines("EXITED")) == 2


# Goodbyes over the tree (hpccomm/goodbye_tree.py), which a job uses from 64 ranks, here from 2.
TREE = {"HPCCOMM_GOODBYE_TREE_FROM": "2"}


def test_over_the_tree_a_departure_reaches_ranks_past_busy_ones():
    """News passes through ranks busy outside hpccomm (their relay threads), to partners and to others."""
    run = run_ranks(6, "failures.py", "relay", env=TREE, limit_s=120)
    assert not run.timed_out and run.returncode == 0, run.output[-4000:]
    trees = {int(line.split("rank=")[1].split()[0]): line.split("neighbours=")[1] for line in run.lines("TREE")}
    assert trees == {0: "[1, 2, 3, 4]", 1: "[0, 5]", 2: "[0]", 3: "[0]", 4: "[0]", 5: "[1]"}, trees
    (left,) = run.lines("LEFT")
    left_at = float(left.split("t=")[1].split()[0])
    gone = {int(line.split("rank=")[1].split()[0]): line for line in run.lines("GONE")}
    assert sorted(gone) == [2, 3, 4], run.output[-4000:]
    assert "recv #" in gone[2] and "recv #" in gone[3] and "all_reduce #1" in gone[4], gone
    for line in gone.values():
        assert "rank(s) 5 left the job without taking part" in line, line
        # Ranks 0 and 1, the only path from rank 5, sleep busy_s: learning before they wake is the relay's doing.
        busy_s = float(line.split("busy_s=")[1].split()[0])
        assert float(line.split(" t=")[1].split()[0]) - left_at < busy_s / 2, (left, line)
    assert "value=5" in run.lines("RECEIVED")[0]
    assert len(run.lines("EXITED")) == 6


@pytest.mark.parametrize("nprocs, mode", [(3, "exit3"), (3, "late"), (2, "p2p")])
def test_over_the_tree_verdicts_are_the_same(nprocs, mode):
    """A rank that left without its part ends the job; one that did its part is no failure; a partner's counts."""
    run = run_ranks(nprocs, "failures.py", mode, env=TREE, limit_s=120)
    if mode == "exit3":
        check_failed_fast(run, mode, ["rank(s) 1 left the job"])
        return
    assert not run.timed_out and run.returncode == 0, run.output[-4000:]
    assert len(run.lines("EXITED")) == nprocs
    if mode == "late":
        assert "got=[0, 1, 2]" in run.lines("GATHERED")[0]
    else:
        (gone,) = run.lines("GONE")
        assert "rank(s) 0 left the job without taking part" in gone, gone


# Each stuck-operation case on MPI, on the shared-memory path, and on UCC.
STUCK = [
    pytest.param(2, {}, id="2", marks=size_marks(2)),
    pytest.param(3, {}, id="3", marks=size_marks(3)),
    pytest.param(3, SHM, id="3-shm"),
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
        assert "all_reduce #2" in line and f"({nprocs} ranks)" in line and "Timed out waiting" in line
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


def test_a_barrier_with_its_own_timeout_times_out_on_time():
    """torch's ``barrier(timeout=)`` overrides the group's timeout, worded as Gloo words it."""
    run = run_ranks(2, "failures.py", "barrier", limit_s=120)
    assert not run.timed_out and run.returncode == 0, run.output[-4000:]
    (line,) = run.lines("TIMEOUT")
    assert 0.5 <= float(line.split("after=")[1].split()[0]) < 3, line
    assert "barrier #1" in line and "Timed out waiting 500ms" in line, line
    assert len(run.lines("EXITED")) == 2, "destroy or exit hung after the timeout"
