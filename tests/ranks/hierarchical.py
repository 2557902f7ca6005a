"""Groups that span nodes: topology, node and leader groups, every hierarchical op x dtype x reduce op, HSDP.

Run across nodes (tests/nodes.py's fake nodes, or Slurm) with
HPCCOMM_ALGO=hier, HPCCOMM_SHM_MIN_BYTES=1 and small HPCCOMM_SHM_SLOT_BYTES,
so every size takes the hierarchical path in many chunks and pieces where the
layout allows it (the same number of ranks, at least two, on every node) and
the flat path elsewhere; each call is checked to have taken the path the
layout calls for, and each result against values computed locally.
Usage: hierarchical.py [name-filter].
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import os
import socket
import sys

import hpccomm
from hpccomm.groups import front_of
import torch
import torch.distributed as dist
from expected import ALL, Op, combine, same, torch_op, valid_ops, value
from paths import Through, reduces, transport
import segments  # before the group: the files already there are not ours
from rankcheck import check, expect_error, run_all, say
from training import assert_close, full_params, fully_sharded, train

dist.init_process_group("hpccomm")
RANK, SIZE = dist.get_rank(), dist.get_world_size()
TOPO = hpccomm.topology()
HIER = TOPO.num_nodes > 1 and TOPO.uniform and TOPO.local_size > 1 and os.environ.get("HPCCOMM_ALGO") != "flat"
#: Element counts: one, odd and few, many chunks, many pieces (with 1 KiB slots).
SIZES = (1, 7, 301, 5003)


def hier(dtype: torch.dtype, op: object = None) -> bool:
    """Whether a call should take the hierarchical path."""
    return HIER and reduces(dtype, op)


@check
def topology_matches_where_ranks_run() -> None:
    hosts: list[str] = [""] * SIZE
    dist.all_gather_object(hosts, socket.gethostname())
    names = list(dict.fromkeys(hosts))  # in order of first rank
    assert TOPO.hosts == tuple(names), (TOPO.hosts, names)
    assert TOPO.node_of == tuple(names.index(h) for h in hosts)
    assert TOPO.nodes == tuple(tuple(r for r in range(SIZE) if hosts[r] == h) for h in names)
    assert TOPO.local_rank == TOPO.nodes[TOPO.node].index(RANK)
    assert TOPO.local_size == hosts.count(hosts[RANK]) == int(os.environ["LOCAL_WORLD_SIZE"])
    assert TOPO.ranks_per_node == tuple(hosts.count(h) for h in names)
    assert TOPO.leaders == tuple(hosts.index(h) for h in names)
    assert TOPO.uniform == (len(set(TOPO.ranks_per_node)) == 1)
    # A subgroup's view: its own ranks, nodes renumbered by its lowest rank.
    odd = list(range(1, SIZE, 2))
    sub = dist.new_group(odd)
    if RANK in odd:
        mine = hpccomm.topology(sub)
        assert mine.size == len(odd) and mine.rank == odd.index(RANK)
        assert [mine.hosts[n] for n in mine.node_of] == [hosts[r] for r in odd]
    else:
        expect_error(ValueError, "not a member", lambda: hpccomm.topology(sub))
    dist.destroy_process_group(sub)


@check
def node_and_leader_groups() -> None:
    node = hpccomm.node_group()
    assert hpccomm.node_group() is node, "node_group is not cached"
    assert dist.get_process_group_ranks(node) == list(TOPO.nodes[TOPO.node])
    t = torch.ones(1)
    dist.all_reduce(t, group=node)
    assert t.item() == TOPO.local_size
    leaders = hpccomm.leaders_group()
    if TOPO.is_leader:
        assert dist.get_process_group_ranks(leaders) == list(TOPO.leaders)
        t = torch.ones(1)
        dist.all_reduce(t, group=leaders)
        assert t.item() == TOPO.num_nodes
    else:
        assert leaders is dist.GroupMember.NON_GROUP_MEMBER


@check
def the_world_takes_the_path_its_layout_allows() -> None:
    if HIER:
        assert transport().path == "hier"
    else:
        assert not hasattr(front_of(dist.group.WORLD)._cpu_transport, "taken"), "a topology-aware path where none applies"


@check
def all_reduce_every_dtype_and_op() -> None:
    for dtype in ALL:
        for op in valid_ops(dtype):
            for n in SIZES[:3]:
                ins = [value(r, dtype, n, op == Op.PRODUCT) for r in range(SIZE)]
                t = ins[RANK].clone()
                with Through("all_reduce", f"all_reduce {dtype} {op} n={n}", hier(dtype, op)):
                    dist.all_reduce(t, op=torch_op(op))
                same(t, combine(op, dtype, ins), f"all_reduce {dtype} {op} n={n}")


@check
def broadcast_every_dtype_and_root() -> None:
    for dtype in ALL:
        for root in range(SIZE):
            for n in SIZES[1:3]:
                t = value(RANK, dtype, n)
                with Through("broadcast", f"broadcast {dtype} n={n}", HIER):
                    dist.broadcast(t, src=root)
                same(t, value(root, dtype, n), f"broadcast {dtype} n={n} root={root}")


@check
def all_gather_every_dtype_in_place_and_uneven() -> None:
    for dtype in ALL:
        for n in SIZES[:3]:
            out = torch.empty(SIZE * n, dtype=dtype)
            with Through("all_gather_into_tensor", f"all_gather_into_tensor {dtype} n={n}", HIER):
                dist.all_gather_into_tensor(out, value(RANK, dtype, n))
            same(out, torch.cat([value(r, dtype, n) for r in range(SIZE)]), f"all_gather_into_tensor {dtype} n={n}")
            out = torch.zeros(SIZE * n, dtype=dtype)
            out[RANK * n : (RANK + 1) * n] = value(RANK, dtype, n)
            with Through("all_gather_into_tensor", f"in-place all_gather_into_tensor {dtype} n={n}", HIER):
                dist.all_gather_into_tensor(out, out[RANK * n : (RANK + 1) * n])
            same(out, torch.cat([value(r, dtype, n) for r in range(SIZE)]), f"in-place all_gather_into_tensor {dtype}")
            outs = [torch.empty(n + r, dtype=dtype) for r in range(SIZE)]
            with Through("all_gather", f"all_gather {dtype} n={n}", HIER):
                dist.all_gather(outs, value(RANK, dtype, n + RANK))
            for r in range(SIZE):
                same(outs[r], value(r, dtype, n + r), f"all_gather {dtype} n={n} from {r}")


@check
def reduce_scatter_every_dtype_and_op() -> None:
    for dtype in ALL:
        for op in valid_ops(dtype):
            small = op == Op.PRODUCT
            for n in SIZES[1:3]:
                ins = [value(r, dtype, n * SIZE, small) for r in range(SIZE)]
                out = torch.empty(n, dtype=dtype)
                with Through("reduce_scatter_tensor", f"reduce_scatter_tensor {dtype} {op} n={n}", hier(dtype, op)):
                    dist.reduce_scatter_tensor(out, ins[RANK].clone(), op=torch_op(op))
                same(out, combine(op, dtype, [t[RANK * n : (RANK + 1) * n] for t in ins]), f"reduce_scatter_tensor {dtype} {op}")
                per_rank = [[value(r + j, dtype, n + j, small) for j in range(SIZE)] for r in range(SIZE)]
                out = torch.empty(n + RANK, dtype=dtype)
                with Through("reduce_scatter", f"reduce_scatter {dtype} {op} n={n}", hier(dtype, op)):
                    dist.reduce_scatter(out, [t.clone() for t in per_rank[RANK]], op=torch_op(op))
                same(out, combine(op, dtype, [per_rank[r][RANK] for r in range(SIZE)]), f"reduce_scatter {dtype} {op}")


@check
def large_messages_in_pieces_and_non_contiguous() -> None:
    n = SIZES[-1]
    grid = lambda r, rows=n: (torch.arange(2 * rows, dtype=torch.float32).view(2, rows) + r).t()  # noqa: E731
    t = grid(RANK)
    with Through("all_reduce", "all_reduce", HIER):
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
    same(t, sum(grid(r) for r in range(SIZE)) / SIZE, "large AVG all_reduce")
    t = grid(RANK)
    with Through("broadcast", "broadcast", HIER):
        dist.broadcast(t, src=SIZE - 1)
    same(t, grid(SIZE - 1), "large broadcast")
    out = torch.empty(2, SIZE * n).t()
    with Through("all_gather_into_tensor", "all_gather_into_tensor", HIER):
        dist.all_gather_into_tensor(out, grid(RANK))
    same(out, torch.cat([grid(r) for r in range(SIZE)]), "large all_gather_into_tensor")
    big = torch.arange(2 * SIZE * n, dtype=torch.float32) + RANK
    out = torch.empty(2 * n)
    with Through("reduce_scatter_tensor", "reduce_scatter_tensor", HIER):
        dist.reduce_scatter_tensor(out, big)
    want = sum(torch.arange(2 * SIZE * n, dtype=torch.float32) + r for r in range(SIZE))[RANK * 2 * n : (RANK + 1) * 2 * n]
    same(out, want, "large reduce_scatter_tensor")
    # reduce_scatter whose output is a slice of its own input.
    buf = value(RANK, torch.int64, SIZE * n)
    expected = combine(Op.SUM, torch.int64, [value(r, torch.int64, SIZE * n)[RANK * n : (RANK + 1) * n] for r in range(SIZE)])
    dist.reduce_scatter_tensor(buf[:n], buf)
    same(buf[:n], expected, "aliased reduce_scatter_tensor")


@check
def async_collectives_complete_in_any_wait_order() -> None:
    n = SIZES[-2]
    sums = [torch.full((n,), float(RANK + i)) for i in range(4)]
    gathered = torch.empty(SIZE * n)
    scattered = torch.empty(n)
    copied = torch.full((n,), float(RANK))
    works = [dist.all_reduce(sums[0], async_op=True)]
    works.append(dist.all_gather_into_tensor(gathered, torch.full((n,), float(RANK)), async_op=True))
    works.append(dist.all_reduce(sums[1], async_op=True))
    works.append(dist.reduce_scatter_tensor(scattered, torch.arange(SIZE * n, dtype=torch.float32), async_op=True))
    out = torch.empty(SIZE)
    dist.all_to_all_single(out, torch.full((SIZE,), float(RANK)))  # flat, between them
    works.append(dist.broadcast(copied, src=SIZE - 1, async_op=True))
    works.append(dist.all_reduce(sums[2], async_op=True))
    works.append(dist.all_reduce(sums[3], async_op=True))
    for work in reversed(works):
        work.wait()
    for i, t in enumerate(sums):
        assert torch.all(t == sum(r + i for r in range(SIZE))), f"all_reduce {i}"
    assert torch.equal(gathered, torch.arange(SIZE, dtype=torch.float32).repeat_interleave(n))
    assert torch.equal(scattered, torch.arange(RANK * n, (RANK + 1) * n, dtype=torch.float32) * SIZE)
    assert torch.all(copied == SIZE - 1) and torch.equal(out, torch.arange(SIZE, dtype=torch.float32))


@check
def hsdp_on_the_node_mesh_matches_single_process_training() -> None:
    if not TOPO.uniform:
        expect_error(ValueError, "different numbers of ranks", lambda: hpccomm.init_device_mesh("cpu"))
        return
    mesh = hpccomm.init_device_mesh("cpu")
    assert mesh.mesh_dim_names == ("node", "local") and tuple(mesh.mesh.shape) == (TOPO.num_nodes, TOPO.local_size)
    assert mesh.mesh.tolist() == [list(ranks) for ranks in TOPO.nodes]
    model = fully_sharded(mesh)
    train(model, RANK, SIZE)
    assert_close(full_params(model), SIZE, "HSDP")


@check
def the_segments_leave_no_file_behind() -> None:
    mine = segments.left_behind()
    assert not mine, f"segment files left in /dev/shm: {mine}"


if __name__ == "__main__":
    if RANK == 0:  # for the launching test: the layout the checks ran on
        say(f"LAYOUT nodes={TOPO.num_nodes} ranks_per_node={','.join(map(str, TOPO.ranks_per_node))} hierarchical={HIER}")
    run_all(RANK, sys.argv[1] if len(sys.argv) > 1 else None)
    dist.destroy_process_group()
