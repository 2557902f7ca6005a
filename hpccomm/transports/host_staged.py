"""Device tensors through host memory: copy out, run the CPU transport, copy back.

The path for CUDA tensors where UCC cannot carry them (not built, or no CUDA in
it) and for small messages, as Gloo moves CUDA tensors. One operation, in
order:

1. the caller's stream records an event, the gate stream waits on it and
   copies the op's input tensors into host buffers (pinned), then records
   ``copied``: the copies never read a tensor before the caller's queued
   work has written it, and the caller's thread does not block;
2. once ``copied`` has completed, the CPU transport (shared memory, MPI) is
   posted on the host buffers. Posts are made in the order the operations were
   called, whichever thread gets there
   (:class:`~hpccomm.transports.call_order.CallOrder`), so every rank posts its
   collectives in one order;
3. once the host communication has completed, the side stream copies the
   results back into the op's output tensors and records ``landed``. The
   side stream waits for nothing of the caller's (the caller's work before
   the call has run by then: ``copied`` came after it), so no kernel the
   caller queues after the call, before a later call's gate, delays it;
4. the operation completes when ``landed`` has: the Work's ``wait()`` and
   future then hand over tensors whose values are in place on any stream.

A blocking call (``async_op=False``) ends sooner, at step 3: its copy back is
queued on the caller's own stream, which then runs the caller's next work
after it, as after NCCL's blocking calls, while the host goes on at once
(:meth:`StagedPending.test_inline`).

The device tensors and host buffers stay referenced until then, so the
caching allocators cannot hand their memory out while a copy still uses it.
The CPU half has a communicator of its own (the group's, duplicated), so
its posting order is independent of the group's CPU-tensor operations.
hpccomm's own threads, which poll the events and queue the copies back, are
kept out of CUDA graphs the caller captures meanwhile
(:meth:`~hpccomm.transports.device_ops.DeviceOps.keep_out_of_captures`).

The ordering is the transport's; the device operations come through the
:class:`~hpccomm.transports.device_ops.DeviceOps` seam, so the logic is
tested on the CPU (``tests/test_host_staged.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import own_threads
from ..work import Pending
from . import Transport
from .call_order import CallOrder
from .device_ops import DeviceOps
from .mpi_types import Reduction

#: Posts the host transport's operation, given the map from a device tensor to its host stand-in.
HostPost = Callable[[Callable[[torch.Tensor], torch.Tensor]], Pending]
#: Posts the host transport's operation on one host buffer (the stand-in of the op's one tensor).
HostPostOne = Callable[[torch.Tensor], Pending]


class StagedPending:
    """One operation on its way through host memory (the four steps of the module docstring).

    Args:
        order: the queue that posts it, in call order.
        ops: the device's streams, events and copies.
        post: posts the host operation, given ``post_arg``.
        post_arg: the stand-ins ``post`` takes: the map from a device tensor to its host
            buffer, or for an operation on one tensor its host buffer.
        keep: what else must stay referenced until the operation ends (the device tensors).
        back: the (device output, host buffer) pairs copied back once the host operation has ended.
        copied: the event after the input copies.
        caller: the stream current on the calling thread when the operation was called.
    """

    #: The path that serves it, as the profiler names it (:mod:`hpccomm.profiling`).
    path = "staged"

    # Slots: made and read on every staged call.
    __slots__ = (
        "_order", "_ops", "_post", "_post_arg", "_keep", "_back", "_copied", "_caller", "_host", "_landed", "_error"
    )

    def __init__(
        self, order: CallOrder, ops: DeviceOps, post: Callable[[Any], Pending], post_arg: Any,
        keep: Any, back: Sequence[tuple[torch.Tensor, torch.Tensor]], copied: Any, caller: Any,
    ) -> None:
        self._order = order
        self._ops = ops
        self._post = post
        self._post_arg = post_arg
        self._keep = keep
        self._back = back
        self._copied = copied
        self._caller = caller
        self._host: Pending | None = None
        self._landed: Any = None
        self._error: BaseException | None = None

    # -- called by the transport's CallOrder, under its lock -----------------------------

    def ready(self) -> bool:
        """Whether the inputs have reached host memory."""
        return self._ops.query(self._copied)

    def post(self) -> None:
        """Post the host operation; an error is kept for :meth:`finish` (the queue must move on)."""
        try:
            self._host = self._post(self._post_arg)
        except Exception as exc:  # e.g. a limit the CPU transport checks when posting
            self._error = exc

    # -- Pending ----------------------------------------------------------------------

    def posted(self) -> bool:
        """Post if ready and still unposted; True once the host operation has been posted (or refused)."""
        if self._host is None and self._error is None:
            self._order.post_ready()
        return self._host is not None or self._error is not None

    def test(self) -> bool:
        if self._landed is not None:
            return self._ops.query(self._landed)
        if not self._host_ended():
            return False
        if self._error is not None:
            return True
        side = self._ops.side_stream()
        self._ops.copy(self._back, side)
        self._landed = self._ops.record(side)
        return self._ops.query(self._landed)

    def test_inline(self) -> bool:
        """:meth:`test` for a blocking call, on the caller's thread: done once the copy back is queued.

        The copy back goes on the caller's current stream, so whatever the
        caller queues next runs after it, as after NCCL's blocking calls; the
        host does not wait for it. The pinned buffers may go then: torch's
        host allocator keeps a block until the copies queued on it are done.
        The stream is the one found current when the call was made: the
        caller's thread is still inside that call, so it is current yet, and
        is not asked for again (``torch.cuda.current_stream`` on a GPU).
        """
        if not self._host_ended():
            return False
        if self._error is None and self._back:
            self._ops.copy(self._back, self._caller)
        return True

    def finish(self) -> None:
        error, self._error = self._error, None
        self._keep = self._back = self._post_arg = ()
        if error is not None:
            raise error

    @property
    def source_rank(self) -> int:
        """The sender's rank, for a receive from any source."""
        return getattr(self._host, "source_rank", -1)

    # -- steps --------------------------------------------------------------------------

    def _host_ended(self) -> bool:
        """Post if still unposted, then test the host operation; True once it has completed or failed."""
        if self._host is None and self._error is None:
            self._order.post_ready()  # may post this one, or fail its post
        if self._error is not None:
            return True
        if self._host is None:
            return False
        try:
            if not self._host.test():
                return False
            self._host.finish()  # the host transport's local steps (AVG's division, copy-backs)
        except Exception as exc:
            self._error = exc
        return True


