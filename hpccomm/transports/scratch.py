"""A group's scratch on its device: where UCC writes an in-place reduction, out of place.

UCC's tl/ucp runs an in-place all-reduce on CUDA memory far below its
out-of-place speed: it needs scratch the size of the message, which it cuts
into 1 MiB pipeline fragments from its CUDA memory pool (32x slower at
64 MiB on an H200: ``docs/ucc-cuda.md``). torch's reductions are in place,
so the UCC transport on device memory hands UCC a buffer of this scratch as
the output instead, and queues one copy back into the caller's tensor on
the stream once the collective has ended
(:class:`~hpccomm.transports.ucc_cuda.UCCCudaTransport`).

The buffers come from torch's caching allocator on the group's device (so
``torch.cuda.memory_allocated`` counts them), are reused from call to call,
and go with the group (:meth:`Scratch.close`). A buffer is free again once
nothing holds the tensor :meth:`Scratch.take` gave out (UCC's request keeps
it until it has ended, the copy back until it is queued) and either the
event recorded after its copy back has completed, or its copy back was
queued on the very stream the next operation's gate will be recorded on:
UCC touches the buffer only once that gate has completed, which stream
order puts after the copy back (torch's caching allocator reuses a block
freed on the same stream at once for the same reason). So back-to-back
blocking calls, whose copies back go on the caller's stream, share one
buffer however far the GPU lags; operations in flight at the same time
(DDP's buckets, whose copies back go on the side stream) each get a buffer
of their own. On an H100, before that rule, three blocking 8 MiB
all-reduces held two buffers. A buffer too small for the next message goes
back to torch's allocator only once that cannot hand its memory to a kernel
that runs before the copy back: the allocator gives a freed block at once to
the stream that was current when it was made, so the copy back must have run,
or have been queued on that same stream.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .device_ops import DeviceOps

#: Buffers grow in steps of this many bytes, so that messages of near sizes share one.
GRANULE = 1 << 20


class _Buffer:
    """One allocation: free once its last handed-out tensor is gone and ``copied`` (if any) has completed."""

    __slots__ = ("storage", "made_on", "user", "copied", "copied_on")

    def __init__(self, nbytes: int, device: torch.device, made_on: Any) -> None:
        self.storage = torch.empty(nbytes, dtype=torch.uint8, device=device)
        #: The stream current when it was made: torch's caching allocator hands its memory, once freed, to that one.
        self.made_on = made_on
        self.user: weakref.ref[torch.Tensor] | None = None
        self.copied: Any = None
        #: The stream the copy back was queued on (``copied`` was recorded there).
        self.copied_on: Any = None


class Scratch:
    """Reusable device buffers for one group's out-of-place reductions.

    Args:
        ops: the group's device seam (its events say when a copy back has run).
        device: where the buffers live.
    """

    def __init__(self, ops: DeviceOps, device: torch.device) -> None:
        self._ops = ops
        self._device = device
        self._buffers: list[_Buffer] = []
        # The caller's thread takes buffers while the progress thread's copy backs release them.
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """The bytes the scratch holds now."""
        return sum(buffer.storage.numel() for buffer in self._buffers)

    def take(self, target: torch.Tensor, gate: Any = None) -> tuple[torch.Tensor, Callable[[], None]]:
        """A buffer for a reduction into ``target``, and the local step that copies it back there.

        The buffer is a flat tensor of ``target``'s dtype and element count that
        no operation in flight uses: the smallest free one that fits; else the
        largest free one that can go back to torch's allocator (the module
        docstring) is replaced by a larger one; else a new one is made.
        The step queues ``target.copy_(buffer)`` on the stream current when it
        runs, then an event after which the buffer is free again.

        Args:
            target: the caller's contiguous tensor the reduction is for.
            gate: the stream whose event will gate the operation's first use of
                the buffer (the caller's: the post waits for it, or, triggered,
                the gate stream does): a buffer whose copy back was queued there
                is free at once.
        """
        nbytes = target.nbytes
        with self._lock:
            free = [buffer for buffer in self._buffers if self._is_free(buffer, gate)]
            fits = [buffer for buffer in free if buffer.storage.numel() >= nbytes]
            if fits:
                buffer = min(fits, key=lambda b: b.storage.numel())
            else:
                spent = [buffer for buffer in free if self._can_go(buffer)]
                if spent:  # too small for this message: its memory goes back to torch's allocator
                    self._buffers.remove(max(spent, key=lambda b: b.storage.numel()))
                buffer = _Buffer(-(-nbytes // GRANULE) * GRANULE, self._device, self._ops.current_stream())
                self._buffers.append(buffer)
            out = buffer.storage[:nbytes].view(target.dtype)
            buffer.user = weakref.ref(out)
            buffer.copied = buffer.copied_on = None

        def copy_back() -> None:
            stream = self._ops.current_stream()
            target.copy_(out.view(target.shape))
            copied = self._ops.record(stream)
            with self._lock:
                buffer.copied, buffer.copied_on = copied, stream

        return out, copy_back

    def _is_free(self, buffer: _Buffer, gate: Any = None) -> bool:
        if buffer.user is not None and buffer.user() is not None:
            return False
        if buffer.copied is None or (gate is not None and buffer.copied_on == gate):
            return True  # never copied back (its operation failed), or stream order frees it
        return self._ops.query(buffer.copied)

    def _can_go(self, buffer: _Buffer) -> bool:
        """Whether a free buffer's memory can go back to torch's allocator now, its copy back on the stream or run."""
        return buffer.copied is None or buffer.copied_on == buffer.made_on or self._ops.query(buffer.copied)

    def close(self) -> None:
        """Give the buffers back to torch's allocator, each once it is free.

        A buffer whose copy back has not run yet is kept until it has (the
        allocator could otherwise hand its memory to the caller's stream while
        the side stream still reads it); one whose tensor an operation in flight
        still holds (a request UCC never ended) is kept by that tensor.
        """
        with self._lock:
            buffers, self._buffers = self._buffers, []
        retired = [*_retired, *((self, buffer) for buffer in buffers)]
        _retired[:] = [(owner, buffer) for owner, buffer in retired if not owner._is_free(buffer)]


#: Buffers of closed scratches whose copy back had not run yet, with their scratch (whose device
#: seam reads their events); dropped at a later close once free.
_retired: list[tuple[Scratch, _Buffer]] = []
