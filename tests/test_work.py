"""Work: async progress without waiting, wait(timeout), futures, ordering."""

import threading
import time
from datetime import timedelta

import pytest
from launch import assert_all_ranks_ok, run_ranks, world_sizes
from test_host_staged import Group
from test_in_flight import Switch, ended_by_another_thread, work
from transports import ON_UCC, needs_ucc

from hpccomm.progress import ProgressEngine
from hpccomm.work import CommTimeoutError, HpcWork, complete_inline, finish_all, while_waiting


@pytest.mark.parametrize("nprocs", world_sizes(2, 3))
@pytest.mark.parametrize("progress_thread", ["1", "0"])
def test_work_semantics(nprocs, progress_thread):
    """With and without the progress thread (the path a thread level below MULTIPLE takes)."""
    run = run_ranks(nprocs, "work.py", env={"HPCCOMM_PROGRESS_THREAD": progress_thread})
    assert_all_ranks_ok(run, nprocs)


# -- driving works to their end (hpccomm.work.finish_all: a group's shutdown, a barrier after async collectives) --


def test_finishing_works_ends_each_in_call_order_and_leaves_its_error_with_it():
    switches = [Switch(), Switch(error=RuntimeError("peer gone")), Switch()]
    works = [work(switch) for switch in switches]
    timers = [ended_by_another_thread(switch, 0.05 * (3 - i)) for i, switch in enumerate(switches)]
    try:
        assert finish_all(works) is None
        assert all(w._done for w in works)
        works[0].wait()
        with pytest.raises(RuntimeError, match="peer gone"):
            works[1].wait()
    finally:
        for timer in timers:
            timer.cancel()


def test_finishing_works_within_a_limit_stops_there_and_names_the_first_not_ended():
    ended, stuck = Switch(), Switch()
    ended.end()
    works = [work(ended), work(stuck, timeout_s=30.0), work(Switch(), timeout_s=30.0)]
    try:
        start = time.monotonic()
        assert finish_all(works, 0.2) is works[1]
        assert 0.2 <= time.monotonic() - start < 10.0  # not the works' own 30 s
        assert not works[1]._done and not works[2]._done  # they go on, within their own timeouts
        assert finish_all(works, 0.0) is works[1]  # no time left: the first not ended, at once
    finally:
        stuck.end()
    assert works[1].wait()


def test_finishing_works_without_a_limit_waits_each_only_its_own_timeout():
    never = work(Switch(), timeout_s=0.2)
    assert finish_all([never]) is None  # it ended: failed at its own timeout
    with pytest.raises(CommTimeoutError, match="Timed out"):
        never.wait()


def test_a_wait_with_its_own_timeout_ends_then_while_another_thread_waits_on_the_work():
    # The other thread's wait drives the work (holds its claim) until the group's timeout, 30 s here.
    switch = Switch()
    shared = work(switch, timeout_s=30.0)
    other = threading.Thread(target=shared.wait, daemon=True)
    other.start()
    timer = ended_by_another_thread(switch, 5.0)  # before the fix this wait ended only then, without an error
    try:
        while not shared.waiters:
            time.sleep(0.001)
        start = time.monotonic()
        with pytest.raises(CommTimeoutError, match="Timed out waiting 200ms"):
            shared.wait(timedelta(seconds=0.2))
        assert time.monotonic() - start < 4.0 and not shared._done  # it goes on
    finally:
        timer.cancel()
        switch.end()
        other.join(10)
    assert shared.wait() and not other.is_alive()


# -- futures ----------------------------------------------------------------------------------


def catch(call) -> BaseException | None:
    """What ``call()`` raised, if anything."""
    try:
        call()
    except BaseException as exc:  # noqa: BLE001
        return exc
    return None


