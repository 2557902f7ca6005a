"""Which path a rank script's collectives took: the group's transport and its count of topology-aware calls."""

from __future__ import annotations

import torch
import torch.distributed as dist
from hpccomm.groups import front_of
from hpccomm.transports import half_reduce
from hpccomm.transports.topology_aware import TopologyAwareTransport


def transport(group=None) -> TopologyAwareTransport:
    """The CPU transport of ``group`` (default: the world); fails unless it has a topology-aware path."""
    pg = group if group is not None else dist.group.WORLD
    found = front_of(pg)._cpu_transport
    assert isinstance(found, TopologyAwareTransport), f"no topology-aware path: {type(found).__name__}"
    return found


def reduces(dtype: torch.dtype, op: object = None) -> bool:
    """Whether the shared-memory engine takes this pair: it reduces 16-bit floats only with their compiled kernels."""
    return not (dtype in half_reduce.HALF_DTYPES and op is not None and half_reduce.path(dtype) == "torch")


class Through:
    """Asserts that the calls inside the block took the topology-aware path (or none did, when ``expect`` is False).

    Args:
        op: the transport's name for the collective (``all_reduce``, ``all_gather_into_tensor``, ...).
        what: the call, for the message.
        expect: whether it should have taken the path.
        calls: how many calls the block makes.
    """

    def __init__(self, op: str, what: str, expect: bool = True, calls: int = 1) -> None:
        self.op, self.what, self.expect, self.calls = op, what, expect, calls

    def __enter__(self) -> None:
        pg = front_of(dist.group.WORLD)._cpu_transport
        self.before = pg.taken[self.op] if isinstance(pg, TopologyAwareTransport) else 0

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            pg = front_of(dist.group.WORLD)._cpu_transport
            took = (pg.taken[self.op] if isinstance(pg, TopologyAwareTransport) else 0) - self.before
            wanted = self.calls if self.expect else 0
            assert took == wanted, f"{self.what}: {took} of {self.calls} calls took the topology-aware path, not {wanted}"
