"""A group's async works in flight, and which of them a later collective must let end first (hpccomm/in_flight.py).

Here with works whose communication a test ends by hand; over real MPI and UCC
through torch's API: tests/ranks/collectives.py
(``async_collectives_on_the_same_memory_run_in_call_order``).
"""

from __future__ import annotations

import sys
import threading

import pytest
import torch
from test_host_staged import Group

from hpccomm.in_flight import InFlight, extents, overlap
from hpccomm.work import CommTimeoutError, HpcWork


class Switch:
    """A Pending that ends once :meth:`end` is called, or fails with ``error``."""

    def __init__(self, error: Exception | None = None) -> None:
        self.ended = threading.Event()
        self.error = error

    def end(self) -> None:
        self.ended.set()

    def test(self) -> bool:
        return self.ended.is_set()

    def finish(self) -> None:
        if self.error is not None:
            raise self.error


def work(pending: Switch, timeout_s: float = 10.0) -> HpcWork:
    return HpcWork(pending, [], ("all_reduce", Group(), 1, None, 1), timeout_s)


def ended_by_another_thread(switch: Switch, after_s: float = 0.2) -> threading.Timer:
    timer = threading.Timer(after_s, switch.end)
    timer.start()
    return timer


# -- byte ranges ------------------------------------------------------------------------------


def test_ranges_span_a_tensors_bytes_whatever_its_layout():
    base = torch.zeros(4, 6)
    start, size = base.data_ptr(), base.element_size()
    assert extents([base]) == ((start, start + 24 * size),)
    assert extents([base[1]]) == ((start + 6 * size, start + 12 * size),)
    column = base[:, 2]  # strided: from its first element to its last
    assert extents([column]) == ((start + 2 * size, start + (3 * 6 + 2 + 1) * size),)
    assert extents([base.t()]) == ((start, start + 24 * size),)
    assert extents([base[:0], base[2:2], torch.zeros(0, 3).t()]) == ()  # empty: spans nothing
    assert extents([torch.zeros(3).to_sparse()]) == ()  # not compared


def test_ranges_overlap_only_where_they_share_a_byte():
    buffer = torch.zeros(8)
    halves = extents([buffer[:4]]), extents([buffer[4:]])
    assert not overlap(*halves)
    assert overlap(extents([buffer[3:5]]), halves[0]) and overlap(extents([buffer[3:5]]), halves[1])
    assert not overlap(extents([buffer[0::2]]), extents([torch.zeros(8)]))  # another allocation
    # Interleaved views of one buffer overlap as ranges, so they are ordered: the cost of comparing ranges only.
    assert overlap(extents([buffer[0::2]]), extents([buffer[1::2]]))
    # Lists each side (all-gathers' outputs): compared as such, whatever lies between their tensors.
    rows = torch.zeros(4, 8)
    assert not overlap(extents([rows[0], rows[2]]), extents([rows[1], rows[3]]))
    assert overlap(extents([rows[0], rows[2]]), extents([rows[3], rows[2, 7:]]))


# -- which works a collective waits for ---------------------------------------------------------


@pytest.mark.parametrize(
    "earlier, later, waits",
    [
        ("writes", "reads", True),   # the later one reads the earlier one's results
        ("writes", "writes", True),  # the later one's results land last
        ("reads", "writes", True),   # the earlier one reads its inputs before they change
        ("reads", "reads", False),   # two readers run side by side
    ],
)
def test_a_collective_waits_for_an_earlier_one_where_either_writes_what_both_use(earlier, later, waits):
    t, other = torch.zeros(4), torch.zeros(4)
    in_flight, switch = InFlight(), Switch()
    first = work(switch)
    in_flight.add(first, [t] if earlier == "writes" else [other], [t] if earlier == "reads" else [other])
    timer = ended_by_another_thread(switch)
    try:
        in_flight.end_overlapping([t] if later == "writes" else [], [t] if later == "reads" else [])
        assert first._done is waits
        assert (in_flight.works() == []) is waits
    finally:
        timer.cancel()
        switch.end()


def test_collectives_on_disjoint_slices_of_one_buffer_run_side_by_side():
    buffer = torch.zeros(8)
    in_flight, switch = InFlight(), Switch()
    in_flight.add(work(switch), [buffer[:4]])
    in_flight.end_overlapping([buffer[4:]], [buffer[4:]])  # would hang here, the switch never ending, if it waited
    assert len(in_flight.works()) == 1


