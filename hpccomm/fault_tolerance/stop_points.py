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

How the stops travel. Told by each survivor to every other rank, they cost
N - 1 messages a survivor and N(N - 1) a failure (16.8 million at 4,096
ranks). From ``HPCCOMM_GOODBYE_TREE_FROM`` ranks (where MPI offers
``MPI_THREAD_MULTIPLE``) they travel a tree of the group's ranks instead, in
the book that carries departures (:mod:`hpccomm.goodbye_tree`): a survivor
gives its stop to its tree neighbours, and each rank passes the stops it
learns on to its other neighbours, many a message, at each look for stops (a
waiting operation's, every 10 ms, or the agreement's). A dead rank is walked
round. A survivor that has every stop has passed them all on and leaves for
the shrink, where it looks no more; a rank that dies then can make it a
waiting survivor's new neighbour, so a thread of its own passes stops on
while it is in the shrink (:meth:`StopPoints.relaying`). When the shrink
returns, every survivor has entered it, so every one had every stop.
"""



from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from ..goodbye_tree import NewsBook
from ..world import failed_ranks, mpi

_STOP_TAG = 11
# Neither clock below decides anything about a peer: a rank is dead when ULFM lists it among the failed, and
# stopped when its stop arrived. They only pace the passing on of stops.
#: How often the thread of :meth:`StopPoints.relaying` looks for stops and deaths while the shrink blocks: twice
#: the agreement's own look (``agreement._STOPS_POLL_S``, 1 ms), as it runs beside a blocked MPI call.
_RELAY_S = 0.002
#: Over the tree, a rank passes stops on at most this often (its own at once, and all it has once it has every
#: stop): its messages grow with how long the survivors take to stop, not with the group's size. Equal to the
#: look of a waiting operation (``agreement._WATCH_S``, 10 ms), which bounds a hop's delay anyway, so pacing adds
#: at most one look a hop.
_PASS_EVERY_S = 0.01


class StopPoints:
    """The stops announced on one group's own communicator (never revoked).

    Nothing is posted for the stops: they are probed for, from any source
    (one probe per look, whatever the group's size, where a receive per peer
    cost each group N-1 pending requests from its creation on, and each look
    a test of every one). A peer's death is what this process's MPI says
    (ULFM's failed ranks); a stop of a peer's that arrives after its death
    was seen is passed on but not counted, so a rank is counted once, as
    stopped or as dead.

    Args:
        comm: a duplicate of the group's communicator, owned by this object.
        tree: pass stops on over a tree of the group's ranks
            (:mod:`hpccomm.goodbye_tree`), not each to every rank; needs
            ``MPI_THREAD_MULTIPLE`` (:meth:`relaying`).

    Attributes:
        sent, received: the messages of stops this rank sent and received.
        relayed: of those sent, the ones the thread of :meth:`relaying` sent.
    """

    def __init__(self, comm: Any, tree: bool = False) -> None:
        self._comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        #: group rank -> its announced stop (this rank's own included once announced)
        self.stops: dict[int, int] = {}
        #: peers whose stop will never come: MPI lists them among the failed (ULFM: they died)
        self.dead: set[int] = set()
        self._failed: set[int] = set()
        self._book: NewsBook[int] | None = NewsBook(self.rank, range(self.size)) if tree else None
        self.sent = self.received = self.relayed = 0
        self._next_pass = 0.0
        self._sends: list[Any] = []
        # MPI forbids two threads receiving one probed message: a waiter and the progress thread both poll.
        self._lock = threading.Lock()

    def poll(self) -> None:
        """Take in the stops that have arrived, and pass them on; a thread finding another polling skips."""
        MPI = mpi()
        comm = self._comm
        if comm is None:
            return
        try:
            # The usual answer, nothing, without the lock (as fail-fast's goodbyes).
            if not comm.Iprobe(MPI.ANY_SOURCE, _STOP_TAG) and not self._pass_due():
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
        """Receive every stop that has arrived, then pass on what a neighbour is owed (under the lock)."""
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
                    break
                self._acknowledge()
                acknowledged = True
                continue
            if message is None:
                break
            buf = bytearray(status.Get_count(MPI.BYTE))
            message.Recv((buf, MPI.BYTE))
            self.received += 1
            pairs = array("q", bytes(buf))
            self._take(zip(pairs[0::2], pairs[1::2]), status.Get_source())
        self._pass_on()

    def _take(self, news: Iterable[tuple[int, int]], source: int | None) -> None:
        """Count the stops of ``news`` (rank, stop) from ``source`` (None: this rank's own); owe them on (tree)."""
        news = list(news)
        for rank, stop in news:
            if rank not in self.dead:
                self.stops.setdefault(rank, stop)
        if self._book is not None:
            self._book.learn(news, source)

    def _acknowledge(self) -> None:
        """Acknowledge the failures MPI knows of on this communicator; count the dead that never stopped.

        Over the tree, a neighbour that died is walked round: the nearest
        live ranks become neighbours, owed every stop known.
        """
        try:
            self._comm.Ack_failed()
        except (mpi().Exception, NotImplementedError):
            pass
        failed = failed_ranks(self._comm)
        self.dead |= failed - set(self.stops)
        if self._book is not None and not failed <= self._failed:
            self._book.reshape(self.rank, range(self.size), failed)
        self._failed |= failed

    def _pass_due(self) -> bool:
        """Whether a neighbour is owed stops that may be passed on now (tree)."""
        return self._book is not None and self._book.owes() and time.monotonic() >= self._next_pass

    def _pass_on(self, now: bool = False) -> None:
        """Send each tree neighbour the stops it is owed, one message each, at most every :data:`_PASS_EVERY_S`
        unless ``now`` (under the lock)."""
        if self._book is None or not (now or self._pass_due()):
            return
        self._next_pass = time.monotonic() + _PASS_EVERY_S
        for neighbour, batch in self._book.outbox().items():
            self._send(neighbour, batch)

    def _send(self, peer: int, news: Iterable[tuple[int, int]]) -> None:
        payload = array("q", [number for pair in news for number in pair]).tobytes()
        MPI = mpi()
        try:
            self._sends.append(self._comm.Isend((payload, MPI.BYTE), peer, _STOP_TAG))
            self.sent += 1
        except MPI.Exception:
            pass  # dead: it needs no stop (over the tree, its other neighbours walk round it)

    def lowest(self) -> int | None:
        """The lowest stop announced so far, or None."""
        stops = list(self.stops.values())
        return min(stops) if stops else None

    def announce(self, stop: int) -> None:
        """Say (once) that this rank's first operation not completed is number ``stop``: to every peer, or the tree."""
        with self._lock:
            if self.rank in self.stops or self._comm is None:
                return
            self._take([(self.rank, stop)], None)
            if self._book is None:
                for peer in range(self.size):
                    if peer != self.rank and peer not in self.dead:
                        self._send(peer, [(self.rank, stop)])
            self._pass_on(now=True)

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
        if len(self.stops) + len(self.dead) < self.size:
            return False
        with self._lock:
            self._pass_on(now=True)  # all the neighbours are owed, before this rank leaves for the shrink
        return True

    @contextmanager
    def relaying(self) -> Iterator[None]:
        """Over the tree, pass stops on from a thread of this rank's while the caller blocks (in the shrink).

        Every :data:`_RELAY_S` the thread takes in stops and looks for a new
        death, which may make a survivor still waiting for stops this rank's
        new neighbour; it ends with the block.
        """
        if self._book is None:
            yield
            return
        done = threading.Event()

        def relay() -> None:
            while not done.wait(_RELAY_S):
                try:
                    self.poll()
                    with self._lock:
                        if self._comm is not None and not failed_ranks(self._comm) <= self._failed:
                            self._acknowledge()
                            self._receive_all()
                except Exception:  # the thread goes on: its next turn may pass the stops on
                    pass

        sent = self.sent
        thread = threading.Thread(target=relay, name="hpccomm-stops", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            self.relayed += self.sent - sent  # the caller sent nothing: it was blocked

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
