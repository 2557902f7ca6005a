"""The agreement: which ranks of a group died, the same answer on every survivor (:class:`Recovery`).

The first survivor to meet a failure says where it stopped
(:mod:`.stop_points`); once every survivor has, the group's communicators are
revoked, so that the revoke ends the same operations on all of them, and each
survivor takes part in one shrink of the group's communicator: the ranks
missing from its result are the failed ones, agreed by construction. An
operation completed on some survivors only is completed on the others with a
kept result (:mod:`.kept_results`). ``dist.shrink_group`` then builds the
survivors' group on the shrunk communicator (:meth:`Recovery.rebuild`).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..config import settings
from ..world import mpi, skip_finalize
from .errors import FailureSeen, PeerFailure
from .kept_results import KeptResults
from .processes import alive, fence
from .stop_points import StopPoints

T = TypeVar("T")

#: How often a waiting operation looks for a failure it cannot see itself (:meth:`Recovery.watch`).
_WATCH_S = 0.01
#: Between polls while a survivor waits for the others' stops.
_STOPS_POLL_S = 0.001
#: The survivors' communicator carries nothing else before the new group is built on it.
_REPAIR_TAG = 1
#: Point-to-point operations: numbered with the collective after them (:meth:`Recovery.begin`).
_POINT_TO_POINT = frozenset({"send", "recv"})


class Recovery:
    """One group's failure state: the agreement on its dead ranks, and its survivors' communicator.

    Args:
        comm: the group's communicator that the survivors shrink (the backend's own).
        revocable: every communicator the group's operations run on; all are
            revoked at the first failure, so that no survivor waits on one.
        node_ranks: the group's other ranks on this node: rank -> (process id,
            its start time), which :meth:`watch` checks and a failed one is
            ended by (:func:`_fence`).
        describe: the group's description, for messages.
        stops: where the group's survivors stopped, exchanged on a communicator
            of its own (:mod:`hpccomm.fault_tolerance.stop_points`).
    """

    def __init__(
        self,
        comm: Any,
        revocable: Sequence[Any],
        node_ranks: dict[int, tuple[int, str]],
        describe: Callable[[], str],
        stops: StopPoints,
    ) -> None:
        self._comm = comm
        self._revocable = list(revocable)
        self._node_ranks = dict(node_ranks)
        self._describe = describe
        self._stops = stops
        self._lock = threading.Lock()
        self._failed: list[int] | None = None
        self._uneven: dict[int, int] = {}
        self._shrunk: Any = None
        self._next_watch = 0.0
        self._death_seen = False
        #: The number the next collective posted on the group takes.
        self._next_op = 0
        #: This rank's operations posted and not yet ended: a key of each -> its number (point-to-point
        #: operations share one). Each change is one dict operation, atomic under the GIL: no lock per call.
        self._pending: dict[int, int] = {}
        self._keys = itertools.count()
        self.kept = KeptResults(settings.ft_keep_bytes)
        #: Operation number -> another survivor's result for this rank's failed copy of it (:meth:`_repair`).
        self._repairs: dict[int, list[bytes]] = {}

    def begin(self, op: str) -> tuple[int, int]:
        """Number an operation as it is posted: (its key, its number); pending until :meth:`end` of the key."""
        number = self._next_op
        if op not in _POINT_TO_POINT:
            self._next_op = number + 1
        key = next(self._keys)
        self._pending[key] = number
        return key, number

    def end(self, key: int) -> None:
        """The operation of ``key`` completed or failed here."""
        self._pending.pop(key, None)

    def _first_pending(self) -> int:
        """This rank's first operation not completed (the next one, when none is pending)."""
        return min(list(self._pending.values()), default=self._next_op)

    def _is_pending(self, number: int) -> bool:
        return number in list(self._pending.values())

    def watch(self) -> None:
        """Raise :class:`FailureSeen` if the group met a failure that a waiting operation cannot see itself.

        Every 10 ms of waiting it looks: has another survivor stopped at or
        before the operation this rank waits on (it will never join it)? An
        operation waiting in shared memory (the node's engine, or a
        hierarchical collective's node stage) calls no MPI, so it also looks
        for a revoked group and for a dead rank of the group on this node:
        else it would wait on a dead rank, or on a leader that has left for
        the agreement, without end. Then it joins the agreement.
        """
        now = time.monotonic()
        if now < self._next_watch:
            return
        self._next_watch = now + _WATCH_S
        self._stops.poll()
        lowest = self._stops.lowest()
        if lowest is not None and self._first_pending() >= lowest:
            raise FailureSeen(f"another survivor of {self._describe()} stopped at its operation {lowest}")
        if self._comm.Is_revoked():
            raise FailureSeen(f"{self._describe()} was revoked by another survivor")
        for pid, _ in self._node_ranks.values():
            if not alive(pid):
                if self._death_seen:
                    raise FailureSeen(f"process {pid} of {self._describe()} on this node died")
                # Not yet: the operation may need nothing more of it (it finished its share, and
                # other survivors complete the operation). Blocked still at the next look, it fails.
                self._death_seen = True
                return

    @property
    def failed_ranks(self) -> list[int] | None:
        """The agreed dead ranks (group ranks), or None while no failure has been met."""
        return self._failed

    def failure(self, error: BaseException, op: str) -> BaseException:
        """The error to raise for ``error``, met by ``op``: the group's PeerFailure if ranks failed.

        The first MPI error announces where this rank stopped, waits for every
        other rank's stop (or death), then revokes the group's communicators
        and shrinks the group with the other survivors (blocking until each
        has met the failure too); later calls return at once.
        """
        if not isinstance(error, (mpi().Exception, FailureSeen)):
            return error  # bad input and the like: nothing was posted
        # Any MPI error, not only ULFM's classes: Open MPI 5.0's nonblocking collectives end some
        # survivors' requests with MPI_ERR_OTHER (3 in 5 runs at 4 ranks), before this process has
        # learnt of any failure (MPI_Comm_get_failed still empty 0.5 s later). The shrink tells.
        skip_finalize()
        with self._lock:
            if self._failed is None:
                self._failed = self._agree()
        if not self._failed:
            return RuntimeError(
                f"hpccomm {op} on {self._describe()}: MPI error ({error}); no rank of the group failed, "
                "but fault-tolerant mode has revoked the group: destroy it"
            )
        return self.peer_failure(op)

    def peer_failure(self, op: str) -> PeerFailure:
        """The group's PeerFailure, for ``op`` (once the failure has been agreed)."""
        assert self._failed is not None
        ranks = ", ".join(map(str, self._failed))
        uneven = ""
        if self._uneven:
            stops = ", ".join(f"rank {rank} at operation {stop}" for rank, stop in self._uneven.items())
            uneven = (
                f". The survivors stopped at different operations ({stops}): a rank died in the middle of one "
                "that some survivors completed, so redoing the failed step would pair different operations"
            )
        return PeerFailure(
            f"hpccomm {op} on {self._describe()}: rank(s) {ranks} of this group failed (agreed by the "
            f"survivors); recover with dist.shrink_group({self._failed}, group) and rebuild what used it{uneven}",
            self._failed,
            self._uneven,
        )

    def _agree(self) -> list[int]:
        # Not revoked before every survivor has said where it stopped: a survivor still inside an
        # earlier operation (all of whose data was sent) completes it, as the others did.
        self._stops.announce(self._first_pending())
        while not self._stops.complete():
            time.sleep(_STOPS_POLL_S)
        for comm in self._revocable:
            try:
                comm.Revoke()
            except mpi().Exception:
                pass  # freed or already revoked
        # Blocking, without the group's timeout: Open MPI 5.0's nonblocking MPI_Comm_ishrink fails
        # (MPI_ERR_INTERN at its first test, seen with the 5.0.x wheel), so a survivor that never
        # meets the failure keeps the others here.
        with self._stops.relaying():
            shrunk = self._comm.Shrink()
        self._shrunk = shrunk
        MPI = mpi()
        kept = MPI.Group.Translate_ranks(shrunk.Get_group(), list(range(shrunk.Get_size())), self._comm.Get_group())
        failed = sorted(set(range(self._comm.Get_size())) - set(kept))
        self._fence(failed)
        # The stops of the survivors only: a rank that announced and then died does not count.
        survivors = {rank: stop for rank, stop in self._stops.stops.items() if rank not in failed}
        if len(set(survivors.values())) > 1:
            self._uneven = self._repair(shrunk, survivors)
        return failed

    def _repair(self, shrunk: Any, stops: dict[int, int]) -> dict[int, int]:
        """Even out the survivors' stops where one operation completed on some of them only. Collective.

        Where every survivor stopped at m or m + 1, each one that stopped at m
        had operation m posted, and one that stopped at m + 1 kept its result
        (:mod:`hpccomm.fault_tolerance.kept_results`), that one sends the result to the others,
        whose operation m then completes with it. Decided on what every
        survivor tells every other, so all reach the same answer.

        Returns:
            the survivors' stops if they still differ, else {}.
        """
        me = self._comm.Get_rank()
        told = shrunk.allgather((me, self._is_pending(stops[me]), self.kept.numbers()))
        first, last = min(stops.values()), max(stops.values())
        behind = [index for index, (rank, posted, _) in enumerate(told) if stops[rank] == first]
        sources = [index for index, (rank, _, kept) in enumerate(told) if stops[rank] == last and first in kept]
        if last != first + 1 or not sources or not all(told[index][1] for index in behind):
            return dict(sorted(stops.items()))
        source, here = sources[0], shrunk.Get_rank()
        payload = self.kept.payload(first) if here == source else None
        # A held result may have changed since the source said it had it: it says again, to all.
        if not shrunk.bcast(payload is not None, root=source):
            return dict(sorted(stops.items()))
        if here == source:
            for index in behind:
                shrunk.send(payload, dest=index, tag=_REPAIR_TAG)
        elif here in behind:
            self._repairs[first] = shrunk.recv(source=source, tag=_REPAIR_TAG)
        return {}

    def _fence(self, failed: Sequence[int]) -> None:
        """End the processes of failed ranks on this node that still run: ULFM's detector found them silent."""
        for rank in failed:
            if rank in self._node_ranks:
                fence(*self._node_ranks[rank])

    def take_repair(self, number: int) -> list[bytes] | None:
        """Another survivor's result for this rank's failed operation ``number``, or None (:meth:`_repair`)."""
        return self._repairs.pop(number, None)

    def rebuild(self, excluded: Sequence[int], build: Callable[[Any], T]) -> T:
        """The survivors' group, made by ``build`` on their communicator (collective over them).

        A rank that dies while the group is built leaves the survivors
        agreeing on it as on any failure: ``build`` is checked on every
        survivor by one more shrink (which of them are alive) and an agreement
        (whether each one built it), the same answer everywhere. Then the new
        group is dropped, and this group's :class:`PeerFailure` names every
        dead rank, so that a second ``dist.shrink_group`` with those ranks
        builds the group on the survivors that remain.

        Args:
            excluded: ranks of this group to leave out (every failed one included).
            build: makes the new group on a communicator it then owns.

        Raises:
            PeerFailure: a rank died while the new group was made.
        """
        comm = self.survivors(excluded)
        MPI = mpi()
        built: T | None = None
        error: BaseException | None = None
        try:
            built = build(comm)
        except Exception as exc:
            error = exc
        alive, everyone_built = check_built(comm, error is None)
        if everyone_built:
            alive.Free()
            return built  # type: ignore[return-value]
        if built is not None:
            built.abort()
        kept = MPI.Group.Translate_ranks(alive.Get_group(), list(range(alive.Get_size())), self._comm.Get_group())
        failed = sorted(set(range(self._comm.Get_size())) - set(kept))
        self._fence(failed)
        if failed == self._failed:
            alive.Free()
            raise error if error is not None else RuntimeError("hpccomm shrink: another survivor could not build the group")
        self._failed, self._shrunk, self._uneven = failed, alive, {}
        raise self.peer_failure("shrink") from error

    def close(self) -> None:
        """Release the stop exchange (local; idempotent)."""
        self._stops.close()

    def survivors(self, excluded: Sequence[int]) -> Any:
        """A communicator over this group's ranks but ``excluded``, for the shrunk group (collective over them).

        Raises:
            ValueError: ``excluded`` leaves out a rank that failed.
        """
        excluded = sorted(set(int(rank) for rank in excluded))
        MPI = mpi()
        if self._failed is None:
            # No failure met: the excluded ranks are alive and take no part; only the others call this.
            keep = self._comm.Get_group().Excl(excluded)
            return self._comm.Create_group(keep, 1)
        missing = sorted(set(self._failed) - set(excluded))
        if missing:
            raise ValueError(
                f"hpccomm shrink: rank(s) {', '.join(map(str, missing))} of {self._describe()} failed and must "
                f"be excluded too (PeerFailure.failed_ranks: {self._failed})"
            )
        comm, self._shrunk = self._shrunk, None
        if comm is None:
            raise RuntimeError(f"hpccomm shrink: {self._describe()} was shrunk once already; shrink the new group")
        extra = sorted(set(excluded) - set(self._failed))
        if not extra:
            return comm
        # Alive ranks excluded as well: carve them out of the shrunk communicator.
        in_shrunk = MPI.Group.Translate_ranks(self._comm.Get_group(), extra, comm.Get_group())
        keep = comm.Get_group().Excl([rank for rank in in_shrunk if rank != MPI.UNDEFINED])
        narrowed = comm.Create_group(keep, 2)
        comm.Free()
        return narrowed


def check_built(comm: Any, built: bool) -> tuple[Any, bool]:
    """Whether every process of ``comm`` built what it was building on it, and who is alive. Collective.

    A rank that dies while a group is built fails the build on some processes
    and not others. One that failed revokes ``comm``, so that the others still
    inside the build's collectives leave them; then one shrink tells who is
    alive, and ULFM's agreement on each one's word is the same answer on all.

    Returns:
        the survivors' communicator (the caller frees it or builds on it), and
        True where everyone built and nobody died.
    """
    MPI = mpi()
    if not built:
        try:
            comm.Revoke()
        except MPI.Exception:
            pass
    alive = comm.Shrink()
    try:
        everyone = bool(alive.Agree(int(built))) and alive.Get_size() == comm.Get_size()
    except MPI.Exception:
        everyone = False
    return alive, everyone
