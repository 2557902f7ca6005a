"""Work: async progress without waiting, wait(timeout), futures, ordering."""

import threading
import time
from datetime import timedelta

import pytest
from launch import assert_all_ranks_ok, run_ranks, world_sizes
from test_in_flight import Switch, ended_by_another_thread, work

from hpccomm.work import CommTimeoutError, finish_all


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

