"""A group's transports in fault-tolerant mode: an MPI error from a dead rank becomes the group's PeerFailure.

:func:`protect` wraps each transport of a new group in a
:class:`FaultTolerantTransport`; the front, which knows no transport, sees the
PeerFailure as any operation's error. Each operation is numbered as it is
posted (the stops of :mod:`.stop_points`), and a collective's result is kept
once complete (:mod:`.kept_results`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..failure import over_tree
from ..profiling import path_of
from ..transports import Transport, WrappingTransport
from ..work import Pending
from ..world import hostname, mpi
from .agreement import Recovery
from .kept_results import fill, shared_outputs
from .processes import started_at
from .stop_points import StopPoints

#: A pending operation looks for a failure it cannot see itself (:meth:`Recovery.watch`, which reads the clock)
#: at every this many polls that found it not complete: a clock read costs more than a poll of a request about to
#: complete (``hpccomm.work.waiting``'s own pace). Polls that nap (``hpccomm.work.NAP_S``, 0.2 ms) look every
#: 3.2 ms, within the watch's own 10 ms.
_POLLS_PER_WATCH = 16


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
    here, me = hostname(), os.getpid()
    everyone = comm.allgather((here, me, started_at(me)))
    node_ranks = {rank: (pid, started) for rank, (host, pid, started) in enumerate(everyone) if host == here and pid != me}
    recovery = Recovery(own[0], revocable, node_ranks, describe, StopPoints(comm.Dup(), over_tree(comm.Get_size())))
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

    __slots__ = ("_inner", "_recovery", "_op", "_key", "_outputs", "_number", "_error", "_repair", "_polls")

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
        self._polls = 0

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
            self._polls += 1
            if not self._polls % _POLLS_PER_WATCH:
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
