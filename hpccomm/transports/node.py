"""Collectives of a group whose ranks all share one node, on tensors, through its shared-memory channel.

The channel (:mod:`hpccomm.transports.shm`) moves and reduces contiguous runs
of elements. Here the transport's arguments become such runs: non-contiguous
tensors go through contiguous stand-ins that are copied back, PREMUL_SUM
multiplies the input first and AVG divides the SUM after, bool reduces as 0/1
bytes, and an output that overlaps the input in a way the engine cannot take
gets a stand-in. Each method returns the pending collective, or None where the
engine cannot do it (16-bit floats without the compiled kernels, a list of
several all-reduce tensors, an element larger than a pipeline buffer): then
nothing was posted and the caller uses MPI.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .local_steps import After, averager, overlaps, premultiplied, staged, unaliased
from .mpi_types import Reduction
from .shm import Block, SharedMemoryChannel, ShmOp


class NodeCollectives:
    """The collectives a :class:`SharedMemoryChannel` runs for a one-node group, on tensors.

    Args:
        channel: the group's channel; its ranks are the group's ranks.
    """

    def __init__(self, channel: SharedMemoryChannel) -> None:
        self.channel = channel
        self._size = channel.size
        self._rank = channel.rank

    def close(self, in_flight: bool = False) -> None:
        """Unmap the channel's segment (local; ``in_flight`` changes nothing here)."""
        self.channel.close()

    def allreduce(self, tensors: Sequence[torch.Tensor], reduction: Reduction) -> ShmOp | None:
        """All-reduce one tensor in place."""
        if len(tensors) != 1:
            return None
        tensor = tensors[0]
        plan = self.channel.plan(tensor.dtype, reduction.kind)
        if plan is None:
            return None
        if reduction.plain and tensor.is_contiguous():
            return self.channel.allreduce(tensor, plan)
        after: After = []
        work = staged(tensor, after)
        premultiplied(work, reduction, in_place=True)
        op = self.channel.allreduce(work, plan)
        op.after = [*averager(work, reduction, self._size), *after]
        return op

    def reduce(self, tensor: torch.Tensor, root: int, reduction: Reduction) -> ShmOp | None:
        """Reduce into the root's tensor; the others' tensors stay as they were."""
        plan = self.channel.plan(tensor.dtype, reduction.kind)
        if plan is None:
            return None
        after: After = []
        if self._rank == root:
            work = premultiplied(staged(tensor, after), reduction, in_place=True)
            after[:0] = averager(work, reduction, self._size)
        else:
            work = premultiplied(tensor.contiguous(), reduction, in_place=False)
        op = self.channel.reduce(work, root, plan)
        op.after = after
        return op

    def broadcast(self, tensor: torch.Tensor, root: int) -> ShmOp | None:
        """Copy the root's tensor into everyone's."""
        if not self.channel.fits(tensor.dtype, 1):
            return None
        after: After = []
        work = staged(tensor, after, copy_in=self._rank == root)
        op = self.channel.broadcast(work, root)
        op.after = after
        return op

    def allgather(self, outputs: Sequence[torch.Tensor], tensor: torch.Tensor) -> ShmOp | None:
        """All-gather into a list of outputs (sizes may differ per rank)."""
        if not self.channel.fits(tensor.dtype, 1):
            return None
        after: After = []
        targets = [staged(out, after, copy_in=False) for out in outputs]
        mine = targets[self._rank]
        source = 0  # in place: this rank's tensor is its own output
        keep: tuple[torch.Tensor, ...] = (*targets,)
        if not (tensor.is_contiguous() and tensor.data_ptr() == mine.data_ptr()):
            send = tensor.contiguous()
            if any(overlaps(send, out) for out in targets):
                send = send.clone()
            source, keep = send.data_ptr(), (*keep, send)
        blocks = [(out.data_ptr(), out.numel()) for out in targets]
        op = self.channel.allgather(tensor.dtype, blocks, source, keep=keep)
        op.after = after
        return op

    def allgather_into(self, output: torch.Tensor, tensor: torch.Tensor) -> ShmOp | None:
        """All-gather into one output, rank r's tensor at the r-th slice (in place as FSDP2 calls it)."""
        if not self.channel.fits(tensor.dtype, 1):
            return None
        after: After = []
        out = staged(output, after, copy_in=False)
        count, nbytes, base = tensor.numel(), tensor.nbytes, out.data_ptr()
        source = 0
        keep: tuple[torch.Tensor, ...] = (out,)
        if not (tensor.is_contiguous() and tensor.data_ptr() == base + self._rank * nbytes):
            send = unaliased(tensor.contiguous(), out)
            source, keep = send.data_ptr(), (out, send)
        blocks = [(base + k * nbytes, count) for k in range(self._size)]
        op = self.channel.allgather(tensor.dtype, blocks, source, keep=keep)
        op.after = after
        return op

    def reduce_scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor], reduction: Reduction) -> ShmOp | None:
        """Reduce-scatter from a list of inputs, one per rank (sizes may differ per rank)."""
        plan = self.channel.plan(output.dtype, reduction.kind)
        if plan is None or not self.channel.fits(output.dtype, self._size):
            return None
        sends = [premultiplied(t.contiguous(), reduction, in_place=False) for t in inputs]
        blocks = [(t.data_ptr(), t.numel()) for t in sends]
        return self._reduce_scatter(output, plan, blocks, sends, reduction)

    def reduce_scatter_from(self, output: torch.Tensor, tensor: torch.Tensor, reduction: Reduction) -> ShmOp | None:
        """Reduce-scatter from one input, rank r's share at its r-th slice."""
        plan = self.channel.plan(output.dtype, reduction.kind)
        if plan is None or not self.channel.fits(output.dtype, self._size):
            return None
        send = premultiplied(tensor.contiguous(), reduction, in_place=False)
        count, base = output.numel(), send.data_ptr()
        blocks = [(base + k * count * send.element_size(), count) for k in range(self._size)]
        return self._reduce_scatter(output, plan, blocks, (send,), reduction)

    def _reduce_scatter(
        self, output: torch.Tensor, plan: Any, blocks: list[Block], inputs: Sequence[torch.Tensor], reduction: Reduction
    ) -> ShmOp:
        after: After = []
        out = staged(output, after, copy_in=False)
        # The engine may write over an input block it has read by then (the
        # output is one of the blocks), not over one it still reads.
        if (out.data_ptr(), out.numel()) not in blocks and any(overlaps(out, t) for t in inputs):
            stand_in = torch.empty_like(out)
            after.append(lambda target=out: target.copy_(stand_in))
            out = stand_in
        after[:0] = averager(out, reduction, self._size)
        op = self.channel.reduce_scatter(plan, blocks, out.data_ptr(), keep=(out, *inputs))
        op.after = after
        return op
