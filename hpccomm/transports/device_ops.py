"""The device seam: the few stream, event and copy operations a device transport orders its work with.

A CUDA collective must not read its tensors before the work the caller queued
on its stream has produced them, and must not let the caller's stream read
the results before they have landed. The transports that move device tensors
(:mod:`hpccomm.transports.host_staged`) express that ordering through
:class:`DeviceOps` alone: record an event on a stream, make a stream wait on
an event, ask whether an event has completed, copy on a stream. Everything that decides *when* to do which lives in the
transport and is tested on the CPU with an implementation of this seam made
for tests (``tests/fake_device.py``); :class:`CudaOps`, the real one, is a
thin layer over ``torch.cuda`` and runs only where a GPU does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch


class DeviceOps(Protocol):
    """Stream-ordered operations on one device.

    Streams and events are opaque handles: only the same DeviceOps uses them.
    """

    def current_stream(self) -> Any:
        """The stream the calling thread queues its work on."""

    def side_stream(self) -> Any:
        """The stream a transport's copies run on, apart from the caller's."""

    def record(self, stream: Any) -> Any:
        """An event that completes once ``stream`` reaches this point."""

    def wait_event(self, stream: Any, event: Any) -> None:
        """Make ``stream`` wait for ``event``; the host does not block."""

    def query(self, event: Any) -> bool:
        """Whether ``event`` has completed; never blocks."""

    def host_buffer(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous host tensor of ``tensor``'s shape and dtype that copies can overlap with (pinned)."""

    def copy(self, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], stream: Any) -> None:
        """Queue ``dst.copy_(src)`` for each ``(dst, src)`` of ``pairs`` on ``stream``, in order."""

    def check_can_stage(self, op: str) -> None:
        """Raise a clear error where staging cannot run now (e.g. during CUDA graph capture)."""


class CudaOps:
    """:class:`DeviceOps` on one CUDA device, through ``torch.cuda``.

    Args:
        device: the CUDA device whose tensors this group moves.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # torch.cuda parses a device index faster than a torch.device: these calls are per operation.
        self._index = device.index
        # Created once per group: streams are cheap to keep, costly to create per call.
        self._side = torch.cuda.Stream(device=device)

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self._index)

    def side_stream(self) -> Any:
        return self._side

    def record(self, stream: Any) -> Any:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait_event(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def query(self, event: Any) -> bool:
        return event.query()

    def host_buffer(self, tensor: torch.Tensor) -> torch.Tensor:
        # Pinned memory from torch's caching host allocator, which does not hand a block out
        # again until the copies queued on it (non_blocking) have completed.
        return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)

    def copy(self, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], stream: Any) -> None:
        if not pairs:
            return
        # set_stream rather than `with torch.cuda.stream(...)`, which also looks up the current
        # device and its stream: 2.9-3.1 us against 8.8-9.4 us a switch (H200, torch 2.11); a 4-byte
        # staged all_reduce went from 77 to 59 us (benchmarks/cuda_staging_floor.py).
        previous = torch.cuda.current_stream(self._index)
        torch.cuda.set_stream(stream)
        try:
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
        finally:
            torch.cuda.set_stream(previous)

    def check_can_stage(self, op: str) -> None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"hpccomm {op}: the host-staged CUDA path cannot run inside CUDA graph capture "
                "(it allocates pinned memory and waits on the host); run this collective outside the graph"
            )


def cuda_ops(device: torch.device | None = None) -> CudaOps:
    """The CUDA seam for ``device`` (default: the current CUDA device)."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return CudaOps(device)
