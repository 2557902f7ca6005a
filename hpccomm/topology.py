"""Where the ranks of a group run, and the groups and meshes that follow from it.

Every world rank's node is learnt once, when MPI starts
(:func:`hpccomm.world.nodes`), so the layout of any group follows from its
members' world ranks with no communication:

* :func:`topology` describes a group: the node of each rank, local ranks,
  ranks per node, node leaders, whether every node holds as many ranks;
* :func:`node_group` and :func:`leaders_group` return (cached) torch process
  groups of this rank's node and of the node leaders;
* :func:`init_device_mesh` returns a 2-D DeviceMesh ``("node", "local")`` for
  HSDP: ``fully_shard(model, mesh=mesh)`` then shards within a node and
  replicates across nodes.

The transports use the same :class:`Topology` to split a group into node-local
and inter-node stages (:mod:`hpccomm.transports.hierarchical`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
import torch.distributed as dist

from . import world

_log = logging.getLogger("hpccomm")


@dataclass(frozen=True)
class Topology:
    """The node layout of one group, seen from one of its ranks.

    Nodes are numbered in the order of their lowest group rank; a rank's local
    rank is its place among the group's ranks on its node, in group-rank order.
    Nothing assumes that a node's ranks are numbered consecutively.

    Attributes:
        rank: this process's rank in the group.
        node_of: the node index of each group rank.
        hosts: the host name of each node.
    """

    rank: int
    node_of: tuple[int, ...]
    hosts: tuple[str, ...]

    @property
    def size(self) -> int:
        """Ranks in the group."""
        return len(self.node_of)

    @property
    def num_nodes(self) -> int:
        """Nodes the group spans."""
        return len(self.hosts)

    @cached_property
    def nodes(self) -> tuple[tuple[int, ...], ...]:
        """The group ranks on each node, in rank order."""
        members: list[list[int]] = [[] for _ in self.hosts]
        for rank, node in enumerate(self.node_of):
            members[node].append(rank)
        return tuple(tuple(m) for m in members)

    @cached_property
    def local_ranks(self) -> tuple[int, ...]:
        """The local rank of each group rank."""
        local = [0] * self.size
        for members in self.nodes:
            for index, rank in enumerate(members):
                local[rank] = index
        return tuple(local)

    @property
    def ranks_per_node(self) -> tuple[int, ...]:
        """How many of the group's ranks each node holds."""
        return tuple(len(members) for members in self.nodes)

    @property
    def leaders(self) -> tuple[int, ...]:
        """The lowest group rank on each node."""
        return tuple(members[0] for members in self.nodes)

    @property
    def uniform(self) -> bool:
        """True when every node holds the same number of the group's ranks."""
        return len(set(self.ranks_per_node)) == 1

    @property
    def node(self) -> int:
        """This rank's node index."""
        return self.node_of[self.rank]

    @property
    def local_rank(self) -> int:
        """This rank's place among the group's ranks on its node."""
        return self.local_ranks[self.rank]

    @property
    def local_size(self) -> int:
        """How many of the group's ranks share this rank's node."""
        return self.ranks_per_node[self.node]

    @property
    def is_leader(self) -> bool:
        """True for the lowest group rank of each node."""
        return self.local_rank == 0

    def rank_at(self, node: int, local_rank: int) -> int:
        """The group rank of ``local_rank`` on ``node``."""
        return self.nodes[node][local_rank]


def of_world_ranks(world_ranks: Sequence[int]) -> Topology:
    """The topology of the group whose rank ``g`` is world rank ``world_ranks[g]``, seen from this process.

    Raises:
        ValueError: this process is not in the group.
    """
    me = world.identity().rank
    if me not in world_ranks:
        raise ValueError(f"hpccomm topology: world rank {me} is not in the group (world ranks {list(world_ranks)})")
    table = world.nodes()
    # Renumber nodes by their lowest group rank.
    order: dict[int, int] = {}
    for world_rank in world_ranks:
        order.setdefault(table.node_of[world_rank], len(order))
    return Topology(
        rank=list(world_ranks).index(me),
        node_of=tuple(order[table.node_of[w]] for w in world_ranks),
        hosts=tuple(table.hosts[node] for node in order),
    )


