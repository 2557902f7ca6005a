"""CUDA tensors through a CUDA-aware MPI: the MPI transport on device memory, host-gated.

Where the MPI library says it is CUDA-aware (``MPIX_Query_cuda_support()``,
which Open MPI and MPICH export), MPI can read and write device memory
itself, so no copy through host memory is needed. This is the host-gated
path of :mod:`~hpccomm.transports.device_gated` on the MPI transport
(:class:`~hpccomm.transports.mpi.MPITransport`, unchanged): its operations
are built at the call (stand-ins and temporaries on the device, kernels on the
caller's stream), and each nonblocking MPI call they make is deferred
(:class:`GatedComm`) until the caller's stream has produced its buffers, then
made in call order.

bfloat16 and float16 reductions stay on the staged path: hpccomm reduces them
with MPI user-defined operations that run on the host, which a CUDA-aware
MPI would hand device pointers. Everything else, point-to-point included,
goes to MPI on device memory above ``HPCCOMM_CUDA_STAGED_MAX_BYTES``.

Tested without a GPU (``tests/test_mpi_cuda.py``): every operation over real
MPI on host memory, with the tests' simulated device. Neither this project's
test machines nor the lent GPU machine have a CUDA-aware MPI, so it has never
run on device memory.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..work import Pending
from ..world import mpi
from . import Transport, WrappingTransport
from .call_order import CallOrder
from .device_gated import BySize, GatedPending
from .device_ops import DeviceOps
from .mpi import MPITransport

#: Reduced by hpccomm's host-side MPI operations (``half_reduce``): staged at any size.
HOST_REDUCED = frozenset({torch.float16, torch.bfloat16})


def cuda_aware() -> bool:
    """Whether the MPI library loaded here moves CUDA device memory (``MPIX_Query_cuda_support()``)."""
    try:
        # mpi4py's extension module links libmpi: a lookup through it finds libmpi's symbols.
        query = ctypes.CDLL(mpi().__file__).MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return False
    return bool(query())


class DeferredRequest:
    """A nonblocking MPI call made once the caller's stream has produced its buffers, then its request.

    A :class:`~hpccomm.transports.call_order.Postable` for the group's
    :class:`CallOrder`, and to the MPI transport an MPI request (``Test``).

    Args:
        call: the communicator's method (``Iallreduce``...).
        args: its arguments.
        ready: an event recorded on the caller's stream after the work that produces the buffers.
        ops: the device the event belongs to.
        order: the queue that posts it.
    """

    __slots__ = ("_call", "_args", "_ready", "_ops", "_order", "_request", "_error")

    def __init__(self, call: Callable[..., Any], args: tuple[Any, ...], ready: Any, ops: DeviceOps,
                 order: CallOrder) -> None:
        self._call = call
        self._args: tuple[Any, ...] | None = args
        self._ready = ready
        self._ops = ops
        self._order = order
        self._request: Any = None
        self._error: Exception | None = None

    def ready(self) -> bool:
        return self._ops.query(self._ready)

    def post(self) -> None:
        try:
            self._request = self._call(*self._args)
        except Exception as exc:  # kept for Test: the queue must move on
            self._error = exc
        self._args = None

    def Test(self, status: Any = None) -> bool:  # noqa: N802 (an MPI request's name)
        """False until posted; then the request's own ``Test``. Raises the post's error."""
        if self._request is None and self._error is None:
            self._order.post_ready()
        if self._error is not None:
            raise self._error
        if self._request is None:
            return False
        return self._request.Test(status) if status is not None else self._request.Test()


class GatedComm:
    """The group's communicator as the MPI transport sees it: nonblocking calls deferred behind the caller's stream.

    Every ``I*`` method (``Iallreduce``, ``Isend``...) returns a
    :class:`DeferredRequest` queued in ``order``; everything else is the
    communicator's own.

    Args:
        comm: the communicator (owned by the transport, which frees it).
        ops: the device's streams and events.
        order: the queue that posts the calls.
    """

    def __init__(self, comm: Any, ops: DeviceOps, order: CallOrder) -> None:
        self._comm = comm
        self._ops = ops
        self._order = order

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._comm, name)
        if name.startswith("I") and callable(attribute):
            return lambda *args: self._defer(attribute, args)
        return attribute

    def _defer(self, call: Callable[..., Any], args: tuple[Any, ...]) -> DeferredRequest:
        ops = self._ops
        request = DeferredRequest(call, args, ops.record(ops.current_stream()), ops, self._order)
        self._order.add(request)
        return request


class MPICudaTransport(WrappingTransport):
    """The MPI transport on CUDA memory, each MPI call posted host-gated (the module docstring).

    Args:
        comm: the group's communicator (owned).
        ops: the device's streams and events.
        device: the group's device (host memory for the tests' simulated device).
    """

    def __init__(self, comm: Any, ops: DeviceOps, device: torch.device) -> None:
        self.ops = ops
        #: MPI calls made at the call and waiting for the caller's stream, posted in call order.
        self.order = CallOrder()
        super().__init__(MPITransport(GatedComm(comm, ops, self.order), device))

    def _post(self, op: str, *args: Any) -> Pending:
        self.ops.check_can_stage(op)
        self.ops.bind_thread()
        inner = getattr(self.inner, op)(*args)
        return GatedPending(self.order, self.order.queued, self.ops, inner)

    def communicators(self) -> list[Any]:
        return []  # the gated communicator stands in for the real one: fault-tolerant mode is CPU only

    def close(self, in_flight: bool = False) -> None:
        # A call still queued counts as in flight: its communicator is not freed under it.
        self.inner.close(in_flight or len(self.order) > 0)


def cuda_transport(
    comm: Any, staged: Transport, ops: DeviceOps, device: torch.device, staged_max_bytes: int | Mapping[str, int | None],
) -> BySize:
    """The group's CUDA transport on a CUDA-aware MPI, host memory up to ``staged_max_bytes``.

    Args:
        comm: a communicator of the group's (handed over).
        staged: the group's host-staged transport (handed over).
        ops: the device's streams and events.
        device: the group's device.
        staged_max_bytes: per collective, or one for all (:func:`hpccomm.config.cuda_staged_limits`; measured
            for UCC: no GPU run has timed this path).
    """
    on_device = MPICudaTransport(comm, ops, device)
    return BySize(staged, on_device, staged_max_bytes, host_reduced=HOST_REDUCED, p2p_on_device=True)
