"""A group's CPU transport: per collective, flat MPI, shared memory on a node, or the hierarchy.

:func:`cpu_transport` builds it when a group is created (collectively, on every
member): from the group's :class:`~hpccomm.topology.Topology` it sets up what
applies, a shared-memory channel when all ranks share a node, or a channel per
node plus an inter-node communicator when the group spans nodes with the same
number (two or more) of ranks on each. Where neither applies, or with
``HPCCOMM_ALGO=flat``, it is plain :class:`~hpccomm.transports.mpi.MPITransport`.

Each collective then compares its size with its threshold from the
:class:`~hpccomm.transports.collective_paths.Selector`; below it, or where the
topology-aware path cannot take the call (see :mod:`hpccomm.transports.node`
and :mod:`hpccomm.transports.hierarchical`), the flat MPI transport runs it.
Everything else (gather, scatter, all-to-all, point-to-point, barrier) is
always flat.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from ..config import settings
from ..topology import of_world_ranks
from ..work import Pending
from ..world import mpi
from . import Transport
from .collective_paths import FLAT, HIER, NODE, Selector
from .hierarchical import Hierarchy
from .mpi import MPITransport
from .mpi_types import Reduction
from .node import NodeCollectives
from .shm import SharedMemoryChannel


def cpu_transport(comm: Any, global_ranks: Sequence[int]) -> Transport:
    """The transport for a new group's CPU tensors. Collective over ``comm``.

    Args:
        comm: the group's communicator (owned by the transport).
        global_ranks: the world rank of each group rank.
    """
    topo = of_world_ranks(global_ranks)
    flat = MPITransport(comm)
    if settings.algo == FLAT:
        return flat  # no segment nor communicators that no call would use
    if topo.num_nodes == 1:
        channel = SharedMemoryChannel.create(comm)
        if channel is None:
            return flat
        selector = Selector(NODE, stream_min_bytes=channel.stream_min_bytes)
        return TopologyAwareTransport(flat, selector, NodeCollectives(channel))
    if not topo.uniform or topo.local_size < 2:
        return flat
    node_comm = comm.Split(topo.node, topo.local_rank)
    inter = comm.Split(topo.local_rank, topo.node)
    channel = SharedMemoryChannel.create(node_comm)
    node_comm.Free()
    # Every node decides alone whether its segment mapped: agree before any collective relies on it.
    everywhere = comm.allreduce(channel is not None, op=mpi().LAND)
    if not everywhere:
        if channel is not None:
            channel.close()
        inter.Free()
        return flat
    return TopologyAwareTransport(flat, Selector(HIER), Hierarchy(topo, channel, inter))


class TopologyAwareTransport(Transport):
    """Flat MPI plus one topology-aware path, chosen per collective by size.

    Args:
        flat: the group's MPI transport.
        selector: the thresholds, for :attr:`~Selector.path` (``node`` or ``hier``).
        aware: the path's collectives (:class:`NodeCollectives` or
            :class:`Hierarchy`), each returning a Pending or None.
    """

    def __init__(self, flat: MPITransport, selector: Selector, aware: NodeCollectives | Hierarchy) -> None:
        self.flat = flat
        self.aware = aware
        self.selector = selector
        #: How many collectives took the topology-aware path, per op name (for tests and tuning).
        self.taken: Counter[str] = Counter()

    @property
    def selector(self) -> Selector:
        """The thresholds in force (replaceable, e.g. by a benchmark comparing paths)."""
        return self._selector

    @selector.setter
    def selector(self, selector: Selector) -> None:
        self._selector = selector
        # Read once here, so that each call's check is one attribute read.
        self._allreduce_min = selector.min_bytes("all_reduce")
        self._reduce_min = selector.min_bytes("reduce")
        self._broadcast_min = selector.min_bytes("broadcast")
        self._allgather_min = selector.min_bytes("all_gather")
        self._allgather_into_min = selector.min_bytes("all_gather_into_tensor")
        self._reduce_scatter_min = selector.min_bytes("reduce_scatter")
        self._reduce_scatter_from_min = selector.min_bytes("reduce_scatter_tensor")

    @property
    def path(self) -> str:
        """``node`` or ``hier``: where collectives above their threshold go."""
        return HIER if isinstance(self.aware, Hierarchy) else NODE

    @property
    def channel(self) -> SharedMemoryChannel:
        """The shared-memory channel of this rank's node."""
        return self.aware.channel

    def _taken(self, op: str, pending: Pending | None) -> Pending | None:
        if pending is not None:
            self.taken[op] += 1
        return pending

    def communicators(self) -> list[Any]:
        inter = [self.aware.inter] if isinstance(self.aware, Hierarchy) else []
        return [*self.flat.communicators(), *inter]

    def close(self, in_flight: bool = False) -> None:
        self.aware.close(in_flight)
        self.flat.close(in_flight)

    # -- the collectives with a topology-aware path ---------------------------------

    def allreduce(self, tensors: Sequence[torch.Tensor], reduction: Reduction) -> Pending:
        if len(tensors) == 1 and tensors[0].nbytes >= self._allreduce_min:
            posted = self.aware.allreduce(tensors, reduction)
            if posted is not None:
                self.taken["all_reduce"] += 1
                return posted
        return self.flat.allreduce(tensors, reduction)

    def broadcast(self, tensor: torch.Tensor, root: int) -> Pending:
        if tensor.nbytes >= self._broadcast_min:
            posted = self._taken("broadcast", self.aware.broadcast(tensor, root))
            if posted is not None:
                return posted
        return self.flat.broadcast(tensor, root)

    def reduce(self, tensor: torch.Tensor, root: int, reduction: Reduction) -> Pending:
        # A hier selector's reduce threshold is NEVER: a Hierarchy has no reduce.
        if tensor.nbytes >= self._reduce_min:
            posted = self._taken("reduce", self.aware.reduce(tensor, root, reduction))
            if posted is not None:
                return posted
        return self.flat.reduce(tensor, root, reduction)

    def allgather(self, outputs: Sequence[torch.Tensor], tensor: torch.Tensor) -> Pending:
        if sum(out.nbytes for out in outputs) >= self._allgather_min:
            posted = self._taken("all_gather", self.aware.allgather(outputs, tensor))
            if posted is not None:
                return posted
        return self.flat.allgather(outputs, tensor)

    def allgather_into(self, output: torch.Tensor, tensor: torch.Tensor) -> Pending:
        if output.nbytes >= self._allgather_into_min:
            posted = self._taken("all_gather_into_tensor", self.aware.allgather_into(output, tensor))
            if posted is not None:
                return posted
        return self.flat.allgather_into(output, tensor)

    def reduce_scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor], reduction: Reduction) -> Pending:
        if sum(t.nbytes for t in inputs) >= self._reduce_scatter_min:
            posted = self._taken("reduce_scatter", self.aware.reduce_scatter(output, inputs, reduction))
            if posted is not None:
                return posted
        return self.flat.reduce_scatter(output, inputs, reduction)

    def reduce_scatter_from(self, output: torch.Tensor, tensor: torch.Tensor, reduction: Reduction) -> Pending:
        if tensor.nbytes >= self._reduce_scatter_from_min:
            posted = self._taken("reduce_scatter_tensor", self.aware.reduce_scatter_from(output, tensor, reduction))
            if posted is not None:
                return posted
        return self.flat.reduce_scatter_from(output, tensor, reduction)

    # -- always flat ----------------------------------------------------------------

    def gather(self, outputs: Sequence[torch.Tensor] | None, tensor: torch.Tensor, root: int) -> Pending:
        return self.flat.gather(outputs, tensor, root)

    def scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor] | None, root: int) -> Pending:
        return self.flat.scatter(output, inputs, root)

    def alltoall(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> Pending:
        return self.flat.alltoall(outputs, inputs)

    def alltoall_single(
        self, output: torch.Tensor, tensor: torch.Tensor, output_counts: Sequence[int], input_counts: Sequence[int]
    ) -> Pending:
        return self.flat.alltoall_single(output, tensor, output_counts, input_counts)

    def barrier(self) -> Pending:
        return self.flat.barrier()

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> Pending:
        return self.flat.send(tensor, peer, tag)

    def recv(self, tensor: torch.Tensor, peer: int | None, tag: int) -> Pending:
        return self.flat.recv(tensor, peer, tag)
