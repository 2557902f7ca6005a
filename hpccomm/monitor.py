"""A barrier that names the ranks that did not arrive.

torch offers ``dist.monitored_barrier`` for Gloo only (it refuses other
backends by name); hpccomm offers the same as ``group.monitored_barrier()``
and :func:`hpccomm.monitored_barrier`, worded as Gloo's so that code matching
Gloo's messages keeps working:

* rank 0 of the group waits for a note from every other rank, in rank order
  (or for all at once with ``wait_all_ranks``); when all have arrived it
  releases them. If one is missing when the timeout passes, rank 0 raises
  "Rank R failed to pass monitoredBarrier in T ms" (with ``wait_all_ranks``:
  "Ranks R1, R2 ...", every missing rank);
* a rank that arrived but is never released raises "Rank R successfully
  reached monitoredBarrier, but received errors while waiting for send/recv
  from rank 0".

Notes travel on a communicator of the group's own, made when the group is
created (making one later would itself wait for every rank), so they never
meet the group's other traffic. Each note carries the call's number, so a
note from an earlier call that failed is recognised and skipped.
"""

from __future__ import annotations

import time
from array import array
from datetime import timedelta
from typing import Any

from torch._C._distributed_c10d import BarrierOptions

from .validation import fail
from .world import mpi

_ARRIVED_TAG = 1
_RELEASED_TAG = 2


class MonitoredBarrierError(RuntimeError):
    """A monitored barrier failed: some rank did not arrive in time."""


def barrier_seconds(timeout: timedelta | float | BarrierOptions | None, default_s: float) -> float:
    """The seconds a monitored barrier waits, from any form of its ``timeout`` (``default_s`` for None).

    Raises:
        ValueError: the timeout is negative.
    """
    if isinstance(timeout, BarrierOptions):  # torch's Backend API passes its options
        timeout = timeout.timeout if timeout.timeout.total_seconds() >= 0 else None
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    else:
        seconds = default_s if timeout is None else float(timeout)
    if seconds < 0:
        raise fail("monitored_barrier", f"timeout={timeout} must not be negative")
    return seconds


class Monitor:
    """Monitored barriers over one group's control communicator.

    Args:
        comm: a duplicate of the group's communicator, used only here (owned).
    """

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()
        self._calls = 0
        # A failed call can leave a note unmatched: then the communicator is
        # left to MPI_Finalize rather than freed under it.
        self._stranded = False

    def barrier(self, where: str, timeout_s: float, wait_all_ranks: bool, global_ranks: tuple[int, ...]) -> None:
        """Wait until every rank of the group has arrived, or raise naming who did not.

        Args:
            where: 'monitored_barrier on group ...', for messages.
            timeout_s: how long rank 0 waits for the others, and they for it.
            wait_all_ranks: rank 0 waits for every rank and names all missing
                ones, rather than stopping at the first.
            global_ranks: the world rank of each group rank, for messages.
        """
        self._calls += 1
        if self._size == 1:
            return
        if self._rank == 0:
            self._collect(where, timeout_s, wait_all_ranks, global_ranks)
        else:
            self._arrive(where, timeout_s)

    def _collect(self, where: str, timeout_s: float, wait_all_ranks: bool, global_ranks: tuple[int, ...]) -> None:
        MPI = mpi()
        start = time.monotonic()
        deadline = start + timeout_s
        notes = {peer: self._post_note_receive(peer) for peer in range(1, self._size)}
        missing: list[int] = []
        for peer in range(1, self._size):
            if not wait_all_ranks and time.monotonic() >= deadline:
                self._cancel(notes)
                raise MonitoredBarrierError(
                    f"hpccomm {where}: Rank 0 timed out in monitoredBarrier after {_ms(time.monotonic() - start)} ms"
                )
            if not self._await_note(notes, peer, deadline):
                missing.append(peer)
                if not wait_all_ranks:
                    break
        if missing:
            self._cancel(notes)
            world = ", ".join(str(global_ranks[peer]) for peer in missing)
            who = f"Rank {missing[0]}" if len(missing) == 1 else "Ranks " + ", ".join(map(str, missing))
            raise MonitoredBarrierError(
                f"hpccomm {where}: {who} failed to pass monitoredBarrier in {_ms(timeout_s)} ms "
                f"(world rank(s) {world}; Timed out waiting for them)"
            )
        token = array("q", [self._calls])
        releases = [self._comm.Isend((token, MPI.INT64_T), peer, _RELEASED_TAG) for peer in range(1, self._size)]
        # Everyone arrived and waits for these, so they complete; bounded all the same.
        if not _wait(lambda: MPI.Request.Testall(releases), time.monotonic() + max(timeout_s, 1.0)):
            self._stranded = True

    def _post_note_receive(self, peer: int) -> tuple[Any, array]:
        note = array("q", [0])
        return self._comm.Irecv((note, mpi().INT64_T), peer, _ARRIVED_TAG), note

    def _await_note(self, notes: dict[int, tuple[Any, array]], peer: int, deadline: float) -> bool:
        """Wait until ``peer``'s note of this call arrives (skipping older ones); False at the deadline."""
        while True:
            request, note = notes[peer]
            if not _wait(request.Test, deadline):
                return False
            if note[0] == self._calls:
                del notes[peer]
                return True
            notes[peer] = self._post_note_receive(peer)  # a late note of a failed call

    def _cancel(self, notes: dict[int, tuple[Any, array]]) -> None:
        for request, _note in notes.values():
            request.Cancel()
            request.Wait()
        notes.clear()
        self._stranded = True  # notes still on their way are never received

    def _arrive(self, where: str, timeout_s: float) -> None:
        MPI = mpi()
        note = array("q", [self._calls])
        sent = self._comm.Isend((note, MPI.INT64_T), 0, _ARRIVED_TAG)
        release = array("q", [0])
        deadline = time.monotonic() + timeout_s
        while True:
            received = self._comm.Irecv((release, MPI.INT64_T), 0, _RELEASED_TAG)
            if not _wait(received.Test, deadline):
                received.Cancel()
                received.Wait()
                self._stranded = not sent.Test()
                raise MonitoredBarrierError(
                    f"hpccomm {where}: Rank {self._rank} successfully reached monitoredBarrier, but received "
                    f"errors while waiting for send/recv from rank 0 (Timed out after {_ms(timeout_s)} ms: rank 0 "
                    "released no rank, so some rank did not arrive; rank 0's error names it)"
                )
            if release[0] == self._calls:
                break
            # A release rank 0 sent just after an earlier call here gave up on it.
        _wait(sent.Test, time.monotonic() + 1.0)  # rank 0 has received it, so it completes

    def close(self) -> None:
        """Free the control communicator, unless a failed call may still use it."""
        if self._comm is not None:
            if not self._stranded:
                self._comm.Free()
            self._comm = None


def _wait(done: Any, deadline: float) -> bool:
    """Poll ``done()`` until it is true (True) or ``deadline`` passes (False), yielding the CPU."""
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0)
    return True


def _ms(seconds: float) -> int:
    return round(seconds * 1000)

