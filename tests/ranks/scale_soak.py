"""Rank program of benchmarks/scale_soak.py: one job of the scale soak (issue 41, item 4); usage: scale_soak.py SEED.

Every collective on the world, on half the ranks and on each node's ranks (``new_group`` per node), each result
checked; the default group destroyed and made again; then uneven exits: the job's last operations are a
gather to the last rank and a broadcast from rank 0, which some ranks (chosen by SEED) join up to 1.5 s late
while the others leave as soon as they have done their part. A rank that left after its part is no failure:
every rank must end with ``SOAK_OK``; a ``PeerExitedError`` here is a false verdict. Each rank also prints the
largest goodbye of its own, pickled (``SOAK_OK rank=R bytes=B``: to each rank, or over the tree its record and
its point-to-point counts to each partner), and after its exit steps the messages it sent and received for
departures (``SOAK_EXIT rank=R sent=S received=M``).
"""

from __future__ import annotations

import atexit
import pickle
import random
import sys
import time

import hpccomm.failure as failure
import torch
import torch.distributed as dist
from hpccomm.world import nodes as nodes_of_world

seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
rank = -1
# Registered before hpccomm arms fail-fast: runs after its exit steps (last in, first out).
atexit.register(lambda: print(f"SOAK_EXIT rank={rank} sent={failure.counts['sent']} "
                              f"received={failure.counts['received']}", flush=True))


def check(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if not torch.equal(got, want):
        raise AssertionError(f"{what}: got {got.tolist()[:8]}, want {want.tolist()[:8]}")


def collectives(group: dist.ProcessGroup | None, members: list[int], tag: str) -> None:
    """Every collective on ``group`` (whose world ranks are ``members``), each result checked."""
    n, me = len(members), members.index(dist.get_rank())
    total = float(sum(members))
    t = torch.full((5,), float(members[me]))
    dist.all_reduce(t, group=group)
    check(f"{tag} all_reduce", t, torch.full((5,), total))
    t = torch.full((3,), float(members[me]))
    dist.broadcast(t, src=members[-1], group=group)
    check(f"{tag} broadcast", t, torch.full((3,), float(members[-1])))
    out = torch.empty(2 * n)
    dist.all_gather_into_tensor(out, torch.full((2,), float(me)), group=group)
    check(f"{tag} all_gather", out, torch.arange(n).repeat_interleave(2).float())
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, torch.arange(2 * n).float(), group=group)
    check(f"{tag} reduce_scatter", out, torch.arange(2 * me, 2 * me + 2).float() * n)
    out = torch.empty(n)
    dist.all_to_all_single(out, torch.full((n,), float(me)), group=group)
    check(f"{tag} all_to_all", out, torch.arange(n).float())
    t = torch.full((2,), float(me))
    dist.reduce(t, dst=members[0], group=group)
    if me == 0:
        check(f"{tag} reduce", t, torch.full((2,), float(n * (n - 1) // 2)))
    parts = [torch.empty(1) for _ in range(n)] if me == 0 else None
    dist.gather(torch.full((1,), float(me)), parts, dst=members[0], group=group)
    if me == 0:
        check(f"{tag} gather", torch.cat(parts), torch.arange(n).float())
    t = torch.empty(1)
    dist.scatter(t, [torch.full((1,), float(i)) for i in range(n)] if me == 0 else None, src=members[0], group=group)
    check(f"{tag} scatter", t, torch.full((1,), float(me)))
    dist.barrier(group=group)


dist.init_process_group("hpccomm")
rank, size = dist.get_rank(), dist.get_world_size()
everyone = list(range(size))
collectives(None, everyone, "world")
halves = [everyone[0::2], everyone[1::2]]
groups = [dist.new_group(half) for half in halves]
mine = 0 if rank % 2 == 0 else 1
collectives(groups[mine], halves[mine], f"half {mine}")
node_of = nodes_of_world().node_of
nodes = sorted({node_of[r] for r in everyone})
by_node = [[r for r in everyone if node_of[r] == node] for node in nodes]
node_groups = [dist.new_group(ranks) for ranks in by_node]
here = nodes.index(node_of[rank])
if len(by_node[here]) > 1:
    collectives(node_groups[here], by_node[here], f"node {here}")
dist.destroy_process_group()

dist.init_process_group("hpccomm")
collectives(None, everyone, "world again")

# Uneven exits: the late ranks join the last two operations after the others have done their parts and left.
late = set(random.Random(seed).sample(everyone[1:-1], k=max(1, size // 4))) if size > 2 else set()
if rank in late:
    time.sleep(0.5 + random.Random(seed * 1000 + rank).random())
parts = [torch.empty(1) for _ in range(size)] if rank == size - 1 else None
dist.gather(torch.full((1,), float(rank)), parts, dst=size - 1)
if rank == size - 1:
    check("last gather", torch.cat(parts), torch.arange(size).float())
t = torch.full((1,), 7.0 if rank == 0 else 0.0)
dist.broadcast(t, src=0)
check("last broadcast", t, torch.full((1,), 7.0))
direct, record = failure.goodbye()  # over the tree: its record, and its counts to each partner
largest = max(len(pickle.dumps(message)) for message in [record, *(message for _, message in direct)] if message)
print(f"SOAK_OK rank={rank} bytes={largest}", flush=True)
