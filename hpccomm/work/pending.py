"""What a transport hands back for one operation: its posted communication and the local work after it."""

from __future__ import annotations

from typing import Protocol

from ..profiling import path_of

#: What names an operation in waits and errors: (op name, group, sequence number, peer group ranks or None for the
#: whole group, ticket).
Label = tuple


class Pending(Protocol):
    """Posted communication plus the local work that follows it.

    A Pending may also have ``test_inline()``, which :func:`~hpccomm.work.complete_inline`
    polls instead of ``test()``: a blocking call may end sooner than its Work
    would, with what remains queued on the caller's CUDA stream (the staged
    path's copy back, :mod:`hpccomm.transports.host_staged`). One whose
    communication goes out only once its inputs are ready (a device path's
    deferred post) has ``posted()``: polled like ``test()``, True once it has
    gone out (:meth:`~hpccomm.work.HpcWork.wait_posted`).
    """

    def test(self) -> bool:
        """Make progress; return True once all communication has completed."""

    def finish(self) -> None:
        """Local work after the communication (copy-back, scaling); runs once."""


class AllPending:
    """Several Pendings that complete together (the coalesced collectives)."""

    def __init__(self, parts: list[Pending]) -> None:
        self._parts = parts
        self._waiting = list(parts)

    @property
    def path(self) -> str:
        """The paths that serve its parts, for the profiler (:mod:`hpccomm.profiling`)."""
        return "+".join(sorted({path_of(part) for part in self._parts}))

    def test(self) -> bool:
        self._waiting = [part for part in self._waiting if not part.test()]
        return not self._waiting

    def finish(self) -> None:
        for part in self._parts:
            part.finish()
