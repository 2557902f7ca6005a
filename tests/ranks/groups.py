"""Groups and lifetime: subgroups, non-members, destroy and init again.

Usage: groups.py [name-filter]
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import os
import sys

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from rankcheck import check, expect_error, run_all

dist.init_process_group("hpccomm")
RANK, SIZE = dist.get_rank(), dist.get_world_size()


@check
def identity_comes_from_mpi_and_is_exported() -> None:
    from mpi4py import MPI

    assert (RANK, SIZE) == (MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size)
    assert os.environ["RANK"] == str(RANK) and os.environ["WORLD_SIZE"] == str(SIZE)
    ident = hpccomm.identity()
    assert os.environ["LOCAL_RANK"] == str(ident.local_rank)
    assert os.environ["LOCAL_WORLD_SIZE"] == str(ident.local_world_size) == str(SIZE)  # one node here
    assert ident.num_nodes == 1
    assert dist.get_backend() == "hpccomm"


@check
def topology_of_one_node() -> None:
    import socket

    topo = hpccomm.topology()
    assert topo.num_nodes == 1 and topo.hosts == (socket.gethostname(),)
    assert topo.nodes == (tuple(range(SIZE)),) and topo.leaders == (0,) and topo.uniform
    assert (topo.rank, topo.local_rank, topo.local_size) == (RANK, RANK, SIZE)
    assert dist.get_process_group_ranks(hpccomm.node_group()) == list(range(SIZE))
    leaders = hpccomm.leaders_group()
    if RANK == 0:
        assert dist.get_process_group_ranks(leaders) == [0]
    else:
        assert leaders is dist.GroupMember.NON_GROUP_MEMBER
    mesh = hpccomm.init_device_mesh("cpu")
    assert mesh.mesh.tolist() == [list(range(SIZE))]


@check
def new_group_subsets_and_non_members() -> None:
    evens = list(range(0, SIZE, 2))
    group = dist.new_group(evens)
    t = torch.tensor([float(RANK)])
    if RANK in evens:
        dist.all_reduce(t, group=group)
        assert t.item() == sum(evens), t
        assert dist.get_rank(group) == evens.index(RANK)
        assert dist.get_world_size(group) == len(evens)
        # group ranks translate to global ranks on broadcast
        b = torch.tensor([float(RANK)])
        dist.broadcast(b, src=evens[-1], group=group)
        assert b.item() == evens[-1]
        # torch's layout on a subgroup: outs[group rank][i] holds that rank's input i
        outs = [[torch.empty(1), torch.empty(2)] for _ in evens]
        dist.all_gather_coalesced(outs, [torch.tensor([float(RANK)]), torch.full((2,), RANK + 0.5)], group=group)
        for i, r in enumerate(evens):
            assert outs[i][0].item() == r and torch.equal(outs[i][1], torch.full((2,), r + 0.5)), outs
    else:
        assert dist.get_rank(group) == -1
        assert t.item() == RANK  # a non-member's call is a no-op
    dist.barrier()
    dist.destroy_process_group(group)


@check
def new_subgroups_partition_the_world() -> None:
    if SIZE < 2:
        return
    mine, groups = dist.new_subgroups(group_size=2 if SIZE % 2 == 0 else 1)
    t = torch.ones(1)
    dist.all_reduce(t, group=mine)
    assert t.item() == dist.get_world_size(mine)
    for g in groups:
        dist.destroy_process_group(g)


@check
def overlapping_groups_in_the_same_order() -> None:
    a = dist.new_group(list(range(SIZE)))
    b = dist.new_group(list(range(SIZE - 1, -1, -1)))
    t = torch.ones(2)
    dist.all_reduce(t, group=a)
    dist.all_reduce(t, group=b)
    assert torch.equal(t, torch.full((2,), float(SIZE * SIZE)))
    assert dist.get_rank(b) == RANK  # torch sorts a group's ranks


@check
def group_name_is_set() -> None:
    group = dist.new_group(list(range(SIZE)))
    assert isinstance(group.group_name, str) and group.group_name
    assert dist.group.WORLD.group_name


@check
def destroy_and_init_again() -> None:
    for round_ in range(2):
        dist.destroy_process_group()
        assert not dist.is_initialized()
        dist.init_process_group("hpccomm")
        t = torch.tensor([float(round_ + RANK)])
        dist.all_reduce(t)
        assert t.item() == sum(round_ + r for r in range(SIZE))


@check
def destroy_finishes_work_nobody_waited_on() -> None:
    # Freeing a communicator under Open MPI's in-flight nonblocking collectives
    # crashed at the next progress call (1 run in 5 with 100 all-reduces).
    group = dist.new_group(list(range(SIZE)))
    small = [torch.full((1,), float(RANK + i)) for i in range(100)]
    large = [torch.full((1 << 16,), float(RANK + i)) for i in range(8)]  # 256 KiB: shared memory
    halves = [torch.full((1 << 16,), float(RANK + i), dtype=torch.bfloat16) for i in range(8)]
    for t in small + large + halves:
        dist.all_reduce(t, group=group, async_op=True)
    dist.destroy_process_group(group)
    for i, t in enumerate(small):
        assert torch.all(t == sum(r + i for r in range(SIZE))), (i, t)
    for i, (t, h) in enumerate(zip(large, halves)):
        want = sum(r + i for r in range(SIZE))
        assert torch.all(t == want) and torch.all(h == want), (i, t, h)
    t = torch.ones(1)
    dist.all_reduce(t)  # MPI still progresses cleanly afterwards
    assert t.item() == SIZE


@check
def closed_group_raises() -> None:
    group = dist.new_group(list(range(SIZE)))
    group.shutdown()
    expect_error(RuntimeError, "shut down", lambda: group.allreduce([torch.ones(1)], dist.AllreduceOptions()))


@check
def gloo_also_initialises_without_master_addr() -> None:
    group = dist.new_group(list(range(SIZE)), backend="gloo")
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    assert t.item() == SIZE


run_all(RANK, sys.argv[1] if len(sys.argv) > 1 else None)
dist.destroy_process_group()
