"""The device seam: the few stream, event and copy operations a device transport orders its work with.

A CUDA collective must not read its tensors before the work the caller queued
on its stream has produced them, and must not let the caller's stream read
the results before they have landed. The transports that move device tensors
(:mod:`hpccomm.transports.host_staged`) express that ordering through
:class:`DeviceOps` alone: record an event on a stream, make a stream wait on
an event, ask whether an event has completed, copy on a stream. Two streams
keep the two directions apart: the gate stream waits for the caller's stream
before it reads an operation's inputs (or starts a triggered collective); the
side stream, which never waits for the caller, lands the results. Were they
one, an operation's results would land only after the inputs of every
operation called after it, and so after the caller's kernels queued in
between. Every group on a device shares its two (:class:`CudaOps`).
Everything that decides *when* to do which lives in the transport and is
tested on the CPU with an implementation of this seam made for tests
(``tests/fake_device.py``); :class:`CudaOps`, the real one, is a thin layer
over ``torch.cuda`` and runs only where a GPU does.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch


class DeviceOps(Protocol):
    """Stream-ordered operations on one device.

    Streams and events are opaque handles: only the same DeviceOps uses them.
    """

    def current_stream(self) -> Any:
        """The stream the calling thread queues its work on."""

    def side_stream(self) -> Any:
        """The stream a transport lands results on (copies back, local steps), apart from the caller's.

        It never waits for the caller's stream: what it runs waits only for
        communication that has ended.
        """

    def gate_stream(self) -> Any:
        """The stream that waits for the caller's stream before a transport reads an operation's inputs."""

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

    def call_on(self, stream: Any, queue_work: Callable[[], None]) -> None:
        """Run ``queue_work`` (which queues device work: copies, kernels) with ``stream`` current."""

    def bind_thread(self) -> None:
        """Make the device, and its context, current on the calling thread (checked, once per thread).

        A library that touches device memory from the calling thread (UCX inside
        UCC, on hpccomm's progress thread) needs the device's context there.
        """

    def check_can_stage(self, op: str) -> None:
        """Raise a clear error where staging cannot run now (e.g. during CUDA graph capture)."""

    def keep_out_of_captures(self) -> None:
        """Let no CUDA graph another thread captures refuse the calling thread's device calls, nor break for them.

        Run once on each of hpccomm's own threads (:mod:`hpccomm.own_threads`),
        never on the caller's: its stream-capture mode becomes thread-local.
        """


class CudaOps:
    """:class:`DeviceOps` on one CUDA device, through ``torch.cuda``.

    Args:
        device: the CUDA device whose tensors this group moves.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # torch.cuda parses a device index faster than a torch.device: these calls are per operation.
        self._index = device.index
        pair = _streams.get(self._index)
        if pair is None:
            pair = _streams[self._index] = (torch.cuda.Stream(device=device), torch.cuda.Stream(device=device))
        self._gate, self._side = pair
        self._bound = threading.local()

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self._index)

    def side_stream(self) -> Any:
        return self._side

    def gate_stream(self) -> Any:
        return self._gate

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
        if pairs:
            self.call_on(stream, lambda: [dst.copy_(src, non_blocking=True) for dst, src in pairs])

    def call_on(self, stream: Any, queue_work: Callable[[], None]) -> None:
        # set_stream rather than `with torch.cuda.stream(...)`, which also looks up the current
        # device and its stream: 2.9-3.1 us against 8.8-9.4 us a switch (H200, torch 2.11); a 4-byte
        # staged all_reduce went from 77 to 59 us (benchmarks/cuda_staging_floor.py).
        previous = torch.cuda.current_stream(self._index)
        torch.cuda.set_stream(stream)
        try:
            queue_work()
        finally:
            torch.cuda.set_stream(previous)

    def bind_thread(self) -> None:
        if getattr(self._bound, "done", False):
            return
        torch.cuda.set_device(self._index)
        # torch.cuda.set_device does nothing where the runtime already reports the device
        # current, which a fresh thread does for device 0 without any context: make the
        # primary context current through the driver, as ProcessGroupUCC does.
        _bind_primary_context(self._index)
        self._bound.done = True

    @staticmethod
    def keep_out_of_captures() -> None:
        # torch.cuda.graph captures in "global" mode unless told otherwise: any other thread of the process
        # still in that mode is then refused an event query or a pinned allocation, and the capture breaks.
        # The mode is the thread's, whatever its device (static: one setup for every group and device).
        mode = ctypes.c_int(_CAPTURE_MODE_THREAD_LOCAL)
        _driver_call("cuThreadExchangeStreamCaptureMode", ctypes.byref(mode))

    def check_can_stage(self, op: str) -> None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"hpccomm {op}: CUDA tensors cannot be communicated inside CUDA graph capture (hpccomm's "
                "CUDA paths wait on the host for the caller's stream; the staged one allocates pinned memory); "
                "run this collective outside the graph"
            )


#: Per CUDA device index, the gate and side streams every group on it shares: taken once (streams are cheap to
#: keep, costly to make per call) from torch's pool, which hands its 32 streams a device in turn to every
#: ``torch.cuda.Stream()`` of the process. Two per group wrapped around it from the 17th group on, one group's
#: side stream then another's gate stream, which waits for its caller.
_streams: dict[int, tuple[Any, Any]] = {}

_driver: Any = None

#: ``CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`` (cuda.h): only the thread's own captures restrict its calls.
_CAPTURE_MODE_THREAD_LOCAL = 1


def _bind_primary_context(index: int) -> None:
    """Make device ``index``'s primary context current on this thread, and check it is.

    Raises:
        RuntimeError: the driver refused, or another device's context is current.
    """
    device = ctypes.c_int()
    _driver_call("cuDeviceGet", ctypes.byref(device), index)
    current = ctypes.c_void_p()
    _driver_call("cuCtxGetCurrent", ctypes.byref(current))
    if not current.value:
        _driver_call("cuDevicePrimaryCtxRetain", ctypes.byref(current), device)
        _driver_call("cuCtxSetCurrent", current)
    ordinal = ctypes.c_int()
    _driver_call("cuCtxGetDevice", ctypes.byref(ordinal))
    if ordinal.value != device.value:
        raise RuntimeError(
            f"hpccomm: thread {threading.current_thread().name} has CUDA device {ordinal.value} current, "
            f"not the group's (cuda:{index})"
        )


def _driver_call(name: str, *args: Any) -> None:
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
    result = getattr(_driver, name)(*args)
    if result != 0:
        raise RuntimeError(f"hpccomm: CUDA driver call {name} failed (CUresult {result})")


def cuda_ops(device: torch.device | None = None) -> CudaOps:
    """The CUDA seam for ``device`` (default: the current CUDA device)."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return CudaOps(device)
