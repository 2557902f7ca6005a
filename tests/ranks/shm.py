"""The node-local shared-memory collectives: every op x dtype x reduce op, chunking, aliasing, ordering, cleanup.

Run under ``hpccomm-run -n N`` with HPCCOMM_SHM_MIN_BYTES=1 and a small
HPCCOMM_SHM_SLOT_BYTES, so small tensors take the shared-memory path in many
chunks. Every result is compared with values computed locally
(tests/ranks/expected.py), and every call must have taken the shared-memory
path (the transport counts them). Usage: shm.py [name-filter].
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import os
import sys

import hpccomm  # noqa: F401  (registers the backend)
import torch
import torch.distributed as dist
from expected import ALL, Op, combine, same, torch_op, valid_ops, value
from hpccomm.transports.shm import cache_share_bytes
from paths import Through, reduces, transport
import segments  # before the group: the files already there are not ours
from rankcheck import check, run_all

dist.init_process_group("hpccomm")
RANK, SIZE = dist.get_rank(), dist.get_world_size()


def sizes(units: int, itemsize: int) -> list[int]:
    """Element counts around chunk boundaries for a collective whose chunks carry ``units`` runs."""
    per_chunk = max(1, transport().channel.chunk_bytes // (units * itemsize))
    # One element, fewer than ranks, either side of a chunk, more chunks than a slot holds, and
    # large enough for larger chunks (odd-sized, then a whole buffer each).
    return sorted({1, max(1, SIZE - 1), per_chunk - 1 or 1, per_chunk + 1, 9 * per_chunk + 7, 40 * per_chunk + 3})


@check
def groups_on_one_node_get_a_channel():
    assert transport().channel is not None and transport().path == "node"
    sub = dist.new_group([0, 1])
    if RANK in (0, 1):
        assert transport(sub).channel.size == 2, "a two-rank subgroup has no channel"
    dist.destroy_process_group(sub)


@check
def all_reduce_every_dtype_op_and_chunking():
    for dtype in ALL:
        for op in valid_ops(dtype):
            for n in sizes(1, dtype.itemsize):
                ins = [value(r, dtype, n, op == Op.PRODUCT) for r in range(SIZE)]
                t = ins[RANK].clone()
                with Through("all_reduce", f"all_reduce {dtype} {op} n={n}", reduces(dtype, op)):
                    dist.all_reduce(t, op=torch_op(op))
                same(t, combine(op, dtype, ins), f"all_reduce {dtype} {op} n={n}")


@check
def reduce_every_dtype_op_and_root():
    for dtype in ALL:
        for op in valid_ops(dtype):
            for n in sizes(1, dtype.itemsize)[::2]:
                root = n % SIZE
                ins = [value(r, dtype, n, op == Op.PRODUCT) for r in range(SIZE)]
                t = ins[RANK].clone()
                with Through("reduce", f"reduce {dtype} {op} n={n}", reduces(dtype, op)):
                    dist.reduce(t, dst=root, op=torch_op(op))
                same(t, combine(op, dtype, ins) if RANK == root else ins[RANK], f"reduce {dtype} {op} n={n} root={root}")


@check
def broadcast_every_dtype_and_root():
    for dtype in ALL:
        for n in sizes(1, dtype.itemsize):
            for root in range(SIZE):
                t = value(RANK, dtype, n)
                with Through("broadcast", f"broadcast {dtype} n={n}"):
                    dist.broadcast(t, src=root)
                same(t, value(root, dtype, n), f"broadcast {dtype} n={n} root={root}")


@check
def all_gather_into_tensor_and_list_every_dtype():
    for dtype in ALL:
        for n in sizes(1, dtype.itemsize):
            out = torch.empty(SIZE * n, dtype=dtype)
            with Through("all_gather_into_tensor", f"all_gather_into_tensor {dtype} n={n}"):
                dist.all_gather_into_tensor(out, value(RANK, dtype, n))
            same(out, torch.cat([value(r, dtype, n) for r in range(SIZE)]), f"all_gather_into_tensor {dtype} n={n}")
            # The list form, with a different size per rank.
            outs = [torch.empty(n + r, dtype=dtype) for r in range(SIZE)]
            with Through("all_gather", f"all_gather {dtype} n={n}"):
                dist.all_gather(outs, value(RANK, dtype, n + RANK))
            for r in range(SIZE):
                same(outs[r], value(r, dtype, n + r), f"all_gather {dtype} n={n} from {r}")


@check
def reduce_scatter_tensor_and_list_every_dtype_and_op():
    for dtype in ALL:
        for op in valid_ops(dtype):
            small = op == Op.PRODUCT
            for n in sizes(SIZE, dtype.itemsize)[1::2]:
                ins = [value(r, dtype, n * SIZE, small) for r in range(SIZE)]
                out = torch.empty(n, dtype=dtype)
                with Through("reduce_scatter_tensor", f"reduce_scatter_tensor {dtype} {op} n={n}", reduces(dtype, op)):
                    dist.reduce_scatter_tensor(out, ins[RANK].clone(), op=torch_op(op))
                mine = [t[RANK * n : (RANK + 1) * n] for t in ins]
                same(out, combine(op, dtype, mine), f"reduce_scatter_tensor {dtype} {op} n={n}")
                # The list form: rank r contributes chunk j (n + j elements) to rank j.
                per_rank = [[value(r + j, dtype, n + j, small) for j in range(SIZE)] for r in range(SIZE)]
                out = torch.empty(n + RANK, dtype=dtype)
                with Through("reduce_scatter", f"reduce_scatter {dtype} {op} n={n}", reduces(dtype, op)):
                    dist.reduce_scatter(out, [t.clone() for t in per_rank[RANK]], op=torch_op(op))
                same(out, combine(op, dtype, [per_rank[r][RANK] for r in range(SIZE)]), f"reduce_scatter {dtype} {op} n={n}")


@check
def non_contiguous_inputs_and_outputs():
    n = 3 * transport().channel.chunk_bytes // 4 + 5  # several chunks
    grid = lambda r: (torch.arange(n * 2, dtype=torch.float32).view(2, n) + r).t()  # noqa: E731  n x 2, strided
    t = grid(RANK)
    with Through("all_reduce", "all_reduce"):
        dist.all_reduce(t)
    same(t, sum(grid(r) for r in range(SIZE)), "all_reduce non-contiguous")
    t = grid(RANK)
    with Through("broadcast", "broadcast"):
        dist.broadcast(t, src=SIZE - 1)
    same(t, grid(SIZE - 1), "broadcast non-contiguous")
    t = grid(RANK)
    with Through("reduce", "reduce"):
        dist.reduce(t, dst=0, op=dist.ReduceOp.MAX)
    same(t, grid(SIZE - 1) if RANK == 0 else grid(RANK), "reduce non-contiguous")
    outs = [torch.empty(2, n).t() for _ in range(SIZE)]
    with Through("all_gather", "all_gather"):
        dist.all_gather(outs, grid(RANK))
    for r in range(SIZE):
        same(outs[r], grid(r), f"all_gather non-contiguous from {r}")
    out = torch.empty(2, SIZE * n).t()  # SIZE*n x 2, strided
    with Through("all_gather_into_tensor", "all_gather_into_tensor"):
        dist.all_gather_into_tensor(out, grid(RANK))
    same(out, torch.cat([grid(r) for r in range(SIZE)]), "all_gather_into_tensor non-contiguous")
    big = torch.cat([grid(RANK + j) for j in range(SIZE)])  # SIZE*n x 2, strided pieces copied
    out = torch.empty(2, n).t()
    with Through("reduce_scatter_tensor", "reduce_scatter_tensor"):
        dist.reduce_scatter_tensor(out, big.t().contiguous().t())
    same(out, sum(grid(r + RANK) for r in range(SIZE)), "reduce_scatter_tensor non-contiguous")
    out = torch.empty(2, n).t()
    with Through("reduce_scatter", "reduce_scatter"):
        dist.reduce_scatter(out, [grid(RANK + j) for j in range(SIZE)])
    same(out, sum(grid(r + RANK) for r in range(SIZE)), "reduce_scatter non-contiguous")


@check
def aliased_inputs_and_outputs():
    n = transport().channel.chunk_bytes // 4 * 3 + 1
    # FSDP2's in-place all-gather: the input is this rank's slot of the output.
    out = torch.zeros(SIZE * n)
    out[RANK * n : (RANK + 1) * n] = value(RANK, torch.float32, n)
    with Through("all_gather_into_tensor", "in-place all_gather_into_tensor"):
        dist.all_gather_into_tensor(out, out[RANK * n : (RANK + 1) * n])
    same(out, torch.cat([value(r, torch.float32, n) for r in range(SIZE)]), "in-place all_gather_into_tensor")
    # An input inside the output at another place.
    out = torch.zeros(SIZE * n + 3)
    out[1 : n + 1] = value(RANK, torch.float32, n)
    with Through("all_gather_into_tensor", "overlapping all_gather_into_tensor"):
        dist.all_gather_into_tensor(out[3:], out[1 : n + 1])
    same(out[3:], torch.cat([value(r, torch.float32, n) for r in range(SIZE)]), "overlapping all_gather_into_tensor")
    # The list form in place: the input is this rank's output.
    outs = [torch.empty(n) for _ in range(SIZE)]
    outs[RANK].copy_(value(RANK, torch.float32, n))
    with Through("all_gather", "in-place all_gather"):
        dist.all_gather(outs, outs[RANK])
    for r in range(SIZE):
        same(outs[r], value(r, torch.float32, n), f"in-place all_gather from {r}")
    # reduce_scatter whose output is a slice of its own input: at a block's start, and between blocks.
    for start in (0, (SIZE - 1) * n, 1):
        buf = value(RANK, torch.int64, SIZE * n + 1)
        expected = combine(Op.SUM, torch.int64, [value(r, torch.int64, SIZE * n + 1)[RANK * n : (RANK + 1) * n] for r in range(SIZE)])
        with Through("reduce_scatter_tensor", f"aliased reduce_scatter_tensor at {start}"):
            dist.reduce_scatter_tensor(buf[start : start + n], buf[: SIZE * n])
        same(buf[start : start + n], expected, f"aliased reduce_scatter_tensor at {start}")
    # The list form with the output among the inputs.
    ins = [value(RANK + j, torch.int32, n) for j in range(SIZE)]
    expected = combine(Op.SUM, torch.int32, [value(r + RANK, torch.int32, n) for r in range(SIZE)])
    with Through("reduce_scatter", "aliased reduce_scatter"):
        dist.reduce_scatter(ins[0], ins)
    same(ins[0], expected, "aliased reduce_scatter")


@check
def results_are_streamed_from_the_threshold():
    channel = transport().channel
    if "HPCCOMM_SHM_STREAM_MIN_BYTES" in os.environ:
        assert channel.stream_min_bytes == int(os.environ["HPCCOMM_SHM_STREAM_MIN_BYTES"]), channel.stream_min_bytes
    else:
        assert channel.stream_min_bytes == cache_share_bytes(SIZE), channel.stream_min_bytes
    assert channel.max_chunk_bytes <= max(64, cache_share_bytes(SIZE) // 16), channel.max_chunk_bytes
    chosen, channel.stream_min_bytes = channel.stream_min_bytes, 4000
    try:
        plan = channel.plan(torch.float32, dist.ReduceOp.SUM)
        for n in (999, 1000):  # the results this rank's engine writes: 3996 and 4000 bytes
            streamed = n == 1000
            t = value(RANK, torch.float32, n)
            posted = [(channel.allreduce(t, plan), "all_reduce", streamed)]
            b = value(RANK, torch.float32, n)
            posted.append((channel.broadcast(b, root=0), "broadcast", streamed))
            # An all-gather's result is its whole output; a reduce-scatter's is written by its reduction.
            out = torch.empty(n)
            per_rank = n // SIZE
            blocks = [(out.data_ptr() + k * per_rank * 4, per_rank) for k in range(SIZE)]
            mine = value(RANK, torch.float32, per_rank)
            posted.append((channel.allgather(torch.float32, blocks, mine.data_ptr(), keep=(out, mine)), "all_gather",
                           per_rank * SIZE * 4 >= 4000))
            scattered = torch.empty(per_rank)
            posted.append((channel.reduce_scatter(plan, blocks, scattered.data_ptr(), keep=(out, scattered)),
                           "reduce_scatter", False))
            for op, name, wanted in posted:
                assert bool(op._op.stream) == wanted, f"{name} n={n}: streamed {bool(op._op.stream)}, not {wanted}"
                while not op.test():
                    pass
            same(t, combine(Op.SUM, torch.float32, [value(r, torch.float32, n) for r in range(SIZE)]), f"all_reduce n={n}")
            same(b, value(0, torch.float32, n), f"broadcast n={n}")
            same(out[: per_rank * SIZE], torch.cat([value(r, torch.float32, per_rank) for r in range(SIZE)]),
                 f"all_gather n={n}")
    finally:
        channel.stream_min_bytes = chosen


@check
def every_rank_gets_the_same_bits():
    # Float sums in different orders differ in the last bit; one owner per element makes them equal.
    t = torch.randn(10_000, generator=torch.Generator().manual_seed(RANK)) * 1e3
    dist.all_reduce(t)
    gathered = [torch.empty_like(t) for _ in range(SIZE)]
    dist.all_gather(gathered, t)
    assert all(torch.equal(g.view(torch.int32), t.view(torch.int32)) for g in gathered)


@check
def nan_wins_min_and_max_and_integers_wrap():
    t = torch.tensor([1.0, float("nan") if RANK == SIZE - 1 else 2.0, -0.0])
    for kind in (dist.ReduceOp.MIN, dist.ReduceOp.MAX):
        out = t.clone()
        dist.all_reduce(out, op=kind)
        assert out[0] == 1.0 and out[1].isnan(), f"{kind}: {out}"
    wrapped = torch.full((100,), 100, dtype=torch.int8)
    dist.all_reduce(wrapped)
    assert torch.all(wrapped == torch.tensor(100 * SIZE).to(torch.int8)), wrapped[:3]


@check
def async_collectives_complete_in_any_wait_order_among_mpi_ones():
    n = 5000
    tensors = [torch.full((n,), float(RANK + i)) for i in range(6)]
    gathered = torch.empty(SIZE * n)
    scattered = torch.empty(n)
    works = []
    for i, t in enumerate(tensors):
        works.append(dist.all_reduce(t, async_op=True))
        if i == 2:
            works.append(dist.all_gather_into_tensor(gathered, torch.full((n,), float(RANK)), async_op=True))
            works.append(dist.reduce_scatter_tensor(scattered, torch.arange(SIZE * n, dtype=torch.float32), async_op=True))
        if i % 2:
            out = torch.empty(SIZE)
            dist.all_to_all_single(out, torch.full((SIZE,), float(RANK)))  # an MPI collective between them
            assert torch.equal(out, torch.arange(SIZE, dtype=torch.float32))
    for work in reversed(works):
        work.wait()
    for i, t in enumerate(tensors):
        assert torch.all(t == sum(r + i for r in range(SIZE))), f"tensor {i}"
    assert torch.equal(gathered, torch.arange(SIZE, dtype=torch.float32).repeat_interleave(n))
    assert torch.equal(scattered, torch.arange(RANK * n, (RANK + 1) * n, dtype=torch.float32) * SIZE)
    fut = dist.all_reduce(torch.ones(7000), async_op=True).get_future()
    (value_,) = fut.wait()
    assert torch.all(value_ == SIZE)


@check
def the_segment_leaves_no_file_behind():
    mine = segments.left_behind()
    assert not mine, f"segment files left in /dev/shm: {mine}"


@check
def destroy_and_init_again_gets_a_working_channel():
    dist.destroy_process_group()
    dist.init_process_group("hpccomm")
    t = torch.full((9000,), float(RANK))
    with Through("all_reduce", "all_reduce after init again"):
        dist.all_reduce(t)
    assert torch.all(t == sum(range(SIZE)))


if __name__ == "__main__":
    run_all(RANK, sys.argv[1] if len(sys.argv) > 1 else None)
