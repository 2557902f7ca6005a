"""Hierarchical collectives for a group that spans nodes with several ranks on each.

A group of N nodes x L ranks splits into two kinds of communicators: the
ranks of one node, who share a shared-memory channel
(:mod:`hpccomm.transports.shm`), and the N ranks with the same local rank, one
per node, who share an MPI communicator (``inter``). Every collective then
moves each byte across the network once, and all L local ranks use the
network at the same time, each for its 1/L of the data:

* all-reduce: node-local reduce-scatter (rank l of each node reduces share l
  of the tensor), an inter-node all-reduce of share l among the ranks with
  local rank l, a node-local all-gather of the shares;
* reduce-scatter: node-local reduce-scatter (rank l reduces, over its node,
  the blocks of the N ranks with local rank l), then an inter-node
  reduce-scatter of those N blocks;
* all-gather: an inter-node all-gather among the ranks with the same local
  rank, straight into the output at their ranks' places, then a node-local
  all-gather of those N blocks per rank;
* broadcast: on the root's node a node-local broadcast, then an inter-node
  broadcast of share l from the root's node, then on the other nodes a
  node-local all-gather of the shares.

Ranks need not be numbered node by node: every block goes to its rank's place.
Large messages go in pieces, so one piece's inter-node stage overlaps the next
piece's node-local stage.

Ordering: the node-local stages of every collective are posted on the channel
when the collective is called (so every rank of a node posts them in the same
order); a stage that needs an inter-node result first waits at its gate. The
inter-node stages are MPI nonblocking collectives, which every rank of
``inter`` must post in the same order: they go through an :class:`InterQueue`
in call order and each is posted once its input is ready and all before it
are posted. Everything a hierarchical collective drives (channel stages, MPI
requests) is driven under the channel's lock, so two threads never test one
MPI request at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

import torch

from ..topology import Topology
from ..world import mpi
from .local_steps import After, averager, concat, overlaps, premultiplied, scatter_back, staged, unaliased
from .mpi import INT_MAX, MAX_ELEMENTS_PER_CALL
from .mpi_types import Reduction, datatype
from .shm import SharedMemoryChannel, ShmOp

#: A large collective goes in pieces of at least this many slots of the
#: channel per rank's share (so at least one slot: 4 MiB by default), and at
#: most _MAX_PIECES of them.
_PIECE_SLOTS = 1
_MAX_PIECES = 8


class InterStage:
    """An inter-node MPI collective that is posted when its turn comes and its input is ready.

    Args:
        queue: the queue that posts it.
        ready: True once its input is ready (may drive the stage that makes it).
        post: posts it and returns the MPI request.
    """

    __slots__ = ("_queue", "ready", "_post", "_request")

    def __init__(self, queue: InterQueue, ready: Callable[[], bool], post: Callable[[], Any]) -> None:
        self._queue = queue
        self.ready = ready
        self._post = post
        self._request: Any = None

    def start(self) -> None:
        """Post it (the queue calls this in order)."""
        self._request = self._post()

    def test(self) -> bool:
        """True once it has been posted and has completed."""
        if self._request is None:
            self._queue.pump()
            if self._request is None:
                return False
        return self._request.Test()


class InterQueue:
    """The inter-node stages of a group, posted in the order the collectives were called."""

    def __init__(self) -> None:
        self._stages: deque[InterStage] = deque()

    def add(self, ready: Callable[[], bool], post: Callable[[], Any]) -> InterStage:
        """Queue a stage behind every stage queued before it."""
        stage = InterStage(self, ready, post)
        self._stages.append(stage)
        return stage

    def pump(self) -> None:
        """Post stages from the front while their inputs are ready."""
        stages = self._stages
        while stages and stages[0].ready():
            stages.popleft().start()


def _always() -> bool:
    return True


class HierarchicalPending:
    """A hierarchical collective in flight: done when its last stages are.

    Args:
        channel: the node's channel, whose lock guards every stage.
        queue: the group's inter-node queue, pumped on every test.
        finals: the stages whose completion ends the collective, in order.
        after: local steps once it is done (AVG, copy-back).
        keep: tensors its stages read or write, held until it is done.
    """

    #: The path that serves it, as the profiler names it (:mod:`hpccomm.profiling`).
    path = "hierarchical"

    __slots__ = ("_channel", "_queue", "_finals", "_after", "_keep")

    def __init__(
        self,
        channel: SharedMemoryChannel,
        queue: InterQueue,
        finals: list[ShmOp | InterStage],
        after: After,
        keep: tuple[Any, ...],
    ) -> None:
        self._channel = channel
        self._queue = queue
        self._finals = deque(finals)
        self._after = after
        self._keep = keep

    def test(self) -> bool:
        finals = self._finals
        if not finals:
            return True
        lock = self._channel.lock
        if not lock.acquire(blocking=False):
            return False
        try:
            if self._channel.closed:
                return False  # aborted or shut down: the waiter raises
            self._queue.pump()
            while finals:
                if not finals[0].test():
                    return False
                finals.popleft()
            return True
        finally:
            lock.release()

    def finish(self) -> None:
        for step in self._after:
            step()
        self._keep = ()


def _pieces(count: int, itemsize: int, shares: int, slot_bytes: int) -> int:
    """How many pieces a collective of ``count`` elements goes in, cut into ``shares`` per piece."""
    share_bytes = count * itemsize // shares
    wanted = max(1, min(_MAX_PIECES, share_bytes // (_PIECE_SLOTS * slot_bytes)))
    return max(wanted, -(-count // (shares * MAX_ELEMENTS_PER_CALL)))


def _span(count: int, part: int, parts: int) -> tuple[int, int]:
    """Part ``part`` of ``parts`` of ``count`` elements: (first, length)."""
    first = count * part // parts
    return first, count * (part + 1) // parts - first


class Hierarchy:
    """The hierarchical collectives of one group, on tensors.

    Each method returns the pending collective, or None where this path cannot
    take it (the node's engine does not reduce the dtype/op pair, an element
    does not fit a pipeline buffer, counts past MPI's): nothing was posted then.

    Args:
        topo: the group's topology: the same number of ranks (at least two) on
            every node.
        channel: the channel of the group's ranks on this node (local rank =
            channel rank).
        inter: the communicator of the group's ranks with this rank's local
            rank, one per node, ranked by node.
    """

    def __init__(self, topo: Topology, channel: SharedMemoryChannel, inter: Any) -> None:
        self.channel = channel
        self.inter = inter
        self.queue = InterQueue()
        self._topo = topo
        self._nodes = topo.num_nodes
        self._local_size = topo.local_size
        self._local = topo.local_rank
        self._node = topo.node
        self._size = topo.size
        # Every local rank's ranks, by node; this rank's column is the ranks with its local rank.
        self._columns = [[topo.rank_at(j, k) for j in range(self._nodes)] for k in range(self._local_size)]
        self._column = self._columns[self._local]
        self._fromaddress = mpi().buffer.fromaddress

    def close(self, in_flight: bool = False) -> None:
        """Unmap the channel's segment; free ``inter`` unless MPI may still work on it (``in_flight``).

        As :meth:`MPITransport.close <hpccomm.transports.mpi.MPITransport.close>`.
        """
        self.channel.close()
        if not in_flight:
            self.inter.Free()

    def _buffer(self, address: int, count: int, dtype: torch.dtype) -> list[Any]:
        return [self._fromaddress(address, count * dtype.itemsize), datatype(dtype)]

    def _pending(self, finals: list[Any], after: After, keep: tuple[Any, ...]) -> HierarchicalPending:
        return HierarchicalPending(self.channel, self.queue, finals, after, keep)

    # -- all-reduce ---------------------------------------------------------

    def allreduce(self, tensors: Sequence[torch.Tensor], reduction: Reduction) -> HierarchicalPending | None:
        """All-reduce one tensor in place."""
        if len(tensors) != 1:
            return None
        tensor = tensors[0]
        dtype, channel, L = tensor.dtype, self.channel, self._local_size
        plan = channel.plan(dtype, reduction.kind)
        if plan is None:
            return None
        after: After = []
        work = premultiplied(staged(tensor, after), reduction, in_place=True)
        after[:0] = averager(work, reduction, self._size)
        base, itemsize, count = work.data_ptr(), dtype.itemsize, work.numel()
        pieces = _pieces(count, itemsize, L, channel.slot_bytes)
        in_place, op = mpi().IN_PLACE, reduction.mpi_op

        def shares(p: int) -> list[tuple[int, int]]:
            first, length = _span(count, p, pieces)
            return [(base + (first + lo) * itemsize, n) for lo, n in (_span(length, k, L) for k in range(L))]

        def post_allreduce(address: int, n: int) -> Callable[[], Any]:
            return lambda: self.inter.Iallreduce(in_place, [self._fromaddress(address, n * itemsize), reduction.datatype], op)

        stages: list[InterStage] = []
        finals: list[Any] = []
        for p in range(pieces + 1):
            # Channel order: RS0, RS1, AG0, RS2, AG1, ...: a piece's all-gather
            # waits for its inter-node all-reduce while the next piece reduces.
            if p < pieces:
                blocks = shares(p)
                mine = blocks[self._local]
                scatter = channel.reduce_scatter(plan, blocks, mine[0], keep=(work,))
                stages.append(self.queue.add(scatter.test, post_allreduce(*mine)))
            if p > 0:
                finals.append(channel.allgather(dtype, shares(p - 1), gate=stages[p - 1].test, keep=(work,)))
        return self._pending(finals, after, (work,))

    # -- broadcast -------------------------------------------------------------

    def broadcast(self, tensor: torch.Tensor, root: int) -> HierarchicalPending | None:
        """Copy the root's tensor into everyone's."""
        topo, channel, L = self._topo, self.channel, self._local_size
        dtype = tensor.dtype
        if not channel.fits(dtype, 1):
            return None
        root_node, root_local = topo.node_of[root], topo.local_ranks[root]
        after: After = []
        work = staged(tensor, after, copy_in=topo.rank == root)
        base, itemsize, count = work.data_ptr(), dtype.itemsize, work.numel()
        pieces = _pieces(count, itemsize, L, channel.slot_bytes)
        finals: list[Any] = []
        for p in range(pieces):
            first, length = _span(count, p, pieces)
            shares = [(base + (first + lo) * itemsize, n) for lo, n in (_span(length, k, L) for k in range(L))]
            mine = shares[self._local]

            def post(address: int = mine[0], n: int = mine[1]) -> Any:
                return self.inter.Ibcast(self._buffer(address, n, dtype), root_node)

            if self._node == root_node:
                local = channel.broadcast(work[first : first + length], root_local)
                finals.append(self.queue.add(local.test, post))
            else:
                stage = self.queue.add(_always, post)
                finals.append(channel.allgather(dtype, shares, gate=stage.test, keep=(work,)))
        return self._pending(finals, after, (work,))

    # -- all-gather --------------------------------------------------------------

    def allgather(self, outputs: Sequence[torch.Tensor], tensor: torch.Tensor) -> HierarchicalPending | None:
        """All-gather into a list of outputs (sizes may differ per rank), through one flat buffer."""
        counts = [out.numel() for out in outputs]
        total = sum(counts)
        if not self._gathers(tensor.dtype, total):
            return None
        flat = torch.empty(total, dtype=tensor.dtype)
        offsets = [0, *accumulate(counts)][:-1]
        return self._allgather(flat, offsets, counts, tensor, [scatter_back(flat, outputs)])

    def allgather_into(self, output: torch.Tensor, tensor: torch.Tensor) -> HierarchicalPending | None:
        """All-gather into one output, rank r's tensor at the r-th slice (in place as FSDP2 calls it)."""
        if not self._gathers(tensor.dtype, output.numel()):
            return None
        after: After = []
        out = staged(output, after, copy_in=False)
        count = tensor.numel()
        return self._allgather(out, [r * count for r in range(self._size)], [count] * self._size, tensor, after)

    def _gathers(self, dtype: torch.dtype, total: int) -> bool:
        """Whether :meth:`_allgather` takes an output of ``total`` elements."""
        return total <= INT_MAX and self.channel.fits(dtype, self._nodes)

    def _allgather(
        self, out: torch.Tensor, offsets: list[int], counts: list[int], tensor: torch.Tensor, after: After
    ) -> HierarchicalPending:
        channel, N, column, columns = self.channel, self._nodes, self._column, self._columns
        dtype, itemsize = tensor.dtype, tensor.dtype.itemsize
        me = self._topo.rank
        base = out.data_ptr()
        send: torch.Tensor | None = None
        if not (tensor.is_contiguous() and tensor.data_ptr() == base + offsets[me] * itemsize):
            send = unaliased(tensor.contiguous(), out)
        pieces = _pieces(max(counts), itemsize, 1, channel.slot_bytes)
        finals: list[Any] = []
        for p in range(pieces):
            span = {g: _span(counts[g], p, pieces) for g in range(self._size)}

            def post(p: int = p, span: dict[int, tuple[int, int]] = span) -> Any:
                recv = [self._fromaddress(base, out.nbytes), [span[g][1] for g in column],
                        [offsets[g] + span[g][0] for g in column], datatype(dtype)]
                if send is None:
                    return self.inter.Iallgatherv(mpi().IN_PLACE, recv)
                first, n = span[me]
                return self.inter.Iallgatherv(self._buffer(send.data_ptr() + first * itemsize, n, dtype), recv)

            stage = self.queue.add(_always, post)
            blocks = [(base + (offsets[g] + span[g][0]) * itemsize, span[g][1]) for ranks in columns for g in ranks]
            finals.append(channel.allgather(dtype, blocks, blocks_per_rank=N, gate=stage.test, keep=(out,)))
        return self._pending(finals, after, (out, send))

    # -- reduce-scatter ----------------------------------------------------------

    def reduce_scatter(
        self, output: torch.Tensor, inputs: Sequence[torch.Tensor], reduction: Reduction
    ) -> HierarchicalPending | None:
        """Reduce-scatter from a list of inputs, one per rank (sizes may differ per rank)."""
        counts = [t.numel() for t in inputs]
        plan = self._reducer(output.dtype, reduction, sum(counts))
        if plan is None:
            return None
        send = premultiplied(concat(inputs, output.dtype), reduction, in_place=True)
        offsets = [0, *accumulate(counts)][:-1]
        return self._reduce_scatter(output, plan, send, offsets, counts, reduction)

    def reduce_scatter_from(
        self, output: torch.Tensor, tensor: torch.Tensor, reduction: Reduction
    ) -> HierarchicalPending | None:
        """Reduce-scatter from one input, rank r's share at its r-th slice."""
        plan = self._reducer(output.dtype, reduction, tensor.numel())
        if plan is None:
            return None
        send = premultiplied(tensor.contiguous(), reduction, in_place=False)
        count = output.numel()
        offsets, counts = [r * count for r in range(self._size)], [count] * self._size
        return self._reduce_scatter(output, plan, send, offsets, counts, reduction)

    def _reducer(self, dtype: torch.dtype, reduction: Reduction, total: int) -> Any:
        """The channel's plan for :meth:`_reduce_scatter` of ``total`` input elements, or None where it cannot."""
        if total > INT_MAX or not self.channel.fits(dtype, self._local_size * self._nodes):
            return None
        return self.channel.plan(dtype, reduction.kind)

    def _reduce_scatter(
        self,
        output: torch.Tensor,
        plan: Any,
        send: torch.Tensor,
        offsets: list[int],
        counts: list[int],
        reduction: Reduction,
    ) -> HierarchicalPending:
        topo, channel, N, column, columns = self._topo, self.channel, self._nodes, self._column, self._columns
        dtype, itemsize = output.dtype, output.dtype.itemsize
        after: After = []
        out = staged(output, after, copy_in=False)
        if overlaps(out, send):
            stand_in = torch.empty_like(out)
            after.append(lambda target=out: target.copy_(stand_in))
            out = stand_in
        after[:0] = averager(out, reduction, self._size)
        # This rank's node-reduced blocks (those of its column), piece by piece.
        partial = torch.empty(sum(counts[g] for g in column), dtype=dtype)
        base, partial_at, out_at = send.data_ptr(), partial.data_ptr(), out.data_ptr()
        pieces = _pieces(max(counts), itemsize, 1, channel.slot_bytes)
        finals: list[Any] = []
        for p in range(pieces):
            span = {g: _span(counts[g], p, pieces) for g in range(self._size)}
            blocks = [(base + (offsets[g] + span[g][0]) * itemsize, span[g][1]) for ranks in columns for g in ranks]
            local = channel.reduce_scatter(plan, blocks, partial_at, blocks_per_rank=N, keep=(send, partial))
            recv_counts = [span[g][1] for g in column]
            first = span[topo.rank][0]

            def post(at: int = partial_at, recv_counts: list[int] = recv_counts, first: int = first) -> Any:
                return self.inter.Ireduce_scatter(
                    self._buffer(at, sum(recv_counts), dtype),
                    self._buffer(out_at + first * itemsize, recv_counts[topo.node], dtype),
                    recv_counts,
                    reduction.mpi_op,
                )

            finals.append(self.queue.add(local.test, post))
            partial_at += sum(recv_counts) * itemsize
        return self._pending(finals, after, (send, partial, out))
