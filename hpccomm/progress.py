"""The progress engine: a background thread that drives asynchronous work.

MPI moves a nonblocking operation forward only while some thread is inside
an MPI call. Work posted with ``async_op=True`` (and all work DDP posts from
its autograd hooks) is handed to this engine, whose thread polls it until it
completes and runs its follow-up, so communication overlaps with the caller's
compute. Blocking calls never come here. The thread never runs a future's
callbacks: it hands the settling to :mod:`hpccomm.callbacks`, so a callback
that waits on other work cannot stall the thread that would complete it.

The thread starts on the first asynchronous operation and sleeps on a
condition variable while there is nothing to drive. Waking it costs the caller
a thread switch and a turn of the GIL (on two busy cores, over half of a
4-byte send/recv round trip), so it is woken at once only for collectives,
which their callers overlap with compute. Point-to-point work is usually
waited on right away, by its own caller: for a while after its last work the
thread keeps looking for new work every :data:`_LOOK_S` by itself, and such
work is left for it to find then. While a thread waits on work itself (a
blocking call, ``wait()``), that thread moves the asynchronous work on host
memory between its own polls and the engine's thread stays off the GIL
(:meth:`ProgressEngine.move_undriven`): polling beside the wait, the thread
made each leg of a send/recv ping-pong with one receive pending 2.2-3.9x
slower (docs/measurements.md). A device's work stays with the thread, whose
event queries keep out of the user's graph captures
(:mod:`hpccomm.own_threads`). At interpreter exit, before mpi4py finalises
MPI, work still in flight is driven to completion (bounded by
:data:`DRAIN_TIMEOUT_S`) and the thread is joined: MPI must not write into
tensors Python is freeing, and no thread may be inside MPI while it shuts
down. It needs ``MPI_THREAD_MULTIPLE``; with a lower thread level (or
``HPCCOMM_PROGRESS_THREAD=0``) it is never started: asynchronous work then
progresses when waited on, and whenever a thread waits on other work
(:meth:`ProgressEngine.move_undriven`), since a peer may wait for it before
joining the operation this rank blocks in.
"""

from __future__ import annotations

import atexit
import threading
import time

from . import callbacks, own_threads
from .work import NAP_S, SPIN_S, HpcWork, driving, finish_all, while_waiting

_JOIN_TIMEOUT_S = 5.0
#: How often the thread looks again at work that waiters are driving or moving: a pace, no verdict on a peer. A
#: wait moves other work every 256 of its polls (0.05-0.3 ms here) or nap (0.2 ms), so several times a look; a look
#: that finds no move since the last one polls the work itself, which bounds its stillness to about two looks.
_IDLE_RECHECK_S = 0.001
#: How often the thread looks for new work while it lingers, and how long it
#: lingers after its last work before sleeping until woken.
_LOOK_S = 0.002
_LINGER_S = 0.05
#: At exit, how long to keep driving work that was posted but never waited on.
DRAIN_TIMEOUT_S = 30.0


