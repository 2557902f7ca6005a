"""Which path each collective of a group takes: flat MPI, shared memory on a node, or the hierarchy.

Three paths exist for all-reduce, broadcast, all-gather and reduce-scatter
(reduce has the first two):

* ``flat``: MPI's own collective on the whole group;
* ``node``: the group's ranks all share one node: the shared-memory engine
  (:mod:`hpccomm.transports.node`);
* ``hier``: the group spans nodes with the same number of ranks on each (two
  or more): node-local stages through shared memory around inter-node MPI
  stages among the ranks with the same local rank
  (:mod:`hpccomm.transports.hierarchical`).

A group has at most one of ``node`` and ``hier``; :class:`Selector` decides
between it and ``flat`` by message size, with one threshold per collective,
list and tensor forms apart (the tables below, measured on the machines
named there). The size is the larger of the rank's input and output: the
tensor for all-reduce, broadcast and reduce, the output for all-gather, the
input for reduce-scatter.

``HPCCOMM_ALGO=flat`` keeps every collective on MPI, ``hier`` takes the
topology-aware path at every size, ``auto`` (default) uses the thresholds.
``HPCCOMM_SHM_MIN_BYTES``, when set, replaces every ``node`` threshold.
"""

from __future__ import annotations

from ..config import settings

FLAT, NODE, HIER = "flat", "node", "hier"

#: Never: above any tensor's size.
NEVER = 1 << 62
#: A threshold that is the size from which the shared-memory engine streams
#: results (non-temporal stores): the rank's share of the last-level cache.
STREAMED = -1

#: One node: the smallest message that goes through shared memory, per
#: collective. Measured with benchmarks/topology.py at 2 and 4 ranks (see
#: docs/topology.md): from there the shared-memory path
#: took at most the flat path's time. all_gather_into_tensor copies each byte
#: twice where MPI's all-gather copies it once, and wins only once its output
#: no longer fits the rank's share of the cache, which is where results are
#: streamed (4 MiB at 2 ranks and 2 MiB at 4 here, with an 8 MiB cache; below
#: that it took 0.93-1.47x the flat path's time). The list forms win from the
#: smallest size measured: MPI's list all-gather and reduce-scatter add copies.
NODE_MIN_BYTES: dict[str, int] = {
    "all_reduce": 32 << 10,
    "reduce": 32 << 10,
    "broadcast": 32 << 10,
    "all_gather": 32 << 10,
    "all_gather_into_tensor": STREAMED,
    "reduce_scatter": 32 << 10,
    "reduce_scatter_tensor": 64 << 10,
}

#: Several nodes: the smallest message that takes the hierarchical path.
#: Measured with benchmarks/topology.py on two nodes x 2 ranks (see docs/topology.md).
HIER_MIN_BYTES: dict[str, int] = {
    "all_reduce": 64 << 10,
    "broadcast": 64 << 10,
    "all_gather": 64 << 10,
    "all_gather_into_tensor": 64 << 10,
    "reduce_scatter": 64 << 10,
    "reduce_scatter_tensor": 64 << 10,
}

#: The collectives with a topology-aware path, as the thresholds name them.
OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
       "reduce_scatter_tensor")


class Selector:
    """Per collective, the smallest message that leaves the flat path, and where it goes.

    Args:
        path: the group's topology-aware path: ``node``, ``hier``, or
            ``flat`` where it has none (one rank per node, nodes with
            different rank counts, shared memory off).
        algo: ``auto``, ``flat`` or ``hier`` (default: ``HPCCOMM_ALGO``).
        node_min_bytes: a threshold for every ``node`` collective (default:
            ``HPCCOMM_SHM_MIN_BYTES``; None: the measured table).
        stream_min_bytes: where the group's shared-memory channel starts
            streaming results, for the :data:`STREAMED` thresholds (default:
            never, so those collectives stay flat).
    """

    def __init__(
        self, path: str, algo: str | None = None, node_min_bytes: int | None = None, stream_min_bytes: int = NEVER
    ) -> None:
        algo = algo or settings.algo
        if node_min_bytes is None:
            node_min_bytes = settings.shm_min_bytes
        self.path = FLAT if algo == FLAT else path
        table = HIER_MIN_BYTES if path == HIER else NODE_MIN_BYTES
        self._min_bytes: dict[str, int] = {}
        for op in OPS:
            if self.path == FLAT or op not in table:
                threshold = NEVER
            elif algo == HIER:
                threshold = 0
            elif path == NODE and node_min_bytes is not None:
                threshold = node_min_bytes
            elif table[op] == STREAMED:
                threshold = stream_min_bytes
            else:
                threshold = table[op]
            self._min_bytes[op] = threshold

    def min_bytes(self, op: str) -> int:
        """The smallest message of ``op`` that takes :attr:`path` (:data:`NEVER` if none)."""
        return self._min_bytes[op]