def test_get_future_returns_at_once_while_another_thread_waits_on_the_work():
    # A progress thread has taken the work on; another thread's wait() holds its claim until the work ends.
    switch = Switch()
    shared = work(switch, timeout_s=30.0)
    shared.driven = True
    other = threading.Thread(target=shared.wait, daemon=True)
    other.start()
    timer = ended_by_another_thread(switch, 5.0)  # before the fix get_future returned only then
    try:
        while not shared.waiters:
            time.sleep(0.001)
        start = time.monotonic()
        future = shared.get_future()
        assert time.monotonic() - start < 2.0 and not future.done()
        switch.end()
        other.join(10)
        assert future.wait() == [] and not other.is_alive()
    finally:
        timer.cancel()
        switch.end()


@pytest.mark.parametrize("failed", [False, True])
def test_a_future_asked_for_as_the_work_ends_is_settled_once(failed):
    # The work's end (here a poll on another thread, as the progress thread's) races get_future(): whichever comes
    # second settles the future, never neither (a future nobody settles) nor both (set_result twice raises).
    for _ in range(300):
        switch = Switch(error=RuntimeError("peer gone") if failed else None)
        raced = work(switch)
        raced.driven = True
        switch.end()
        raised = []
        ender = threading.Thread(target=lambda: raised.append(catch(raced.poll)))  # noqa: B023
        ender.start()
        future = raced.get_future()
        ender.join(10)
        assert raised == [None], f"the work's end raised {raised}"
        deadline = time.monotonic() + 10.0
        while not future.done() and time.monotonic() < deadline:
            time.sleep(0.001)
        assert future.done(), "the work ended but nobody settled its future"
        if failed:
            with pytest.raises(RuntimeError, match="peer gone"):
                future.wait()
        else:
            assert future.wait() == []



# -- without the progress thread (MPI below MPI_THREAD_MULTIPLE, or HPCCOMM_PROGRESS_THREAD=0) ----------------


@pytest.mark.parametrize("path", ["staged", pytest.param("mpi", marks=pytest.mark.one_environment),
                                  pytest.param("ucc", marks=needs_ucc)])
def test_without_the_thread_a_deferred_device_op_goes_out_while_the_rank_blocks_elsewhere(path):
    # tests/ranks/device_paths.py, each path's deferred post (it waits for the simulated stream) in two checks:
    # rank 0's async all-reduce, while rank 0 blocks in a CPU all-reduce and the other rank waits for the async
    # one (before, both timed out); rank 0's send, while rank 0 makes a group and rank 1 receives first (before,
    # the send stayed unposted while rank 0 blocked in MPI, and rank 1 timed out).
    env = {"DEVICE_PATH": path, "HPCCOMM_PROGRESS_THREAD": "0", "FAKE_DEVICE_LATE": "1",
           **(ON_UCC if path == "ucc" else {})}
    run = run_ranks(2, "device_paths.py", "deferred", env=env)
    assert_all_ranks_ok(run, 2)
    assert all(f"OK rank={rank} checks=2" in run.output for rank in (0, 1)), "the two checks did not both run"


@pytest.fixture
def threadless():
    """A progress engine without its thread, whose works every long wait moves on, as hpccomm.progress sets one up."""
    engine = ProgressEngine(enabled=False)
    before = while_waiting(engine.move_undriven)
    yield engine
    while_waiting(before)


class PostedWhenPolled:
    """An async operation that goes out only when polled (a deferred device post, shared memory's next step)."""

    def __init__(self, peer: Switch) -> None:
        self._peer = peer

    def test(self) -> bool:
        self._peer.end()  # the peer, which waited for this one first, moves on to the blocking call
        return True

    def finish(self) -> None:
        pass


def test_a_blocking_call_moves_the_async_work_a_peer_waits_for(threadless):
    peer_in_blocking_call = Switch()
    earlier = work(PostedWhenPolled(peer_in_blocking_call))
    threadless.submit(earlier)
    # Before, nothing polled `earlier` here: the blocking call timed out.
    complete_inline(peer_in_blocking_call, ("all_reduce", Group(), 2, None, 2), 2.0)
    assert earlier.is_completed() and threadless.pending() == 0