class ProgressEngine:
    """Polls submitted :class:`HpcWork` from one daemon thread.

    Args:
        enabled: when False, no thread starts: submitted work progresses in
            its own :meth:`HpcWork.wait` and, through :meth:`move_undriven`,
            in any other wait (with the thread, only work on host memory
            does, and only while a thread waits).
    """

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        # Enabled: the works the thread drives. Disabled: those the waits move on, pruned as they end.
        self._works: list[HpcWork] = []
        self._wakeup = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        # Whether the thread will look at the work list again soon without a
        # notify (it is running, or lingering after its last work).
        self._looking = True
        # A collective was posted since the thread last polled: it polls back to back again.
        self._prompted = False
        # A waiting thread moved the works (move_undriven) since this thread last looked.
        self._moved = False

    @property
    def enabled(self) -> bool:
        """Whether a background thread drives submitted work."""
        return self._enabled

    def submit(self, work: HpcWork, prompt: bool = True) -> None:
        """Drive ``work`` in the background until it completes.

        Args:
            work: the posted work.
            prompt: wake the thread now, and have it poll back to back again
                for ``SPIN_S``; else, where the thread is looking for work by
                itself, let it find ``work`` within ``_LOOK_S`` and poll it at
                the pace it polls already.
        """
        if not self._enabled:
            with self._wakeup:
                if not self._stopping:
                    self._works = [held for held in self._works if not held._done]
                    self._works.append(work)
            return
        with self._wakeup:
            if self._stopping:
                return
            work.driven = True
            self._works.append(work)
            self._prompted = self._prompted or prompt
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hpccomm-progress", daemon=True)
                self._thread.start()
            elif prompt or not self._looking:
                self._wakeup.notify()

    def move_undriven(self) -> None:
        """Poll once each submitted work that no thread is waiting on; every long wait does (:func:`while_waiting`).

        Without the thread, a rank blocked in one operation still moves its
        earlier asynchronous ones: a peer that waits for one of them before it
        joins the operation this rank blocks in would otherwise wait for it
        until the timeout (2 ranks, a 4 MiB async all-reduce on shared memory,
        then one rank in a blocking all-reduce of another group: both timed
        out). With the thread, a wait moves them while all are on host memory,
        and the thread leaves them to it while it does (:meth:`_run`), polling
        them itself at least every ``_IDLE_RECHECK_S``; else it moves none.
        """
        # Called by every long wait, often: no lock to read the list, which is replaced, never shortened, under it.
        works = [work for work in self._works if not work.waiters]
        if not self._enabled or all(work.on_host for work in works):
            self._poll(works)
            self._moved = True

    def before_blocking_call(self) -> None:
        """Without the thread, end every submitted collective and send out every deferred point-to-point one.

        For a blocking MPI call of hpccomm's own (a group's creation or
        split), which polls nothing: a rank that created a group while a peer
        waited for its async all-reduce on shared memory hung there, and the
        peer timed out. Every rank calls a job's collectives, a group's
        creation included, in one order, so its peers end theirs too, each
        within its own timeout. A point-to-point operation is left in flight:
        its peer may post its half only after that call (an ``irecv`` first,
        the matching send after the group's creation). But one that its path
        posts only once the caller's stream has reached it (a CUDA tensor's
        send) is posted first, within its own timeout, which waits for this
        rank's device alone: a peer that received before creating the group
        too waited for it until its timeout. An error stays with its work, for
        its own ``wait()``.
        """
        if self._enabled or not self._works:
            return
        with self._wakeup:
            works = list(self._works)
        finish_all([work for work in works if work.collective])
        for work in works:
            if not work.collective:
                work.wait_posted()
        self._drop_ended()

    def _poll(self, works: list[HpcWork]) -> list[HpcWork]:
        """Poll each of ``works`` once, its callbacks left to :mod:`hpccomm.callbacks`; drop the ended from the list.

        Returns those that have ended (here, or meanwhile in a waiter's thread).
        """
        ended = [work for work in works if work.poll(defer_callbacks=True)]
        if ended:
            self._drop_ended()
        return ended

    def _drop_ended(self) -> None:
        """Forget the submitted works that have ended, by whichever thread."""
        with self._wakeup:
            self._works = [work for work in self._works if not work._done]

    def pending(self) -> int:
        """How many submitted works have not completed yet."""
        with self._wakeup:
            return sum(not work._done for work in self._works)

    def _run(self) -> None:
        # Polls back to back while collectives are posted or complete, then, once none has for SPIN_S, naps
        # between polls as a long wait does (hpccomm.work.waiting.drive): yielding, the threads of oversubscribed
        # ranks starved the one that could make progress.
        spin_until = time.monotonic() + SPIN_S
        while True:
            with self._wakeup:
                if not self._works:
                    self._linger()
                if self._stopping:
                    return
                works = [work for work in self._works if not work.waiters]
                moved, self._moved = self._moved, False
                if not works or (moved and driving() and all(work.on_host for work in works)):
                    # Every pending work has a thread in wait() driving it, or a thread waiting on other work moved
                    # it since this one last looked (move_undriven): polling too would only take the GIL from them
                    # (a blocking send/recv ping-pong took 10x as long, and 2.2-3.9x with a receive pending). Where
                    # none did (a wait too short to reach its hook), this thread polls, next time round.
                    self._wakeup.wait(_IDLE_RECHECK_S)
                    continue
                if self._prompted:
                    # A new collective: poll back to back. Not for a point-to-point op, which its caller drives:
                    # spinning beside that caller's waits, the thread took the GIL from them, and a send/recv
                    # ping-pong with one receive in flight paid for it every leg (docs/measurements.md).
                    self._prompted = False
                    spin_until = time.monotonic() + SPIN_S
            own_threads.ready()  # what the transports need of this thread (hpccomm.own_threads)
            if any(work.collective for work in self._poll(works)):  # as for a new one, only a collective's end
                spin_until = time.monotonic() + SPIN_S
            elif time.monotonic() > spin_until:
                time.sleep(NAP_S)
            else:
                # Let the compute thread have the GIL between polls.
                time.sleep(0)

    def _linger(self) -> None:
        """Look for new work every ``_LOOK_S`` for ``_LINGER_S``, then sleep until woken. Holds the lock."""
        give_up = time.monotonic() + _LINGER_S
        while not self._works and not self._stopping and time.monotonic() < give_up:
            self._wakeup.wait(_LOOK_S)
        self._looking = False
        while not self._works and not self._stopping:
            self._wakeup.wait()
        self._looking = True

    def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
        """Drive every submitted work to completion; True if all ended in time."""
        deadline = time.monotonic() + timeout_s
        with self._wakeup:
            works = list(self._works)
        for work in works:
            while not work.poll():
                if time.monotonic() > deadline:
                    return False
                time.sleep(0)
        return True

    def shutdown(self, timeout_s: float = _JOIN_TIMEOUT_S) -> bool:
        """Stop the thread; True if it ended within ``timeout_s``.

        Work still pending is left unfinished (its waiters drive it themselves).
        """
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
            thread = self._thread
            for work in self._works:
                work.driven = False  # from now on, only a waiter drives it
        if thread is None:
            return True
        thread.join(timeout_s)
        return not thread.is_alive()


_engine: ProgressEngine | None = None
_engine_lock = threading.Lock()


def engine() -> ProgressEngine:
    """The process-wide engine, created on first use."""
    global _engine
    if _engine is None:
        with _engine_lock:
            if _engine is None:
                from . import world
                from .config import settings

                _engine = ProgressEngine(settings.progress_thread and world.has_thread_multiple())
                while_waiting(_engine.move_undriven)
                atexit.register(_at_exit, _engine)
    return _engine


def _at_exit(engine_: ProgressEngine) -> None:
    if not engine_.drain():
        import sys

        print(
            f"hpccomm: {engine_.pending()} asynchronous operation(s) still in flight at exit "
            f"after {DRAIN_TIMEOUT_S:.0f} s; a peer may have stopped early",
            file=sys.stderr,
        )
    # Callbacks of work completed just now may still run (and post work): let
    # them finish while MPI is up.
    callbacks.runner().quiesce(_JOIN_TIMEOUT_S)
    engine_.shutdown()