def topology(group: dist.ProcessGroup | None = None) -> Topology:
    """The node layout of ``group`` (default: the world), seen from this rank.

    Needs no communication. With no group it works before
    ``init_process_group`` too (it starts MPI).

    Args:
        group: any torch process group this rank belongs to, of any backend.

    Raises:
        ValueError: this rank is not a member of ``group``.
    """
    if group is None:
        return of_world_ranks(range(world.identity().world_size))
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError("hpccomm topology: this rank is not a member of the group")
    return of_world_ranks(dist.get_process_group_ranks(group))


# Groups made by node_group / leaders_group: {name: (default group they belong to, group)}.
_groups: dict[str, tuple[Any, Any]] = {}


def node_group() -> dist.ProcessGroup:
    """A process group of the ranks on this rank's node, made once per default group.

    Collective: every rank of the world must call it (torch's ``new_group`` is
    called for every node's group, on every rank, in the same order).
    """
    return _cached("node", lambda: dist.new_subgroups_by_enumeration(list(map(list, topology().nodes)))[0])


def leaders_group() -> Any:
    """A process group of the node leaders (the lowest rank of each node), made once per default group.

    Collective, like :func:`node_group`. On a rank that is not a leader it
    returns what torch's ``new_group`` returns to non-members
    (``GroupMember.NON_GROUP_MEMBER``); ``topology().is_leader`` tells which.
    """
    return _cached("leaders", lambda: dist.new_group(list(topology().leaders)))


def _cached(name: str, make: Any) -> Any:
    if not dist.is_initialized():
        raise RuntimeError(f"hpccomm {name}_group: call dist.init_process_group first")
    default = dist.group.WORLD
    found = _groups.get(name)
    if found is None or found[0] is not default:
        found = (default, make())
        _groups[name] = found
    return found[1]


def init_device_mesh(device_type: str = "cpu") -> Any:
    """A 2-D DeviceMesh ``("node", "local")`` of shape (nodes, ranks per node), for HSDP.

    Row ``i`` holds node ``i``'s ranks, so ``mesh["local"]`` groups the ranks of
    a node (shared memory) and ``mesh["node"]`` the ranks with the same local
    rank on every node; ``fully_shard(model, mesh=mesh)`` shards parameters
    within a node and replicates them across nodes. Built from where ranks
    really run, not from their numbering. Collective over the world.

    For ``"cuda"``, each rank first takes the device its local rank names among
    those it sees (the only one, where Slurm binds one GPU per task through
    ``CUDA_VISIBLE_DEVICES``), and logs the choice once.

    Args:
        device_type: the mesh's device type (``"cpu"`` or ``"cuda"``).

    Raises:
        ValueError: nodes hold different numbers of ranks.
    """
    from torch.distributed.device_mesh import DeviceMesh

    topo = topology()
    if not topo.uniform:
        per_node = ", ".join(f"{host}: {count}" for host, count in zip(topo.hosts, topo.ranks_per_node))
        raise ValueError(
            f"hpccomm init_device_mesh: nodes hold different numbers of ranks ({per_node}); "
            "a (node, local) mesh needs the same number on every node"
        )
    if device_type == "cuda":
        bind_cuda_device(topo.local_rank)
    return DeviceMesh(device_type, torch.tensor(topo.nodes, dtype=torch.int), mesh_dim_names=("node", "local"))


_bound_device: int | None = None


def group_cuda_device() -> torch.device:
    """The CUDA device a new group moves tensors on: the current one if the user chose it, else the local rank's.

    A current device other than ``cuda:0``, or one hpccomm bound already, is
    kept; otherwise :func:`bind_cuda_device` picks ``local_rank % count``.
    Called before the group's device resources are made.
    """
    current = torch.cuda.current_device()
    if current != 0 or _bound_device is not None:
        return torch.device("cuda", current)
    return torch.device("cuda", bind_cuda_device(topology().local_rank))


def bind_cuda_device(local_rank: int) -> int:
    """Make the CUDA device for ``local_rank`` current and return its index; logs the choice once.

    With one visible device (Slurm's per-task binding) that is the one;
    with several, local rank ``r`` takes device ``r % count``.
    """
    global _bound_device
    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    if count == 0:
        raise RuntimeError(f"hpccomm: this rank sees no CUDA device (CUDA_VISIBLE_DEVICES={visible})")
    index = 0 if count == 1 else local_rank % count
    torch.cuda.set_device(index)
    if _bound_device is None:
        _log.info(
            "hpccomm: rank %d (local rank %d) uses cuda:%d of %d visible (CUDA_VISIBLE_DEVICES=%s)",
            world.identity().rank, local_rank, index, count, visible,
        )
    _bound_device = index
    return index