class EndsAtSecondTest:
    """Ends at its second test; counts its ends and the tests after its end."""

    def __init__(self) -> None:
        self.tests = self.ends = self.tests_after_end = 0

    def test(self) -> bool:
        self.tests += 1
        self.tests_after_end += self.ends
        return self.tests >= 2

    def finish(self) -> None:
        self.ends += 1


def test_a_wait_never_moves_its_own_work_through_the_engine(threadless):
    # The waiting thread holds its work's (re-entrant) claim: polled again from inside its own wait, the work
    # would end there and once more in the wait.
    pending = EndsAtSecondTest()
    waited = work(pending)
    threadless.submit(waited)
    waited.wait()
    assert (pending.ends, pending.tests_after_end) == (1, 0)


def test_works_that_ended_leave_the_engine_and_what_is_left_is_driven_at_exit(threadless):
    for _ in range(100):
        switch = Switch()
        switch.end()
        ended = work(switch)
        threadless.submit(ended)
        ended.wait()
    assert threadless.pending() == 0 and len(threadless._works) == 1, "works that ended are kept"
    switch = Switch()
    left = work(switch)
    threadless.submit(left)
    switch.end()
    assert threadless.drain(1.0) and left._done, "a work posted and never waited on is left in flight at exit"


def test_before_a_blocking_mpi_call_of_its_own_every_async_collective_is_ended(threadless):
    # Creating a group blocks in MPI, which polls nothing (tests/ranks/work.py: rank 0 hung there). A receive is
    # left in flight: its sender may send only once it has created the group too.
    switches = [Switch(), Switch(error=RuntimeError("peer gone"))]
    works = [work(switch) for switch in switches]
    receive = HpcWork(Switch(), [], ("recv", Group(), 3, (1,), 3), 5.0)
    for submitted in [works[0], receive, works[1]]:
        threadless.submit(submitted)
    timers = [ended_by_another_thread(switch, 0.1) for switch in switches]
    threadless.before_blocking_call()
    assert [w._done for w in works] == [True, True] and not receive._done and threadless.pending() == 1
    with pytest.raises(RuntimeError, match="peer gone"):
        works[1].wait()
    for timer in timers:
        timer.cancel()


class DeferredSend(Switch):
    """A send its path posts only once its inputs are ready (a device path's deferred post), polled by posted()."""

    def __init__(self) -> None:
        super().__init__()
        self.ready = threading.Event()
        self.went_out = False

    def posted(self) -> bool:
        self.went_out = self.went_out or self.ready.is_set()
        return self.went_out


def send_of(pending: Switch, timeout_s: float = 5.0) -> HpcWork:
    return HpcWork(pending, [], ("send", Group(), 1, (1,), 1), timeout_s)


def test_before_a_blocking_mpi_call_of_its_own_a_deferred_send_goes_out(threadless):
    # tests/ranks/device_paths.py: a peer that receives before creating a group too waited until its timeout for
    # a send whose (simulated) stream was late, unposted while this rank created the group. It is posted first
    # now, not waited to its end: the peer's receive ends it only after.
    late, ready = DeferredSend(), DeferredSend()
    ready.ready.set()
    sends = [send_of(late), send_of(ready), send_of(Switch())]  # the last one posted at the call
    for submitted in sends:
        threadless.submit(submitted)
    timer = threading.Timer(0.1, late.ready.set)
    timer.start()
    try:
        threadless.before_blocking_call()
    finally:
        timer.cancel()
    assert late.went_out and ready.went_out and threadless.pending() == 3
    assert not any(send._done for send in sends)


def test_a_deferred_send_whose_inputs_never_come_ends_with_its_timeout_before_a_blocking_call(threadless):
    started = time.monotonic()
    never = send_of(DeferredSend(), timeout_s=0.3)
    threadless.submit(never)
    threadless.before_blocking_call()
    assert never._done and 0.3 <= time.monotonic() - started < 5.0 and threadless.pending() == 0
    with pytest.raises(CommTimeoutError, match="send #1"):
        never.wait()


