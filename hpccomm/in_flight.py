"""A group's asynchronous operations in flight, and the memory each of its collectives uses.

NCCL runs a group's collectives one after another on one stream, as torch's
MPI backend runs them on one thread: a collective called on memory that an
earlier asynchronous one still reads or writes sees that one's results, so
two ``all_reduce(t, async_op=True)`` in a row, waited on afterwards, leave
``t`` reduced twice. hpccomm's transports run the operations in flight side
by side (MPI's nonblocking collectives, the shared-memory path, the staged
path's copies), as Gloo's worker threads do, and such a pair used to read
and write ``t`` at once: on 2 ranks, 153 of 200 pairs of 4-float
all-reduces ended with values NCCL never gives (Gloo: 178 of 200).

:class:`InFlight` holds a group's asynchronous works. Before the front posts
a collective, :meth:`InFlight.end_overlapping` ends every earlier collective
of the group whose memory overlaps the new one's where either writes it,
waiting on the caller's thread (a failed one keeps its error for its own
``wait()``). Memory is compared as the byte ranges the tensors span, so
calls on disjoint slices of one buffer (a chunked all-reduce) still run side
by side, and a group with nothing in flight pays one truth test per call.
A barrier ends every earlier collective of the group first, as Gloo's
barrier waits for the group's earlier work and NCCL's for its stream: before,
an ``all_reduce(t, async_op=True)`` could still be running after the
barrier (19 of 20 times at 64 MiB on 2 ranks), ``t`` not yet reduced.
Point-to-point operations neither wait nor are waited for: NCCL runs them
apart from the collectives too, and a receive that waited for its own
buffer's send would deadlock a ring of peers doing the same. Sparse tensors
are not compared (their memory is not one range).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from .work import CommTimeoutError, HpcWork, describe, finish_all

#: The bytes ``[start, end)`` a tensor's elements span.
Extent = tuple[int, int]


def extents(tensors: Sequence[torch.Tensor]) -> tuple[Extent, ...]:
    """The byte range each strided tensor of ``tensors`` spans; an empty one spans none."""
    spans = []
    for tensor in tensors:
        if tensor.layout is not torch.strided or not tensor.numel():
            continue
        start = tensor.data_ptr()
        if tensor.is_contiguous():
            spans.append((start, start + tensor.nbytes))
        else:
            last = sum((n - 1) * stride for n, stride in zip(tensor.shape, tensor.stride()))
            spans.append((start, start + (last + 1) * tensor.element_size()))
    return tuple(spans)


def bounds(ranges: Sequence[Extent]) -> Extent:
    """The one range that covers ``ranges`` (empty where they are none)."""
    if len(ranges) == 1:
        return ranges[0]
    return (min(start for start, _ in ranges), max(end for _, end in ranges)) if ranges else (0, 0)


def overlap(one: Sequence[Extent], other: Sequence[Extent]) -> bool:
    """Whether any range of ``one`` shares a byte with any of ``other``."""
    if len(one) > 1 and len(other) > 1:  # a list of tensors each side (an all-gather's outputs): bounds first
        (start, end), (other_start, other_end) = bounds(one), bounds(other)
        if not (start < other_end and other_start < end):
            return False
    for start, end in one:
        for other_start, other_end in other:
            if start < other_end and other_start < end:
                return True
    return False


class _Uses:
    """One collective's tensors, their byte ranges worked out when first compared."""

    __slots__ = ("writes", "reads", "_written", "_read")

    def __init__(self, writes: Sequence[torch.Tensor], reads: Sequence[torch.Tensor]) -> None:
        self.writes = writes
        self.reads = reads
        self._written: tuple[Extent, ...] | None = None
        self._read: tuple[Extent, ...] = ()

    def clash(self, writes: tuple[Extent, ...], reads: tuple[Extent, ...]) -> bool:
        """Whether a later collective writing ``writes`` and reading ``reads`` must wait for this one."""
        if self._written is None:
            self._written = extents(self.writes)
            self._read = self._written if self.reads is self.writes else extents(self.reads)
        written, read = self._written, self._read
        return (overlap(writes, written) or (read is not written and overlap(writes, read))
                or (reads is not writes and overlap(reads, written)))


