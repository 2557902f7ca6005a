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
it until it has ended, the copy back until it has run) and the event
recorded after its copy back has completed; operations in flight at the same
time (DDP's buckets) each get a buffer of their own.
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

    __slots__ = ("storage", "user", "copied")

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.storage = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.user: weakref.ref[torch.Tensor] | None = None
        self.copied: Any = None


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

    def take(self, target: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
        """A buffer for a reduction into ``target``, and the local step that copies it back there.

        The buffer is a flat tensor of ``target``'s dtype and element count that
        no operation in flight uses: the smallest free one that fits; else the
        largest free one is replaced by a larger one; else a new one is made.
        The step queues ``target.copy_(buffer)`` on the stream current when it
        runs, then an event after which the buffer is free again.

        Args:
            target: the caller's contiguous tensor the reduction is for.
        """
        nbytes = target.nbytes
        with self._lock:
            free = [buffer for buffer in self._buffers if self._is_free(buffer)]
            fits = [buffer for buffer in free if buffer.storage.numel() >= nbytes]
            if fits:
                buffer = min(fits, key=lambda b: b.storage.numel())
            else:
                if free:  # too small for this message: its memory goes back to torch's allocator
                    self._buffers.remove(max(free, key=lambda b: b.storage.numel()))
                buffer = _Buffer(-(-nbytes // GRANULE) * GRANULE, self._device)
                self._buffers.append(buffer)
            out = buffer.storage[:nbytes].view(target.dtype)
            buffer.user = weakref.ref(out)
            buffer.copied = None

        def copy_back() -> None:
            target.copy_(out.view(target.shape))
            copied = self._ops.record(self._ops.current_stream())
            with self._lock:
                buffer.copied = copied

        return out, copy_back

    def _is_free(self, buffer: _Buffer) -> bool:
        if buffer.user is not None and buffer.user() is not None:
            return False
        return buffer.copied is None or self._ops.query(buffer.copied)

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