def test_a_deferred_send_another_thread_waits_on_is_left_to_that_thread_before_a_blocking_call(threadless):
    # Its waiter posts it, and waits for its end, which its peer's receive may bring only after this rank's
    # blocking call: waiting for that thread's hold on the work could last until the timeout.
    send = send_of(DeferredSend(), timeout_s=2.0)
    threadless.submit(send)
    waited: list[BaseException] = []
    waiter = threading.Thread(target=lambda: waited.append(pytest.raises(CommTimeoutError, send.wait).value))
    waiter.start()
    while not send.waiters:
        time.sleep(0.001)
    started = time.monotonic()
    threadless.before_blocking_call()
    assert time.monotonic() - started < 1.0 and not send._done
    waiter.join()
    assert waited and send._done


# -- with the progress thread: a thread that waits moves the async work on host memory itself ----------------


@pytest.fixture
def threaded():
    """A progress engine with its thread, whose works every long wait may move on, as hpccomm.progress sets one up."""
    engine = ProgressEngine(enabled=True)
    before = while_waiting(engine.move_undriven)
    yield engine
    assert engine.shutdown()
    while_waiting(before)


class CountsItsTesters:
    """A Pending that counts the tests each thread makes of it; ends once ``ended`` is set."""

    def __init__(self) -> None:
        self.testers: dict[str, int] = {}
        self.ended = threading.Event()

    def test(self) -> bool:
        name = threading.current_thread().name
        self.testers[name] = self.testers.get(name, 0) + 1
        return self.ended.is_set()

    def finish(self) -> None:
        pass

    def tests_by(self, name: str) -> int:
        return self.testers.get(name, 0)


def polled_by_the_thread_again(pending: CountsItsTesters, limit_s: float = 10.0) -> bool:
    seen, deadline = pending.tests_by("hpccomm-progress"), time.monotonic() + limit_s
    while pending.tests_by("hpccomm-progress") == seen and time.monotonic() < deadline:
        time.sleep(0.001)
    return pending.tests_by("hpccomm-progress") > seen


@pytest.mark.parametrize("on_host", [True, False], ids=["host", "device"])
def test_while_a_thread_waits_it_moves_the_host_work_in_flight_and_the_progress_thread_stays_off(threaded, on_host):
    # Polled by both, a 4 B send/recv leg with one receive pending took 2.2-3.9x as long (docs/measurements.md). A
    # device's work stays with hpccomm's thread: a caller's thread must not query its events (hpccomm/own_threads.py).
    pending = CountsItsTesters()
    in_flight = HpcWork(pending, [], ("recv", Group(), 1, (1,), 1), 30.0, on_host=on_host)
    threaded.submit(in_flight)
    assert polled_by_the_thread_again(pending), "the progress thread never polled the work"
    blocking = Switch()
    timer = ended_by_another_thread(blocking, 0.3)
    me = threading.current_thread().name
    before = {name: pending.tests_by(name) for name in ("hpccomm-progress", me)}
    try:
        complete_inline(blocking, ("all_reduce", Group(), 2, None, 2), 10.0)
    finally:
        timer.cancel()
    by_thread, by_waiter = (pending.tests_by(name) - before[name] for name in ("hpccomm-progress", me))
    # In 0.3 s, either polls it hundreds of times (the thread, before: 742). The thread still polls it where no wait
    # moved it between two of its looks, 1 ms apart (the waiter preempted), so at most 300 times: 0-25 seen.
    if on_host:
        assert by_thread < 100 and by_waiter > 100, (by_thread, by_waiter)
    else:
        assert by_waiter == 0 and by_thread > 20, (by_thread, by_waiter)
    assert polled_by_the_thread_again(pending), "once nobody waits, the progress thread must move the work again"
    pending.ended.set()
    assert in_flight.wait() and threaded.pending() == 0