class InFlight:
    """A group's asynchronous works not yet seen to end, each collective with the memory it uses.

    Attributes:
        entries: (work, its collective's uses, or None for a point-to-point
            op), in call order; empty once every work has ended and been
            dropped (at the next call that looks).
        failed: whether a work dropped from here had ended with an error.
    """

    __slots__ = ("entries", "failed", "_lock")

    def __init__(self) -> None:
        self.entries: list[tuple[HpcWork, _Uses | None]] = []
        self.failed = False
        # Held to change the list: the caller's threads, autograd's and the callback runners' may all post.
        self._lock = threading.Lock()

    def works(self) -> list[HpcWork]:
        """The works held, in call order."""
        return [work for work, _ in self.entries]

    def add(self, work: HpcWork, writes: Sequence[torch.Tensor] | None = None,
            reads: Sequence[torch.Tensor] | None = None) -> None:
        """Hold ``work``: a collective with the tensors it writes and reads, a point-to-point op with none."""
        entry = (work, None if writes is None else _Uses(writes, writes if reads is None else reads))
        self._lock.acquire()
        try:
            self._drop_ended()
            self.entries.append(entry)
        finally:
            self._lock.release()

    def forget_ended(self) -> None:
        """Drop the works that have ended, noting in :attr:`failed` whether one of them failed."""
        with self._lock:
            self._drop_ended()

    def _drop_ended(self) -> None:
        live = []
        for entry in self.entries:
            work = entry[0]
            if not work._done:
                live.append(entry)
            elif work._error is not None:
                self.failed = True
        self.entries = live

    def end_overlapping(self, writes: Sequence[torch.Tensor], reads: Sequence[torch.Tensor]) -> None:
        """End, in call order, every collective in flight that the next one must follow.

        That is one that writes memory the next one reads or writes, or reads
        memory it writes. Each is waited for on this thread, within its own
        timeout; one that fails keeps its error for its own ``wait()``, and the
        next collective goes ahead (its peers, which call in the same order,
        get there too).

        Args:
            writes: the tensors the next collective writes.
            reads: those it reads (the same list for an in-place one).
        """
        written: tuple[Extent, ...] | None = None
        read: tuple[Extent, ...] = ()
        stale = False  # a work here has ended: drop it
        for work, uses in self.entries:
            if work._done:
                stale = True
            elif uses is not None:
                if written is None:  # worked out only where something is to be compared
                    written = extents(writes)
                    read = written if reads is writes else extents(reads)
                if uses.clash(written, read):
                    stale = True
                    finish_all((work,))
        if stale:
            self.forget_ended()

    def end_collectives(self, what: str, timeout_s: float | None = None) -> None:
        """End every collective in flight, in call order: a barrier comes after them all, as Gloo's and NCCL's do.

        Args:
            what: the operation that waits, for the error.
            timeout_s: its own timeout (``barrier(timeout=)``), which bounds
                the wait; else each earlier one's own.

        Raises:
            CommTimeoutError: an earlier collective had not ended within ``timeout_s``.
        """
        late = finish_all([work for work, uses in self.entries if uses is not None], timeout_s)
        if late is not None:
            waited = late._timeout_s if timeout_s is None else timeout_s
            raise CommTimeoutError(
                f"hpccomm {what}: Timed out waiting {max(1, round(waited * 1000))}ms for the group's earlier "
                f"collective {describe(late._label)} to end (a barrier ends after them)"
            )
        self.forget_ended()

    def clear(self) -> list[HpcWork]:
        """Forget every work (the group has ended); returns those not ended, noting in :attr:`failed` a failed one."""
        with self._lock:
            self._drop_ended()
            works = self.works()
            self.entries = []
        return works
