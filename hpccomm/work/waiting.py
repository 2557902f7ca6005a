"""How a thread waits for posted communication: polling, spinning first and then napping, up to a deadline.

A wait also stops for a peer that left the job or a group closed meanwhile
(:func:`check_abandoned`), and moves other work on between its own polls
(:func:`while_waiting`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .. import failure
from .errors import GroupClosedError, describe
from .pending import Label

# Poll this many times between clock reads: reading the clock costs more
# than a poll of a request that is about to complete.
_POLLS_PER_CLOCK_READ = 256
#: A wait still polling after this long naps for :data:`NAP_S` between polls.
#: By then it waits on a late (or departed) peer more than on data in flight,
#: and the ranks and launcher daemons sharing its cores need to run: spinning
#: on, the waiting ranks of an oversubscribed node (4 ranks, 2 cores) kept the
#: launcher from ending a job whose rank had been killed for over 4.5 s in 8
#: runs of 60 (up to 19.4 s); yielding (sched_yield, before the nap), 0.6-4.1 s
#: in 55 runs.
SPIN_S = 0.05
#: The nap between polls of a long wait. ``sched_yield`` gave a core away only
#: to threads queued on it: 6 ranks of 2 fake nodes on 2 cores, each with a
#: waiting and a progress thread yielding in turn, took 9-29 s for one round of
#: async hierarchical collectives where napping took 9-12 s (6 runs each), and
#: 21-50 s for the whole layout (372 s once in CI) where napping took 21-25 s
#: (5 runs each). A nap makes a wait end later by at most about this much,
#: after at least SPIN_S.
NAP_S = 0.0002

#: What a long wait also does between its own polls (:func:`while_waiting`); None: nothing.
_meanwhile: Callable[[], None] | None = None
#: One entry per thread polling in :func:`drive` now (appends and pops are atomic: no lock on the wait's path).
_driving: list[None] = []


def driving() -> bool:
    """Whether some thread is waiting in :func:`drive` now (one that lasts calls what :func:`while_waiting` set)."""
    return bool(_driving)


def while_waiting(move: Callable[[], None] | None) -> Callable[[], None] | None:
    """Have every long wait call ``move`` between its polls (each nap, or each clock read); returns the previous one.

    The progress engine sets it. Without its thread, an asynchronous operation
    that only hpccomm moves on (shared memory, a device path's deferred post,
    UCC) must move while its caller blocks in another one, since a peer may be
    waiting for it before it joins that one; with the thread, a waiting thread
    moves the work on host memory in the thread's stead, which would otherwise
    take the GIL from the wait every nap. ``move`` must not block, nor raise.
    """
    global _meanwhile
    before, _meanwhile = _meanwhile, move
    return before


def drive(test: Callable[[], bool], deadline: float, label: Label) -> bool:
    """Poll ``test`` (a Pending's) until the communication completes (True) or ``deadline`` passes.

    Raises:
        PeerExitedError: a rank the operation needs has left the job.
        GroupClosedError: the group was aborted or shut down meanwhile.
    """
    polls = 0
    spin_until = time.monotonic() + SPIN_S
    napping = False
    _driving.append(None)
    try:
        while not test():
            polls += 1
            if napping:
                time.sleep(NAP_S)  # a poll per nap, each checking the clock
            elif polls % _POLLS_PER_CLOCK_READ:
                continue
            # Other work moves at each clock read: moved every poll, 64 works in flight made each leg of a 4 B
            # send/recv ping-pong about twice as slow (docs/measurements.md).
            if _meanwhile is not None:
                _meanwhile()
            now = time.monotonic()
            if now > deadline:
                return False
            check_abandoned(label)
            napping = now > spin_until
        return True
    finally:
        _driving.pop()


def check_abandoned(label: Label) -> None:
    """Raise if the operation can no longer complete: its group closed, or a peer left."""
    group = label[1]
    if group.closed is not None:
        raise GroupClosedError(f"hpccomm {describe(label)}: the group was {group.closed} while this operation was pending")
    # Runs every few hundred polls: build messages only when raising.
    gone = failure.abandoned(group.ledger, *ticket_of(label))
    if gone:
        raise failure.PeerExitedError(
            f"hpccomm {describe(label)}: rank(s) {', '.join(map(str, gone))} left the job without taking part in "
            "this operation; see that rank's output for the cause"
        )


def ticket_of(label: Label) -> tuple[str, int | None, int]:
    """An operation's name, peer (-1: the whole group; None: any rank) and ticket, as its group's ledger counts them."""
    op, _group, _seq, peers, ticket = label
    return op, -1 if peers is None else (peers[0] if peers else None), ticket
