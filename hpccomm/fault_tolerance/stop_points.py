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

    Nothing is posted for the stops: they are probed for, from any source
    (one probe per look, whatever the group's size, where a receive per peer
    cost each group N-1 pending requests from its creation on, and each look
    a test of every one). A peer's death is what this process's MPI says
    (ULFM's failed ranks); a stop that a peer sent before it died is taken
    in only if it arrived before the death was seen, so a rank is counted
    once, as stopped or as dead.

    Args:
        comm: a duplicate of the group's communicator, owned by this object.
    """

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        #: group rank -> its announced stop (this rank's own included once announced)
        self.stops: dict[int, int] = {}
        #: peers whose stop will never come: MPI lists them among the failed (ULFM: they died)
        self.dead: set[int] = set()
        self._sends: list[Any] = []
        # MPI forbids two threads receiving one probed message: a waiter and the progress thread both poll.
        self._lock = threading.Lock()

    def poll(self) -> None:
        """Take in the stops that have arrived; a thread finding another polling skips."""
        MPI = mpi()
        comm = self._comm
        if comm is None:
            return
        try:
            # The usual answer, nothing, without the lock (as fail-fast's goodbyes).
            if not comm.Iprobe(MPI.ANY_SOURCE, _STOP_TAG):
                return
        except MPI.Exception:
            pass  # ULFM: a rank failed; acknowledged below
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._receive_all()
        finally:
            self._lock.release()

    def _receive_all(self) -> None:
        """Receive every stop that has arrived (under the lock)."""
        if self._comm is None:
            return  # closed meanwhile by another thread
        MPI = mpi()
        status = MPI.Status()
        acknowledged = False
        while True:
            try:
                message = self._comm.Improbe(MPI.ANY_SOURCE, _STOP_TAG, status)
            except MPI.Exception:
                # ULFM: probing any source raises until this process acknowledges the failures it knows of.
                if acknowledged:
                    return
                self._acknowledge()
                acknowledged = True
                continue
            if message is None:
                return
            buf = bytearray(8)
            message.Recv((buf, MPI.BYTE))
            peer = status.Get_source()
            if peer not in self.dead:
                self.stops[peer] = int.from_bytes(buf, "little", signed=True)

    def _acknowledge(self) -> None:
        """Acknowledge the failures MPI knows of on this communicator; count the dead that never stopped."""
        try:
            self._comm.Ack_failed()
        except (mpi().Exception, NotImplementedError):
            pass
        self.dead |= failed_ranks(self._comm) - set(self.stops)

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
            if peer != self.rank and peer not in self.dead:
                try:
                    self._sends.append(self._comm.Isend((token, MPI.BYTE), peer, _STOP_TAG))
                except MPI.Exception:
                    pass  # dead: it needs no stop

    def complete(self) -> bool:
        """Whether every rank has announced its stop or is known dead.

        Dead: this process's MPI lists it among the failed, and its stop had
        not arrived when that was seen.
        """
        self.poll()
        if len(self.stops) + len(self.dead) < self.size:
            with self._lock:
                self._receive_all()  # the stops here first: a rank whose stop arrived is not counted dead
                self._acknowledge()
                self._receive_all()
        return len(self.stops) + len(self.dead) >= self.size

    def close(self) -> None:
        """Receive the stops already here and settle this rank's sends; free the communicator if no rank announced.

        Local: a stop that arrives later is left to the communicator, which
        is not freed once any rank announced (a dead peer's messages may
        still refer to it).
        """
        with self._lock:
            if self._comm is None:
                return
            Exception = mpi().Exception
            try:
                self._receive_all()
            except Exception:
                pass
            for request in self._sends:
                try:
                    if not request.Test():
                        request.Cancel()
                except Exception:
                    pass
            self._sends = []
            if not self.stops:
                self._comm.Free()
            self._comm = None