def test_point_to_point_work_is_never_waited_for():
    t = torch.zeros(4)
    in_flight, switch = InFlight(), Switch()
    in_flight.add(work(switch))  # a receive into t, say
    in_flight.end_overlapping([t], [t])
    assert len(in_flight.works()) == 1 and not in_flight.works()[0]._done


def test_works_that_must_end_first_end_in_call_order_and_the_others_stay_in_flight():
    t, other = torch.zeros(4), torch.zeros(4)
    in_flight = InFlight()
    switches = [Switch() for _ in range(3)]
    works = [work(s) for s in switches]
    in_flight.add(works[0], [t])
    in_flight.add(works[1], [other])
    in_flight.add(works[2], [t])
    ended: list[int] = []
    for i, s in enumerate(switches):
        original = s.finish
        s.finish = lambda i=i, original=original: (ended.append(i), original())[1]
    timers = [ended_by_another_thread(switches[0], 0.2), ended_by_another_thread(switches[2], 0.1)]
    try:
        in_flight.end_overlapping([t], [t])
        assert ended == [0, 2] and in_flight.works() == [works[1]]
    finally:
        for timer in timers:
            timer.cancel()
        switches[1].end()


def test_a_failed_earlier_collective_keeps_its_error_for_its_own_wait():
    t = torch.zeros(4)
    in_flight, switch = InFlight(), Switch(error=RuntimeError("peer gone"))
    first = work(switch)
    in_flight.add(first, [t])
    switch.end()
    in_flight.end_overlapping([t], [t])  # does not raise: the next collective goes ahead
    assert in_flight.failed and in_flight.works() == []
    with pytest.raises(RuntimeError, match="peer gone"):
        first.wait()


def test_an_earlier_collective_that_never_ends_is_waited_for_only_until_its_own_timeout():
    t = torch.zeros(4)
    in_flight = InFlight()
    first = work(Switch(), timeout_s=0.2)
    in_flight.add(first, [t])
    in_flight.end_overlapping([t], [t])
    assert first._done and in_flight.failed
    with pytest.raises(Exception, match="Timed out"):
        first.wait()


def test_a_barrier_ends_every_collective_in_flight_and_no_point_to_point_op():
    in_flight = InFlight()
    collectives, receive = [Switch(), Switch()], Switch()
    in_flight.add(work(collectives[0]), [torch.zeros(4)])
    in_flight.add(work(receive))
    in_flight.add(work(collectives[1]), [torch.zeros(4)], [torch.zeros(4)])
    timers = [ended_by_another_thread(s, 0.1) for s in collectives]
    try:
        in_flight.end_collectives("barrier")
        assert len(in_flight.works()) == 1 and not in_flight.works()[0]._done  # the receive, still in flight
    finally:
        for timer in timers:
            timer.cancel()
        receive.end()


def test_a_barrier_with_its_own_timeout_waits_for_earlier_collectives_only_that_long():
    in_flight, switch = InFlight(), Switch()
    earlier = work(switch, timeout_s=30.0)
    in_flight.add(earlier, [torch.zeros(4)])
    try:
        with pytest.raises(CommTimeoutError, match=r"barrier: Timed out waiting 200ms .* all_reduce #1"):
            in_flight.end_collectives("barrier", 0.2)
        assert not earlier._done and in_flight.works() == [earlier]  # it goes on, within its own timeout
    finally:
        switch.end()
    earlier.wait()


def test_clearing_returns_the_works_not_ended_and_notes_an_ended_one_that_failed():
    in_flight, live = InFlight(), Switch()
    failed = Switch(error=RuntimeError("peer gone"))
    failed.end()
    works = [work(failed), work(live)]
    in_flight.add(works[0], [torch.zeros(4)])
    in_flight.add(works[1])
    try:
        works[0].poll()  # as a closing group polls each work
        assert in_flight.clear() == [works[1]]
        assert in_flight.failed and in_flight.works() == []
    finally:
        live.end()


def test_works_added_from_several_threads_at_once_are_all_held():
    # Autograd's thread, the caller's and the callback runners' may all post on one group.
    in_flight, live = InFlight(), Switch()
    per_thread = 2000

    def post(done: bool) -> None:
        for _ in range(per_thread):
            switch = Switch()
            if done:
                switch.end()
            added = work(live if not done else switch)
            if done:
                added.wait()  # ended: the next add drops it, while the other thread adds
            in_flight.add(added, [torch.zeros(1)])

    threads = [threading.Thread(target=post, args=(done,)) for done in (False, True)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads take turns inside each other's list changes, not only between them
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert len([w for w in in_flight.works() if not w._done]) == per_thread
    live.end()
