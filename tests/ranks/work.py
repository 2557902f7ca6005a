"""Work and async semantics: progress without waiting, wait(timeout), futures.

Usage: work.py [name-filter]
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from hpccomm.work import CommTimeoutError
from rankcheck import check, expect_error, run_all

dist.init_process_group("hpccomm")
RANK, SIZE = dist.get_rank(), dist.get_world_size()


PROGRESS_THREAD = os.environ.get("HPCCOMM_PROGRESS_THREAD", "1") != "0"


def watch_without_mpi(future: torch.futures.Future, what: str) -> None:
    """Wait for ``future`` making no MPI call: only the progress thread can complete its work."""
    deadline = time.monotonic() + 10
    while not future.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert future.done(), f"{what} made no progress without wait()"


@check
def async_work_completes_without_being_waited_on() -> None:
    t = torch.ones(1 << 16)
    work = dist.all_reduce(t, async_op=True)
    future = work.get_future()
    if PROGRESS_THREAD:
        watch_without_mpi(future, "async all_reduce")
    else:
        # Nothing would complete the future behind the caller's back: get_future drives the work.
        assert future.done(), "HPCCOMM_PROGRESS_THREAD=0: get_future returned a future nobody completes"
    assert work.is_completed() and work.is_success() and work.exception() is None
    assert torch.equal(t, torch.full_like(t, SIZE))
    assert work.result()[0] is t


@check
def get_future_leaves_work_the_thread_drives_in_flight() -> None:
    # DDP's hooks overlap the backward pass with communication only if get_future() returns at once. Rank 1
    # joins the all_reduce only once rank 0's get_future() has returned: a get_future that drove the work
    # itself would wait for a peer that waits for it, until the group's timeout.
    if SIZE < 2 or not PROGRESS_THREAD:
        return  # without the thread, get_future() drives the work (checked above)
    group = dist.new_group(list(range(SIZE)), timeout=timedelta(seconds=5))
    t = torch.ones(4)
    if RANK == 1:
        dist.recv(torch.zeros(1), src=0, tag=62)
    future = dist.all_reduce(t, async_op=True, group=group).get_future()
    if RANK == 0:
        # Rank 1 has not joined yet: the future can be pending here only if get_future() left the work in flight.
        pending = not future.done()
        dist.send(torch.ones(1), dst=1, tag=62)
        assert pending, "get_future() drove the work itself although the progress thread had taken it on"
    future.wait()
    assert torch.equal(t, torch.full((4,), float(SIZE)))
    dist.destroy_process_group(group)


@check
def point_to_point_work_completes_without_being_waited_on() -> None:
    # Point-to-point work does not wake the progress thread when posted; the
    # thread must find it whether it was asleep or lingering after other work.
    if SIZE < 2 or not PROGRESS_THREAD:
        return  # without the thread, get_future() drives the work (checked above)
    numel = 1 << 18  # 1 MiB: past MPI's eager limits, so a send needs the receiver's progress
    for state in ("asleep", "lingering"):
        if state == "asleep":
            time.sleep(0.2)  # past the thread's linger: posting must wake it
        else:
            dist.all_reduce(torch.ones(1), async_op=True).wait()  # the thread has just had work
        if RANK == 0:
            received = torch.zeros(numel)
            watch_without_mpi(dist.irecv(received, src=1, tag=60).get_future(), f"irecv posted, thread {state},")
            assert torch.equal(received, torch.full((numel,), 3.0)), f"irecv, thread {state}: wrong data"
            sent = dist.isend(torch.full((numel,), 4.0), dst=1, tag=61)
            watch_without_mpi(sent.get_future(), f"isend posted, thread {state},")
        elif RANK == 1:
            time.sleep(0.05)  # rank 0 posts its irecv first
            dist.send(torch.full((numel,), 3.0), dst=0, tag=60)
            received = torch.zeros(numel)
            dist.recv(received, src=0, tag=61)
            assert torch.equal(received, torch.full((numel,), 4.0)), f"recv, thread {state}: wrong data"
        dist.barrier()


@check
def future_callbacks_see_the_output() -> None:
    t = torch.full((4,), float(RANK))
    chained = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    assert torch.equal(chained.wait(), torch.full((4,), float(sum(range(SIZE)) * 2)))


@check
def a_callback_may_post_work_and_wait_for_it() -> None:
    # DDP's PowerSGD hook does this: the thread running the callback must not be the one that completes work.
    t, t2 = torch.ones(4), torch.full((4,), 2.0)
    fut = dist.all_reduce(t, async_op=True).get_future()
    (result,) = fut.then(lambda f: dist.all_reduce(t2, async_op=True).get_future().wait()).wait()
    assert torch.equal(result, torch.full((4,), 2.0 * SIZE)) and torch.equal(t, torch.full((4,), float(SIZE)))


@check
def nested_callback_chains_complete() -> None:
    a, b, c = torch.ones(3), torch.full((3,), 2.0), torch.full((3,), 3.0)

    def second_stage(_: torch.futures.Future) -> torch.Tensor:
        inner = dist.all_reduce(b, async_op=True).get_future()
        return inner.then(lambda _f: dist.all_reduce(c, async_op=True).get_future().wait()[0] + 1).wait()

    out = dist.all_reduce(a, async_op=True).get_future().then(second_stage).then(lambda f: f.value() * 2).wait()
    assert torch.equal(out, (torch.full((3,), 3.0 * SIZE) + 1) * 2), out
    assert torch.equal(a, torch.full((3,), float(SIZE))) and torch.equal(b, torch.full((3,), 2.0 * SIZE))


@check
def a_callback_may_wait_for_work_posted_after_its_own() -> None:
    first, second = torch.ones(8), torch.full((8,), 3.0)
    work_first = dist.all_reduce(first, async_op=True)
    later = dist.all_reduce(second, async_op=True).get_future()
    out = work_first.get_future().then(lambda _f: later.wait()[0].clone()).wait()
    assert torch.equal(out, torch.full((8,), 3.0 * SIZE))


@check
def a_callback_waiting_on_work_that_never_completes_ends_at_the_timeout() -> None:
    if SIZE < 2:
        return
    group = dist.new_group(list(range(SIZE)), timeout=timedelta(seconds=2))
    if RANK == 0:
        never = dist.irecv(torch.zeros(1), src=1, tag=77, group=group).get_future()  # rank 1 never sends
        arrived = dist.irecv(torch.zeros(1), src=1, tag=76, group=group).get_future()
        start = time.monotonic()
        chained = arrived.then(lambda _f: never.wait())
        try:
            chained.wait()
            raise AssertionError("a future waiting on work nobody joins completed")
        except RuntimeError as exc:
            assert "Timed out waiting 2000ms" in str(exc), exc
        elapsed = time.monotonic() - start
        assert elapsed < 10, f"the callback's wait outlived the group timeout: {elapsed:.1f} s"
    elif RANK == 1:
        dist.send(torch.ones(1), dst=0, tag=76, group=group)
    dist.destroy_process_group(group)
    dist.barrier()


@check
def wait_honours_its_timeout_and_can_wait_again() -> None:
    if SIZE < 2:
        return
    if RANK == 0:
        t = torch.zeros(2)
        work = dist.irecv(t, src=1, tag=99)
        start = time.monotonic()
        expect_error(CommTimeoutError, "recv", lambda: work.wait(timeout=timedelta(seconds=0.5)))
        elapsed = time.monotonic() - start
        assert 0.5 <= elapsed < 3, f"wait(timeout=0.5s) returned after {elapsed:.2f}s"
        dist.send(torch.ones(1), dst=1, tag=98)  # now let rank 1 send
        assert work.wait(timeout=timedelta(seconds=30))
        assert torch.equal(t, torch.full((2,), 7.0))
    elif RANK == 1:
        dist.recv(torch.empty(1), src=0, tag=98)
        dist.send(torch.full((2,), 7.0), dst=0, tag=99)
    dist.barrier()


@check
def many_outstanding_async_ops_complete_in_order() -> None:
    tensors = [torch.full((1000,), float(i + RANK)) for i in range(20)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for work in reversed(works):
        work.wait()
    for i, t in enumerate(tensors):
        assert torch.equal(t, torch.full((1000,), float(sum(i + r for r in range(SIZE)))))


@check
def a_barrier_ends_after_every_earlier_async_collective() -> None:
    # As Gloo's barrier waits for the group's earlier work and NCCL's for its stream (hpccomm/in_flight.py):
    # before, the all-reduces below were still running after the barrier 19 of 20 times at 64 MiB on 2 ranks.
    # Their values are read without wait(), as a program that trusts the barrier would.
    for numel in (1000, 1 << 20):
        for _ in range(5):
            tensors = [torch.full((numel,), float(RANK + i)) for i in range(3)]
            works = [dist.all_reduce(t, async_op=True) for t in tensors]
            dist.barrier()
            completed = [work.is_completed() for work in works]
            assert all(completed), f"still running after the barrier: {completed}"
            for i, t in enumerate(tensors):
                assert torch.equal(t, torch.full((numel,), float(sum(i + r for r in range(SIZE))))), (numel, i)


@check
def blocking_call_after_async_ones() -> None:
    a = torch.ones(10)
    work = dist.all_reduce(a, async_op=True)
    b = torch.full((10,), 2.0)
    dist.all_reduce(b)
    work.wait()
    assert torch.equal(a, torch.full((10,), float(SIZE))) and torch.equal(b, torch.full((10,), 2.0 * SIZE))


def rank_0_blocks_first(block: Callable[[], None]) -> None:
    """An async all-reduce that only hpccomm moves (shared memory); rank 0 calls ``block`` first, the others after it.

    The others wait for the all-reduce before they call ``block``: rank 0 must move it while it blocks.
    """
    from hpccomm.config import settings

    group = dist.new_group(list(range(SIZE)), timeout=timedelta(seconds=10))
    t = torch.full((max(settings.shm_slot_bytes // 2, 1 << 20),), float(RANK))  # two rounds of shared memory's slots
    work = dist.all_reduce(t, group=group, async_op=True)
    if RANK == 0:
        block()
        work.wait()
    else:
        work.wait()
        block()
    assert torch.equal(t, torch.full_like(t, float(sum(range(SIZE))))), t[0]


@check
def a_rank_blocked_in_another_groups_call_still_moves_its_async_one() -> None:
    # Without the progress thread, nothing polled rank 0's async all-reduce while it blocked: every rank timed out.
    other = dist.new_group(list(range(SIZE)), timeout=timedelta(seconds=10))
    b = torch.full((4,), float(RANK))
    rank_0_blocks_first(lambda: dist.all_reduce(b, group=other))
    assert torch.equal(b, torch.full_like(b, float(sum(range(SIZE))))), b


@check
def a_rank_that_creates_a_group_still_ends_its_async_one() -> None:
    # Without the progress thread, rank 0 hung in MPI creating the group and the others timed out.
    made = []
    rank_0_blocks_first(lambda: made.append(dist.new_group(list(range(SIZE)))))
    b = torch.ones(2)
    dist.all_reduce(b, group=made[0])
    assert torch.equal(b, torch.full_like(b, float(SIZE))), b


@check
def a_receive_posted_before_a_groups_creation_is_sent_to_after_it() -> None:
    # Before a group's creation a rank without the progress thread ends its collectives, not its point-to-point
    # operations: this sender sends only once the group exists.
    if SIZE < 2 or RANK > 1:
        dist.new_group(list(range(SIZE)))
        return
    t = torch.full((4,), float(RANK))
    if RANK == 0:
        work = dist.irecv(t, src=1)
        dist.new_group(list(range(SIZE)))
        work.wait()
        assert torch.equal(t, torch.ones(4)), t
    else:
        dist.new_group(list(range(SIZE)))
        dist.send(t, dst=0)


run_all(RANK, sys.argv[1] if len(sys.argv) > 1 else None)
dist.destroy_process_group()
