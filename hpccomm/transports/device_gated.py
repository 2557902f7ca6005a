"""Device tensors on device memory, each operation posted once the caller's stream has produced its inputs.

The host-gated design (``../shared/CUDA-NOTES.md``, design (a)), shared by UCC
on device memory (:mod:`~hpccomm.transports.ucc_cuda`) and a CUDA-aware MPI
(:mod:`~hpccomm.transports.mpi_cuda`): no kernel of hpccomm's sits on the
caller's streams, and a peer that never arrives becomes a timeout, not a
wedged stream. One operation, in order:

1. on the caller's thread, the transport builds the operation as on host
   memory: its stand-ins and premultiplied inputs are kernels on the caller's
   stream, its temporaries are made on the device; the communication is
   queued, not posted, with an event recorded on the caller's stream after
   that work;
2. once the event has completed, the communication is posted, in call order
   (:class:`~hpccomm.transports.call_order.CallOrder`), whichever thread gets
   there;
3. the library moves the device memory; :class:`GatedPending` polls it;
4. once it has ended, the operation's local steps (copies back from
   stand-ins, AVG's division) are queued on the side stream, and the
   operation completes when they have landed. ``Work.wait()`` therefore
   blocks the host until the results are in place (nothing on a stream stands
   for the end of a communication posted this way). A blocking call ends at
   step 4 with the local steps queued on the caller's own stream, as on the
   staged path.

The tensors and temporaries stay referenced until the communication has
ended and, where the local steps run on the side stream, until those have
landed: torch's caching allocator hands a freed block out again at once to
the stream it was made on (the caller's), whose next kernels would then
overwrite a temporary that a copy still queued on the side stream has yet
to read. Every thread that polls binds the group's device and its
CUDA context first (:meth:`DeviceOps.bind_thread`): hpccomm's progress thread
starts without one, and UCX and CUDA-aware MPIs touch device memory from the
thread that progresses them.

:class:`BySize` puts such a transport beside the staged path
(``HostStagedTransport``): collectives up to their limit (measured on a GPU
per collective, :data:`hpccomm.config.CUDA_STAGED_MAX_BYTES`, or
``HPCCOMM_CUDA_STAGED_MAX_BYTES`` for all), and whatever the device transport
cannot do, go through host memory.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..profiling import path_of
from ..work import Pending
from . import Transport
from .call_order import CallOrder
from .device_ops import DeviceOps
from .mpi_types import Reduction

#: The collectives :class:`BySize` routes by size (the keys of ``HPCCOMM_CUDA_STAGED_MAX_BYTES``'s table).
COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "all_to_all", "reduce_scatter", "reduce", "gather", "scatter")
#: A limit no message reaches: through host memory at every size.
_ALWAYS = sys.maxsize


class GatedPending:
    """One device operation from its post to its results in place (steps 2-4 above).

    Args:
        order: the queue that posts the operation's requests; None where they
            were posted at the call (a triggered post, :mod:`~hpccomm.transports.ucc_cuda`).
        ticket: the queue's ticket of the operation's last request.
        ops: the device's streams and events.
        inner: the operation as the transport made it: ``test`` polls the
            communication, ``finish`` raises its error or runs the local steps
            (kernels: queued on the stream current when it runs).
    """

    def __init__(self, order: CallOrder | None, ticket: int, ops: DeviceOps, inner: Pending) -> None:
        self._order = order
        self._ticket = ticket
        self._ops = ops
        self._inner: Pending | None = inner
        self._landed: Any = None
        #: The operation while its local steps, queued on the side stream, have not landed: what they read.
        self._landing: Pending | None = None
        self._error: BaseException | None = None
        self._source_rank = -1

    @property
    def path(self) -> str:
        """The path that serves it: its device transport's (:mod:`hpccomm.profiling`)."""
        return path_of(self._inner)

    def posted(self) -> bool:
        """Post what is ready; True once the operation's requests have all been posted."""
        self._ops.bind_thread()
        return self._order is None or self._order.reached(self._ticket)

    def test(self) -> bool:
        if self._landed is None:
            if not self._ended():
                return False
            side = self._ops.side_stream()
            self._landing = self._inner
            self._ops.call_on(side, self._finish_inner)
            self._landed = self._ops.record(side)
        if not self._ops.query(self._landed):
            return False
        self._landing = None  # the local steps have run: their temporaries may go back to the allocator
        return True

    def test_inline(self) -> bool:
        """:meth:`test` for a blocking call: done once the local steps are queued on the caller's stream."""
        if not self._ended():
            return False
        self._ops.call_on(self._ops.current_stream(), self._finish_inner)
        return True

    def finish(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    @property
    def source_rank(self) -> int:
        """The sender's rank, for a receive from any source."""
        return getattr(self._inner, "source_rank", self._source_rank)

    def _ended(self) -> bool:
        """True once the communication has been posted and has ended (an error is kept for :meth:`finish`)."""
        self._ops.bind_thread()
        if self._error is not None:
            return True
        if self._order is not None and not self._order.reached(self._ticket):
            return False
        try:
            return self._inner.test()  # type: ignore[union-attr]
        except Exception as exc:  # MPI raises a failed request's error from its test
            self._error = exc
            return True

    def _finish_inner(self) -> None:
        # And with it the tensors, once the steps are queued (on the side stream: once they have landed).
        inner, self._inner = self._inner, None
        if inner is None or self._error is not None:
            return
        self._source_rank = getattr(inner, "source_rank", -1)
        try:
            inner.finish()
        except Exception as exc:
            self._error = exc


class BySize(Transport):
    """Device collectives up to a limit per collective through host memory, larger ones on device memory.

    Every rank must choose the same path for one operation, so each choice
    rests on a size every rank sees alike: the tensor of an all-reduce,
    broadcast, reduce, gather or scatter, the (common) output of an all-gather
    or input of a reduce-scatter. An all-to-all has no such size (even one
    rank's pieces all of one size say nothing of another rank's), so its path
    is the same at every size: device memory, unless its limit is None
    (through host memory). Barriers go through host memory; point-to-point as
    ``p2p_on_device`` says.

    Args:
        staged: the host-staged transport (owned: closed here).
        device: the transport on device memory (owned).
        limits: the largest message that goes through host memory, one for
            every collective, or per collective as
            :func:`hpccomm.config.cuda_staged_limits` gives them (None: every size).
        host_reduced: dtypes whose reductions go through host memory at any
            size (the device transport cannot reduce them there).
        p2p_on_device: send and receive on ``device`` (else through host memory).
    """

    def __init__(
        self, staged: Transport, device: Transport, limits: int | Mapping[str, int | None],
        host_reduced: frozenset[torch.dtype] = frozenset(), p2p_on_device: bool = False,
    ) -> None:
        self.staged = staged
        self.device = device
        chosen = dict.fromkeys(COLLECTIVES, limits) if isinstance(limits, int) else limits
        #: Per collective, the largest message through host memory (sys.maxsize: every size).
        self.limits = {name: _ALWAYS if chosen.get(name) is None else chosen[name] for name in COLLECTIVES}
        self._limit = self.limits["all_reduce"]  # read directly on the hottest path
        self._all_to_all = staged if self.limits["all_to_all"] == _ALWAYS else device
        self._host_reduced = host_reduced
        self._p2p = device if p2p_on_device else staged

    def _by(self, collective: str, nbytes: int, reduced: torch.dtype | None = None) -> Transport:
        if nbytes <= self.limits[collective] or reduced in self._host_reduced:
            return self.staged
        return self.device

    def allreduce(self, tensors: Sequence[torch.Tensor], reduction: Reduction) -> Pending:
        # One tensor's size read directly: sum() over a generator cost 4.2k of BySize's 4.5k instructions.
        nbytes = tensors[0].nbytes if len(tensors) == 1 else sum(t.nbytes for t in tensors)
        if nbytes <= self._limit or tensors[0].dtype in self._host_reduced:  # _by, written out on the hottest path
            return self.staged.allreduce(tensors, reduction)
        return self.device.allreduce(tensors, reduction)

    def broadcast(self, tensor: torch.Tensor, root: int) -> Pending:
        return self._by("broadcast", tensor.nbytes).broadcast(tensor, root)

    def reduce(self, tensor: torch.Tensor, root: int, reduction: Reduction) -> Pending:
        return self._by("reduce", tensor.nbytes, tensor.dtype).reduce(tensor, root, reduction)

    def allgather(self, outputs: Sequence[torch.Tensor], tensor: torch.Tensor) -> Pending:
        return self._by("all_gather", tensor.nbytes * len(outputs)).allgather(outputs, tensor)

    def allgather_into(self, output: torch.Tensor, tensor: torch.Tensor) -> Pending:
        return self._by("all_gather", output.nbytes).allgather_into(output, tensor)

    def gather(self, outputs: Sequence[torch.Tensor] | None, tensor: torch.Tensor, root: int) -> Pending:
        return self._by("gather", tensor.nbytes).gather(outputs, tensor, root)

    def scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor] | None, root: int) -> Pending:
        return self._by("scatter", output.nbytes).scatter(output, inputs, root)

    def reduce_scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor], reduction: Reduction) -> Pending:
        return self._by("reduce_scatter", sum(t.nbytes for t in inputs), output.dtype).reduce_scatter(
            output, inputs, reduction
        )

    def reduce_scatter_from(self, output: torch.Tensor, tensor: torch.Tensor, reduction: Reduction) -> Pending:
        return self._by("reduce_scatter", tensor.nbytes, tensor.dtype).reduce_scatter_from(output, tensor, reduction)

    def alltoall(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> Pending:
        return self._all_to_all.alltoall(outputs, inputs)

    def alltoall_single(
        self, output: torch.Tensor, tensor: torch.Tensor, output_counts: Sequence[int], input_counts: Sequence[int]
    ) -> Pending:
        return self._all_to_all.alltoall_single(output, tensor, output_counts, input_counts)

    def barrier(self) -> Pending:
        return self.staged.barrier()

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> Pending:
        return self._p2p.send(tensor, peer, tag)

    def recv(self, tensor: torch.Tensor, peer: int | None, tag: int) -> Pending:
        return self._p2p.recv(tensor, peer, tag)

    def communicators(self) -> list[Any]:
        return [*self.staged.communicators(), *self.device.communicators()]

    def close(self, in_flight: bool = False) -> None:
        self.device.close(in_flight)
        self.staged.close(in_flight)
