"""Where each survivor of a group stopped: the exchange that orders a fault-tolerant group's revoke.

ULFM ends operations unevenly. When a rank dies between operation k and
k + 1, a survivor that has finished k meets the death in k + 1, while a
slower survivor may still be inside k, whose data has all been sent. If the
first survivor revoked the group at once, the revoke would end the slower
survivor's k too: one survivor would report operation k + 1 as failed and
another operation k, a program that redoes its failed step would redo
different steps on different ranks, and the survivors' group would pair
mismatched operations (a hang, or a truncated message) after the shrink.
That was the hang of issue 32: 7 of 26 runs of a training loop under load.

So the survivors first say where they stopped. A survivor that meets a
failure announces its *stop*: the number of its first operation on the
group that it has not completed (operations counted as they are posted; a
point-to-point operation takes the number of the collective after it). A
survivor still waiting on an earlier operation keeps driving it, and
announces once the operation it waits on is numbered at or after the lowest
stop it has heard of. Only when every rank of the group has announced, or
is known dead, is the group revoked: by then no survivor waits on an
operation before the lowest stop, so the revoke ends the same operations on
every one of them.

A death in the middle of an operation can still leave it completed on some
survivors and failed on others (a rank that forwarded its share to one
survivor and died before sending it to another). The announced stops show
it: :mod:`hpccomm.fault_tolerance.kept_results` completes it on the others where it can,
and :class:`~hpccomm.fault_tolerance.PeerFailure` says so (``uneven``)
where it cannot, rather than letting the survivors' group hang later.
"""

from __future__ import annotations

import threading
from typing import Any

from ..world import failed_ranks, mpi

_STOP_TAG = 11


class StopPoints:
    """The stops announced on one group's own communicator (never revoked).

    Args:
        comm: a duplicate of the group's communicator, owned by this object.
    """

    def __init__(self, comm: Any) -> None:
        MPI = mpi()
        self._comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        #: peer -> (posted receive of its stop, its 8-byte buffer)
        self._inbox: dict[int, tuple[Any, bytearray]] = {}
        for peer in range(self.size):
            if peer != self.rank:
                buf = bytearray(8)
                self._inbox[peer] = (comm.Irecv((buf, MPI.BYTE), peer, _STOP_TAG), buf)
        #: group rank -> its announced stop (this rank's own included once announced)
        self.stops: dict[int, int] = {}
        #: peers whose stop will never come: their receive ended in error (ULFM: they died)
        self.dead: set[int] = set()
        self._sends: list[Any] = []
        #: receives of peers counted dead while still posted, cancelled at close
        self._abandoned: list[Any] = []
        # MPI forbids two threads completing one request: a waiter and the progress thread both poll.
        self._lock = threading.Lock()

    def poll(self) -> None:
        """Take in the stops (and deaths) that have arrived; a thread finding another polling skips."""
        if not self._inbox or not self._lock.acquire(blocking=False):
            return
        try:
            Exception = mpi().Exception
            for peer in list(self._inbox):
                request, buf = self._inbox[peer]
                try:
                    arrived = request.Test()
                except Exception:
                    del self._inbox[peer]
                    self.dead.add(peer)
                    continue
                if arrived:
                    del self._inbox[peer]
                    self.stops[peer] = int.from_bytes(buf, "little", signed=True)
        finally:
            self._lock.release()

    def lowest(self) -> int | None:
        """The lowest stop announced so far, or None."""
        stops = list(self.stops.values())
        return min(stops) if stops else None

    def announce(self, stop: int) -> None:
        """Tell every peer that this rank's first operation not completed is number ``stop`` (once)."""
        if self.rank in self.stops:
            return
        self.stops[self.rank] = stop
        MPI = mpi()
        token = bytearray(stop.to_bytes(8, "little", signed=True))
        for peer in range(self.size):
            if peer != self.rank:
                try:
                    self._sends.append(self._comm.Isend((token, MPI.BYTE), peer, _STOP_TAG))
                except MPI.Exception:
                    pass  # dead: it needs no stop

    def complete(self) -> bool:
        """Whether every rank has announced its stop or is known dead.

        Dead: its receive ended in error, or, where it has not (yet), this
        process's MPI lists it among the failed: two reports of one fact, and
        the agreement needs only one.
        """
        self.poll()
        if len(self.stops) + len(self.dead) < self.size:
            with self._lock:
                for peer in failed_ranks(self._comm) & set(self._inbox):
                    request, _buf = self._inbox.pop(peer)
                    self._abandoned.append(request)
                    self.dead.add(peer)
        return len(self.stops) + len(self.dead) >= self.size

    def close(self) -> None:
        """Cancel the receives no stop matched; free the communicator if no rank announced (local)."""
        Exception = mpi().Exception
        with self._lock:
            if self._comm is None:
                return
            for request in [*(request for request, _buf in self._inbox.values()), *self._abandoned]:
                try:
                    request.Cancel()
                    request.Wait()
                except Exception:
                    pass  # a dead peer's
            self._inbox.clear()
            self._abandoned = []
            for request in self._sends:
                try:
                    if not request.Test():
                        request.Cancel()
                except Exception:
                    pass
            self._sends = []
            if not self.stops:
                self._comm.Free()  # after a failure it stays: a dead peer's requests may still refer to it
            self._comm = None