class HostStagedTransport(Transport):
    """Device tensors moved by a CPU transport through host buffers.

    Args:
        host: the CPU transport that communicates the host buffers; its own
            communicator (posts here follow this transport's order, not the
            group's CPU operations').
        ops: the device's stream, event and copy operations.
    """

    def __init__(self, host: Transport, ops: DeviceOps) -> None:
        self.host = host
        self.ops = ops
        # The progress thread polls this path's events, and copies back, while the caller may capture a graph.
        own_threads.add_setup(ops.keep_out_of_captures)
        #: Operations whose inputs are on their way to host memory, posted in call order.
        self.order = CallOrder()

    def _staged(
        self, op: str, post: HostPost, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]
    ) -> StagedPending:
        """Queue the input copies and the operation (steps 1 and 2)."""
        ops = self.ops
        ops.check_can_stage(op)
        gate, caller = ops.gate_stream(), ops.current_stream()
        ops.wait_event(gate, ops.record(caller))
        stand_ins: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for tensor in (*inputs, *outputs):
            if id(tensor) not in stand_ins:
                stand_ins[id(tensor)] = (tensor, ops.host_buffer(tensor))

        def host_of(tensor: torch.Tensor) -> torch.Tensor:
            return stand_ins[id(tensor)][1]

        if inputs:
            ops.copy([(host_of(tensor), tensor) for tensor in inputs], gate)
        back = [(tensor, host_of(tensor)) for tensor in outputs]
        pending = StagedPending(self.order, ops, post, host_of, stand_ins, back, ops.record(gate), caller)
        self.order.add(pending)
        return pending

    def _staged_one(self, op: str, post: HostPostOne, tensor: torch.Tensor, read: bool, written: bool) -> StagedPending:
        """:meth:`_staged` for an operation on one tensor, which it reads, writes, or both, in place.

        The common case (every all-reduce, broadcast and reduce of one tensor, send
        and receive) without the general path's map from tensor to stand-in, its
        lists and closures; with the copy-back pairs made once, at staging, the
        staged transport's own work for a 4-byte all-reduce went from 24k
        instructions to 11k (callgrind: benchmarks/staged_host_cost.py).
        """
        ops = self.ops
        ops.check_can_stage(op)
        gate, caller = ops.gate_stream(), ops.current_stream()
        ops.wait_event(gate, ops.record(caller))
        host = ops.host_buffer(tensor)
        if read:
            ops.copy([(host, tensor)], gate)
        back = [(tensor, host)] if written else ()
        pending = StagedPending(self.order, ops, post, host, tensor, back, ops.record(gate), caller)
        self.order.add(pending)
        return pending

    # -- the operations: which tensors each reads and writes ---------------------------

    def allreduce(self, tensors: Sequence[torch.Tensor], reduction: Reduction) -> Pending:
        if len(tensors) == 1:
            return self._staged_one("all_reduce", lambda h: self.host.allreduce([h], reduction), tensors[0], True, True)
        return self._staged("all_reduce", lambda h: self.host.allreduce([h(t) for t in tensors], reduction),
                            tensors, tensors)

    def broadcast(self, tensor: torch.Tensor, root: int) -> Pending:
        return self._staged_one("broadcast", lambda h: self.host.broadcast(h, root), tensor, True, True)

    def reduce(self, tensor: torch.Tensor, root: int, reduction: Reduction) -> Pending:
        return self._staged_one("reduce", lambda h: self.host.reduce(h, root, reduction), tensor, True, True)

    def allgather(self, outputs: Sequence[torch.Tensor], tensor: torch.Tensor) -> Pending:
        return self._staged("all_gather", lambda h: self.host.allgather([h(t) for t in outputs], h(tensor)),
                            [tensor], outputs)

    def allgather_into(self, output: torch.Tensor, tensor: torch.Tensor) -> Pending:
        return self._staged("all_gather_into_tensor", lambda h: self.host.allgather_into(h(output), h(tensor)),
                            [tensor], [output])

    def gather(self, outputs: Sequence[torch.Tensor] | None, tensor: torch.Tensor, root: int) -> Pending:
        def post(h: Callable[[torch.Tensor], torch.Tensor]) -> Pending:
            return self.host.gather(None if outputs is None else [h(t) for t in outputs], h(tensor), root)

        return self._staged("gather", post, [tensor], outputs or [])

    def scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor] | None, root: int) -> Pending:
        def post(h: Callable[[torch.Tensor], torch.Tensor]) -> Pending:
            return self.host.scatter(h(output), None if inputs is None else [h(t) for t in inputs], root)

        return self._staged("scatter", post, inputs or [], [output])

    def reduce_scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor], reduction: Reduction) -> Pending:
        return self._staged("reduce_scatter",
                            lambda h: self.host.reduce_scatter(h(output), [h(t) for t in inputs], reduction),
                            inputs, [output])

    def reduce_scatter_from(self, output: torch.Tensor, tensor: torch.Tensor, reduction: Reduction) -> Pending:
        return self._staged("reduce_scatter_tensor",
                            lambda h: self.host.reduce_scatter_from(h(output), h(tensor), reduction),
                            [tensor], [output])

    def alltoall(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> Pending:
        return self._staged("all_to_all",
                            lambda h: self.host.alltoall([h(t) for t in outputs], [h(t) for t in inputs]),
                            inputs, outputs)

    def alltoall_single(
        self, output: torch.Tensor, tensor: torch.Tensor, output_counts: Sequence[int], input_counts: Sequence[int]
    ) -> Pending:
        return self._staged(
            "all_to_all_single",
            lambda h: self.host.alltoall_single(h(output), h(tensor), output_counts, input_counts),
            [tensor], [output],
        )

    def barrier(self) -> Pending:
        # No tensors, but queued like the rest: it must not overtake an operation called before it.
        return self._staged("barrier", lambda h: self.host.barrier(), [], [])

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> Pending:
        return self._staged_one("send", lambda h: self.host.send(h, peer, tag), tensor, True, False)

    def recv(self, tensor: torch.Tensor, peer: int | None, tag: int) -> Pending:
        return self._staged_one("recv", lambda h: self.host.recv(h, peer, tag), tensor, False, True)

    def communicators(self) -> list[Any]:
        return self.host.communicators()

    def close(self, in_flight: bool = False) -> None:
        self.host.close(in_flight)
