"""A device for tests: streams and events simulated on the CPU, for the DeviceOps seam.

``FakeDevice`` implements :class:`hpccomm.transports.device_ops.DeviceOps`
over CPU tensors that stand for device tensors. Each stream is a queue of
tasks (copy, record an event, wait for an event, run a function) that runs in
order whenever the device is asked anything, unless the test holds the stream
(:meth:`FakeDevice.hold`): that is how a test stands for a slow kernel on the
caller's stream, or a slow copy, and checks what hpccomm does meanwhile.

``FakeDevice(late=True)`` is asynchronous, as a GPU is: queuing work or asking
about an event runs nothing, so an event recorded a moment ago has not
completed yet; the streams move only when the test calls :meth:`FakeDevice.run`,
or on their own every ``period_s`` from a thread of the device's
(:meth:`FakeDevice.start`). The host code handed to ``call_on`` runs at once
there, as on a GPU, where it queues its kernels and returns (its tensor
operations, being the CPU's, take effect at once too: only copies, waits and
events queued through the seam are late). Logic that reads an event as
complete just because the host asked (the scratch that held one buffer per
call on an H100, not one per operation in flight) fails here as it failed
there.

The real implementation, :class:`~hpccomm.transports.device_ops.CudaOps`,
runs on a GPU only (tests/gpu).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch


class FakeEvent:
    def __init__(self, name: str) -> None:
        self.name = name
        self.done = False

    def __repr__(self) -> str:
        return f"<event {self.name} {'done' if self.done else 'pending'}>"


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.tasks: deque[tuple[str, Any]] = deque()
        self.held = False


class FakeDevice:
    """Streams ``user`` (the caller's), ``gate`` and ``side`` (the transport's), run on demand.

    Setting ``capture_elsewhere`` stands for a CUDA graph that another thread
    captures in "global" mode: an event query or a pinned allocation from a
    thread not kept apart (:meth:`keep_out_of_captures`) is refused, as CUDA
    refuses it, and the thread is named in ``broken_captures``.

    Args:
        capturing: pretend a CUDA graph is being captured (staging must refuse).
        late: run queued work only on :meth:`run` or from :meth:`start`'s thread, never
            because it was queued or asked about.
    """

    def __init__(self, capturing: bool = False, late: bool = False) -> None:
        self.user = FakeStream("user")
        self.gate = FakeStream("gate")
        self.side = FakeStream("side")
        self._streams = (self.user, self.gate, self.side)
        self.capturing = capturing
        #: What ran, in order: ("copy", stream name), ("call", stream name), ...
        self.trace: list[tuple[str, str]] = []
        self._lock = threading.RLock()
        self._events = 0
        #: The threads that bound the device (:meth:`bind_thread`).
        self.bound_threads: set[int] = set()
        #: Per thread, the stream whose queued function the thread is running: then its current stream.
        self._running = threading.local()
        self.late = late
        #: Another thread is capturing a CUDA graph in "global" mode (``torch.cuda.graph``'s default).
        self.capture_elsewhere = False
        #: The threads refused a call because of it: each broke that capture.
        self.broken_captures: list[str] = []
        #: The threads in thread-local capture mode (:meth:`keep_out_of_captures`).
        self.apart_threads: set[int] = set()

    # -- test controls ------------------------------------------------------------------

    def hold(self, stream: FakeStream) -> None:
        """Stop ``stream`` before its next task, as a long kernel would."""
        stream.held = True

    def release(self, stream: FakeStream) -> None:
        stream.held = False
        self._ran_on_demand()

    def start(self, period_s: float = 0.001) -> None:
        """Run the streams every ``period_s`` from a thread of the device's (for the process's life), as a GPU does."""
        def engine() -> None:
            while True:
                time.sleep(period_s)
                self.run()

        threading.Thread(target=engine, name="fake-device", daemon=True).start()

    def synchronize(self) -> None:
        """Run until every stream is empty, as ``torch.cuda.synchronize()`` waits (a held stream never empties)."""
        while True:
            self.run()
            with self._lock:
                if not any(stream.tasks for stream in self._streams):
                    return
            time.sleep(0.001)

    def wait_for(self, stream: FakeStream) -> None:
        """Block until ``stream`` has run what is queued on it now, as a device allocation waits.

        ``cudaMalloc`` synchronises with the work queued on the legacy default
        stream (CUDA's implicit synchronisation); the caller's stream stands for
        it here. A held or stalled stream keeps the caller waiting.
        """
        event = self.record(stream)
        while not self.query(event):
            if not self.late:
                self.run()
            time.sleep(0.001)

    def stall(self, stream: FakeStream) -> Callable[[], None]:
        """Queue a kernel on ``stream`` that runs until the returned function is called (what was queued before runs)."""
        with self._lock:
            self._events += 1
            finished = FakeEvent(f"long kernel #{self._events}")

        def finish() -> None:
            finished.done = True
            self._ran_on_demand()

        self._queue(stream, ("wait", finished))
        return finish

    def launch(self, stream: FakeStream, fn: Callable[[], None]) -> None:
        """Queue ``fn`` on ``stream`` (a kernel the caller launched)."""
        self._queue(stream, ("call", fn))

    def run(self) -> None:
        """Run every stream as far as it can go."""
        with self._lock:
            moved = True
            while moved:
                moved = False
                for stream in self._streams:
                    while stream.tasks and not stream.held:
                        kind, arg = stream.tasks[0]
                        if kind == "wait" and not arg.done:
                            break
                        stream.tasks.popleft()
                        moved = True
                        if kind == "record":
                            arg.done = True
                        elif kind == "copy":
                            dst, src = arg
                            dst.copy_(src)
                        elif kind == "call":
                            running = getattr(self._running, "stream", None)
                            self._running.stream = stream  # current while it runs, as on a GPU
                            try:
                                arg()
                            finally:
                                self._running.stream = running
                        self.trace.append((kind, stream.name))

    def _queue(self, stream: FakeStream, task: tuple[str, Any]) -> None:
        with self._lock:
            stream.tasks.append(task)
        self._ran_on_demand()

    def _ran_on_demand(self) -> None:
        """Run the streams now, unless the device is late (then only :meth:`run` and its thread do)."""
        if not self.late:
            self.run()

    def _unsafe_during_capture(self, call: str) -> None:
        """Refuse ``call`` as CUDA does while another thread captures in global mode, unless this thread is apart."""
        if self.capture_elsewhere and threading.get_ident() not in self.apart_threads:
            self.broken_captures.append(threading.current_thread().name)
            raise RuntimeError(f"{call}: operation not permitted when stream is capturing (another thread's capture)")

    # -- DeviceOps ------------------------------------------------------------------------

    def current_stream(self) -> FakeStream:
        return getattr(self._running, "stream", None) or self.user

    def side_stream(self) -> FakeStream:
        return self.side

    def gate_stream(self) -> FakeStream:
        return self.gate

    def record(self, stream: FakeStream) -> FakeEvent:
        with self._lock:
            self._events += 1
            event = FakeEvent(f"{stream.name}#{self._events}")
        self._queue(stream, ("record", event))
        return event

    def wait_event(self, stream: FakeStream, event: FakeEvent) -> None:
        self._queue(stream, ("wait", event))

    def query(self, event: FakeEvent) -> bool:
        self._unsafe_during_capture("cudaEventQuery")
        self._ran_on_demand()
        return event.done

    def host_buffer(self, tensor: torch.Tensor) -> torch.Tensor:
        self._unsafe_during_capture("cudaHostAlloc")
        return torch.empty(tensor.shape, dtype=tensor.dtype)

    def copy(self, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], stream: FakeStream) -> None:
        for dst, src in pairs:
            self._queue(stream, ("copy", (dst, src)))

    def call_on(self, stream: FakeStream, queue_work: Callable[[], None]) -> None:
        if not self.late:
            self._queue(stream, ("call", queue_work))
            return
        running = getattr(self._running, "stream", None)
        self._running.stream = stream
        try:
            queue_work()
        finally:
            self._running.stream = running

    def bind_thread(self) -> None:
        self.bound_threads.add(threading.get_ident())

    def keep_out_of_captures(self) -> None:
        self.apart_threads.add(threading.get_ident())

    def check_can_stage(self, op: str) -> None:
        if self.capturing:
            raise RuntimeError(f"hpccomm {op}: the host-staged CUDA path cannot run inside CUDA graph capture")
