"""Every collective x dtype x reduce op, checked against values computed locally.

Each rank can compute every other rank's input (they are a function of the
rank), so each result is compared with a locally computed expectation.
Run under any number of ranks; usage: collectives.py [name-filter].
"""

from __future__ import annotations

import sys

import hpccomm  # noqa: F401  (registers the backend)
import torch
import torch.distributed as dist
from expected import ALL, NUMEL, Op, combine, invalid_ops, inputs, same, torch_op, valid_ops, value
from rankcheck import check, expect_error, run_all

dist.init_process_group("hpccomm")
RANK, SIZE = dist.get_rank(), dist.get_world_size()

# -- reductions -----------------------------------------------------------------


@check
def all_reduce_every_dtype_and_op() -> None:
    for dtype in ALL:
        for op in valid_ops(dtype):
            for async_op in (False, True):
                ins = inputs(dtype, op, SIZE)
                t = ins[RANK].clone()
                work = dist.all_reduce(t, op=torch_op(op), async_op=async_op)
                if async_op:
                    (fut_value,) = work.get_future().wait()
                    # torch hands complex tensors over as view_as_real
                    output = torch.view_as_real(t) if dtype.is_complex else t
                    assert torch.equal(fut_value, output), f"future value is not the output ({dtype} {op})"
                    work.wait()
                same(t, combine(op, dtype, ins), f"all_reduce {dtype} {op} async={async_op}")


@check
def sixteen_bit_sums_round_to_nearest_even() -> None:
    # Rank 0 adds 1, rank 1 half a unit of the last place more than one unit, the rest 0:
    # one rounding, wherever it happens, which torch does to nearest-even (truncating would not).
    for dtype, tie in ((torch.bfloat16, 3 / 256), (torch.float16, 3 / 2048)):
        t = torch.full((5,), {0: 1.0, 1: tie}.get(RANK, 0.0), dtype=dtype)
        dist.all_reduce(t)
        expected = torch.tensor(1.0, dtype=dtype) + torch.tensor(tie if SIZE > 1 else 0.0, dtype=dtype)
        same(t, expected.expand(5), f"{dtype} sum")


@check
def sparse_all_reduce_sums_as_gloo_does() -> None:
    # rank r holds ones at rows 0..r of a (SIZE + 1) x 2 x [3] tensor: overlapping entries add up
    for dense_shape in ((), (3,)):
        for dtype in (torch.float32, torch.int64, torch.bfloat16):
            indices = torch.stack([torch.arange(RANK + 1), torch.zeros(RANK + 1, dtype=torch.int64)])
            values = torch.ones(RANK + 1, *dense_shape, dtype=dtype)
            t = torch.sparse_coo_tensor(indices, values, (SIZE + 1, 2, *dense_shape))
            dist.all_reduce(t)
            expected = torch.zeros(SIZE + 1, 2, *dense_shape, dtype=dtype)
            for r in range(SIZE):
                expected[: r + 1, 0] += 1
            assert t.is_sparse and torch.equal(t.to_dense(), expected), f"sparse all_reduce {dtype}: {t.to_dense()}"
    t = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.ones(1), (2,))
    expect_error(ValueError, "summed only", lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX))
    dist.barrier()


@check
def reductions_reject_ops_that_make_no_sense() -> None:
    for dtype in ALL:
        for op in invalid_ops(dtype):
            t = value(RANK, dtype)
            expect_error(ValueError, "all_reduce", lambda: dist.all_reduce(t, op=torch_op(op)))
    dist.barrier()  # nothing was posted: the group is still in step


@check
def reduce_every_dtype_and_op_to_every_root() -> None:
    for dtype in ALL:
        for op in valid_ops(dtype):
            for root in range(SIZE):
                ins = inputs(dtype, op, SIZE)
                t = ins[RANK].clone()
                dist.reduce(t, dst=root, op=torch_op(op))
                expected = combine(op, dtype, ins) if RANK == root else ins[RANK]
                same(t, expected, f"reduce {dtype} {op} root={root}")


@check
def reduce_scatter_list_every_dtype_and_op() -> None:
    for dtype in ALL:
        for op in valid_ops(dtype):
            # rank r contributes chunk j = value(r + j) to rank j; chunk sizes differ per j
            per_rank = [[value(r + j, dtype, j + 2, op == Op.PRODUCT) for j in range(SIZE)] for r in range(SIZE)]
            out = torch.empty(RANK + 2, dtype=dtype)
            dist.reduce_scatter(out, [t.clone() for t in per_rank[RANK]], op=torch_op(op))
            same(out, combine(op, dtype, [per_rank[r][RANK] for r in range(SIZE)]), f"reduce_scatter {dtype} {op}")


@check
def reduce_scatter_tensor_every_dtype_and_op() -> None:
    for dtype in ALL:
        for op in valid_ops(dtype):
            ins = inputs(dtype, op, SIZE, NUMEL * SIZE)
            out = torch.empty(NUMEL, dtype=dtype)
            dist.reduce_scatter_tensor(out, ins[RANK].clone(), op=torch_op(op))
            mine = [t[RANK * NUMEL : (RANK + 1) * NUMEL] for t in ins]
            same(out, combine(op, dtype, mine), f"reduce_scatter_tensor {dtype} {op}")


@check
def all_reduce_coalesced_and_coalescing_manager() -> None:
    ts = [value(RANK, torch.float32, n) for n in (1, 5, 9)]
    dist.all_reduce_coalesced(ts)
    for n, t in zip((1, 5, 9), ts):
        same(t, combine(Op.SUM, torch.float32, [value(r, torch.float32, n) for r in range(SIZE)]), "coalesced")
    from torch.distributed.distributed_c10d import _coalescing_manager

    ts = [value(RANK, torch.int32, n) for n in (2, 3)]
    with _coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    for n, t in zip((2, 3), ts):
        same(t, combine(Op.SUM, torch.int32, [value(r, torch.int32, n) for r in range(SIZE)]), "coalescing manager")


@check
def coalesced_gathers_and_reduce_scatters() -> None:
    from torch._C._distributed_c10d import AllgatherOptions, ReduceScatterOptions

    pg = dist.group.WORLD
    sizes = (1, 3, 5)
    for async_op in (False, True):
        ins = [value(RANK, torch.float32, n) for n in sizes]
        outs = [torch.empty(SIZE * n) for n in sizes]
        opts = AllgatherOptions()
        opts.asyncOp = async_op
        pg.allgather_into_tensor_coalesced(outs, ins, opts).wait()
        for n, out in zip(sizes, outs):
            same(out, torch.cat([value(r, torch.float32, n) for r in range(SIZE)]), f"coalesced all_gather n={n}")
        big = [value(RANK, torch.int64, n * SIZE) for n in sizes]
        outs = [torch.empty(n, dtype=torch.int64) for n in sizes]
        opts = ReduceScatterOptions()
        opts.asyncOp = async_op
        pg.reduce_scatter_tensor_coalesced(outs, big, opts).wait()
        for n, out in zip(sizes, outs):
            mine = [value(r, torch.int64, n * SIZE)[RANK * n : (RANK + 1) * n] for r in range(SIZE)]
            same(out, combine(Op.SUM, torch.int64, mine), f"coalesced reduce_scatter n={n}")


# -- data movement ------------------------------------------------------------------


@check
def broadcast_every_dtype_from_every_root() -> None:
    for dtype in ALL:
        for root in range(SIZE):
            t = value(RANK, dtype).clone()
            dist.broadcast(t, src=root)
            same(t, value(root, dtype), f"broadcast {dtype} root={root}")


@check
def all_gather_every_dtype_even_and_uneven() -> None:
    for dtype in ALL:
        outs = [torch.empty(NUMEL, dtype=dtype) for _ in range(SIZE)]
        dist.all_gather(outs, value(RANK, dtype))
        for r in range(SIZE):
            same(outs[r], value(r, dtype), f"all_gather {dtype} from {r}")
        outs = [torch.empty(r + 1, dtype=dtype) for r in range(SIZE)]
        dist.all_gather(outs, value(RANK, dtype, RANK + 1))
        for r in range(SIZE):
            same(outs[r], value(r, dtype, r + 1), f"uneven all_gather {dtype} from {r}")


@check
def all_gather_into_tensor_every_dtype() -> None:
    for dtype in ALL:
        out = torch.empty(SIZE * NUMEL, dtype=dtype)
        dist.all_gather_into_tensor(out, value(RANK, dtype))
        same(out, torch.cat([value(r, dtype) for r in range(SIZE)]), f"all_gather_into_tensor {dtype}")
        out2 = torch.empty(SIZE, NUMEL, dtype=dtype)
        dist.all_gather_into_tensor(out2, value(RANK, dtype))
        same(out2, torch.stack([value(r, dtype) for r in range(SIZE)]), f"all_gather_into_tensor stacked {dtype}")


@check
def all_gather_coalesced_in_torchs_layout() -> None:
    # output_tensor_lists[r][i] receives rank r's input i. With as many inputs as ranks a
    # transposed result has the right shapes and plausible values: the case to catch.
    for count in sorted({1, SIZE, SIZE + 1}):
        for dtype in (torch.float32, torch.int64, torch.complex64):
            ins = [value(10 * RANK + i, dtype, i + 1) for i in range(count)]
            outs = [[torch.empty(i + 1, dtype=dtype) for i in range(count)] for _ in range(SIZE)]
            work = dist.all_gather_coalesced(outs, ins, async_op=count == SIZE)
            if work is not None:
                work.wait()
            for r in range(SIZE):
                for i in range(count):
                    same(outs[r][i], value(10 * r + i, dtype, i + 1), f"all_gather_coalesced x{count} [{r}][{i}]")
    empty = [[torch.empty(0), torch.empty(3)] for _ in range(SIZE)]
    dist.all_gather_coalesced(empty, [torch.empty(0), value(RANK, torch.float32, 3)])
    for r in range(SIZE):
        same(empty[r][1], value(r, torch.float32, 3), f"all_gather_coalesced with an empty tensor [{r}]")


@check
def gather_and_scatter_every_dtype_and_root() -> None:
    for dtype in ALL:
        for root in range(SIZE):
            outs = [torch.empty(NUMEL, dtype=dtype) for _ in range(SIZE)] if RANK == root else None
            dist.gather(value(RANK, dtype), outs, dst=root)
            if RANK == root:
                for r in range(SIZE):
                    same(outs[r], value(r, dtype), f"gather {dtype} root={root} from {r}")
            out = torch.empty(NUMEL, dtype=dtype)
            chunks = [value(r + 10, dtype) for r in range(SIZE)] if RANK == root else None
            dist.scatter(out, chunks, src=root)
            same(out, value(RANK + 10, dtype), f"scatter {dtype} root={root}")


@check
def all_to_all_list_uneven_every_dtype() -> None:
    for dtype in ALL:
        # rank r sends (r + j + 1) elements to rank j
        ins = [value(100 * RANK + j, dtype, RANK + j + 1) for j in range(SIZE)]
        outs = [torch.empty(r + RANK + 1, dtype=dtype) for r in range(SIZE)]
        dist.all_to_all(outs, ins)
        for r in range(SIZE):
            same(outs[r], value(100 * r + RANK, dtype, r + RANK + 1), f"all_to_all {dtype} from {r}")


@check
def all_to_all_single_even_and_uneven_every_dtype() -> None:
    for dtype in ALL:
        ins = torch.cat([value(100 * RANK + j, dtype, 3) for j in range(SIZE)]).view(SIZE, 3)
        out = torch.empty(SIZE, 3, dtype=dtype)
        dist.all_to_all_single(out, ins)
        same(out, torch.stack([value(100 * r + RANK, dtype, 3) for r in range(SIZE)]), f"a2a single even {dtype}")
        # uneven: rank r sends (j + 1) rows of width 2 to rank j
        send_rows = [j + 1 for j in range(SIZE)]
        recv_rows = [RANK + 1] * SIZE
        ins = torch.cat([value(100 * RANK + j, dtype, 2 * (j + 1)) for j in range(SIZE)]).view(-1, 2)
        out = torch.empty(sum(recv_rows), 2, dtype=dtype)
        dist.all_to_all_single(out, ins, output_split_sizes=recv_rows, input_split_sizes=send_rows)
        expected = torch.cat([value(100 * r + RANK, dtype, 2 * (RANK + 1)) for r in range(SIZE)]).view(-1, 2)
        same(out, expected, f"a2a single uneven {dtype}")


@check
def send_recv_tags_any_source_and_batch() -> None:
    for dtype in ALL:
        if SIZE == 1:
            return
        nxt, prv = (RANK + 1) % SIZE, (RANK - 1) % SIZE
        out = torch.empty(NUMEL, dtype=dtype)
        reqs = dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, value(RANK, dtype), nxt, tag=3), dist.P2POp(dist.irecv, out, prv, tag=3)]
        )
        for req in reqs:
            req.wait()
        same(out, value(prv, dtype), f"batch_isend_irecv {dtype}")
    # tags keep messages apart even when received in the other order
    if RANK == 0:
        dist.send(torch.full((2,), 1.0), dst=1, tag=11)
        dist.send(torch.full((2,), 2.0), dst=1, tag=22)
    elif RANK == 1:
        b, a = torch.empty(2), torch.empty(2)
        dist.recv(b, src=0, tag=22)
        dist.recv(a, src=0, tag=11)
        same(a, torch.full((2,), 1.0), "tag 11")
        same(b, torch.full((2,), 2.0), "tag 22")
    # any source: rank 0 hears from everyone else, learns who sent (on UCC too: its point-to-point is MPI's)
    if RANK == 0:
        senders = set()
        for _ in range(SIZE - 1):
            t = torch.empty(1, dtype=torch.int64)
            src = dist.recv(t)
            assert int(t) == src, f"recv any source: sender {src} sent {int(t)}"
            senders.add(src)
        assert senders == set(range(1, SIZE))
    else:
        dist.send(torch.tensor([RANK]), dst=0)
    dist.barrier()


@check
def tags_past_15_bits() -> None:
    # A UCC active-set broadcast keeps 15 bits of a tag; hpccomm's point-to-point is MPI's on every transport.
    if SIZE == 1:
        return
    if RANK == 0:
        dist.send(torch.full((3,), 7.0), dst=1, tag=32767)
        dist.send(torch.full((3,), 8.0), dst=1, tag=32768)
    elif RANK == 1:
        high, low = torch.empty(3), torch.empty(3)
        dist.recv(high, src=0, tag=32768)
        dist.recv(low, src=0, tag=32767)
        same(low, torch.full((3,), 7.0), "recv with tag 32767")
        same(high, torch.full((3,), 8.0), "recv with tag 32768")
    dist.barrier()


# -- shapes: non-contiguous, empty ------------------------------------------------------


@check
def non_contiguous_tensors() -> None:
    base = torch.arange(12, dtype=torch.float32).view(3, 4) + RANK
    t = base.t()  # 4x3 view, not contiguous
    assert not t.is_contiguous()
    dist.all_reduce(t)
    expected = sum(torch.arange(12, dtype=torch.float32).view(3, 4) + r for r in range(SIZE)).t()
    same(t, expected, "all_reduce non-contiguous")
    assert base.data_ptr() == t.data_ptr(), "result must land in the caller's storage"
    b = (torch.arange(12, dtype=torch.int64).view(3, 4) + RANK).t()
    dist.broadcast(b, src=SIZE - 1)
    same(b, (torch.arange(12, dtype=torch.int64).view(3, 4) + SIZE - 1).t(), "broadcast non-contiguous")
    outs = [torch.empty(4, 3).t() for _ in range(SIZE)]
    dist.all_gather(outs, (torch.arange(12.0).view(4, 3) + RANK).t())
    for r in range(SIZE):
        same(outs[r], (torch.arange(12.0).view(4, 3) + r).t(), "all_gather non-contiguous")
    out = torch.empty(SIZE * 2, 3).t()  # 3 x 2*SIZE, non-contiguous output
    src = torch.arange(6.0).view(2, 3) + RANK
    dist.all_gather_into_tensor(out.t(), src)  # contiguous again; and the stacked view checks layout
    same(out.t(), torch.cat([torch.arange(6.0).view(2, 3) + r for r in range(SIZE)]), "all_gather_into_tensor")


@check
def aliased_inputs_and_outputs() -> None:
    # FSDP2's in-place all-gather: the input is this rank's slot of the output.
    out = torch.zeros(SIZE * 3)
    out[RANK * 3 : (RANK + 1) * 3] = value(RANK, torch.float32, 3)
    dist.all_gather_into_tensor(out, out[RANK * 3 : (RANK + 1) * 3])
    same(out, torch.cat([value(r, torch.float32, 3) for r in range(SIZE)]), "in-place all_gather_into_tensor")
    # reduce_scatter whose output is a slice of its own input
    buf = value(RANK, torch.int64, SIZE * 2)
    dist.reduce_scatter_tensor(buf[:2], buf)
    expected = combine(Op.SUM, torch.int64, [value(r, torch.int64, SIZE * 2)[RANK * 2 : RANK * 2 + 2] for r in range(SIZE)])
    same(buf[:2], expected, "aliased reduce_scatter_tensor")
    # all_to_all_single with input and output the same tensor
    t = torch.cat([value(100 * RANK + j, torch.int32, 2) for j in range(SIZE)])
    dist.all_to_all_single(t, t)
    same(t, torch.cat([value(100 * r + RANK, torch.int32, 2) for r in range(SIZE)]), "aliased all_to_all_single")


@check
def async_collectives_on_the_same_memory_run_in_call_order() -> None:
    # As on NCCL's one stream: a collective called on memory an earlier async one still reads or writes sees
    # that one's results (hpccomm/in_flight.py). Before, 153 of 200 pairs of 4-float all-reduces ended wrong on
    # 2 ranks. Rounds, because a race shows only in some; 16 bytes (flat MPI) and 64 KiB (shared memory on MPI).
    from torch.distributed.distributed_c10d import _coalescing_manager

    s = float(sum(r + 1 for r in range(SIZE)))  # the sum of every rank's RANK + 1
    for numel in (4, 1 << 14):
        for _ in range(25):
            t = torch.full((numel,), float(RANK + 1))
            first, second = dist.all_reduce(t, async_op=True), dist.all_reduce(t, async_op=True)
            second.wait()
            first.wait()
            same(t, torch.full((numel,), SIZE * s), "all_reduce after all_reduce")
            t = torch.full((numel,), float(RANK + 1))
            works = [dist.broadcast(t, 0, async_op=True), dist.all_reduce(t, async_op=True)]  # read and written
            out = torch.zeros(SIZE * numel)
            works.append(dist.all_gather_into_tensor(out, t, async_op=True))  # reads what both wrote
            works.append(dist.all_reduce(out, async_op=True))  # writes what the gather writes
            for work in reversed(works):
                work.wait()
            same(t, torch.full((numel,), float(SIZE)), "all_reduce after broadcast")
            same(out, torch.full((SIZE * numel,), float(SIZE * SIZE)), "all_gather, then all_reduce, of results")
            x = torch.full((SIZE * numel,), float(RANK + 1))
            y = torch.zeros(numel)
            works = [dist.reduce_scatter_tensor(y, x, async_op=True), dist.all_reduce(x, async_op=True)]
            for work in works:  # the all-reduce writes what the reduce-scatter reads
                work.wait()
            same(y, torch.full((numel,), s), "reduce_scatter_tensor, its input then all-reduced")
            same(x, torch.full((SIZE * numel,), s), "all_reduce of a reduce-scatter's input")
            # A coalesced all-gather (torch's _coalescing_manager: one call of several) after an all-reduce of its
            # input, and an all-to-all of the gathered tensor while a later all-reduce waits to write it.
            x = torch.full((numel,), float(RANK + 1))
            gathered = torch.zeros(SIZE * numel)
            works = [dist.all_reduce(x, async_op=True)]
            with _coalescing_manager(async_ops=True) as coalesced:
                dist.all_gather_into_tensor(gathered, x)
            works.append(coalesced)
            swapped = torch.zeros(SIZE * numel)
            works.append(dist.all_to_all_single(swapped, gathered, async_op=True))
            works.append(dist.all_reduce(gathered, async_op=True))
            for work in reversed(works):
                work.wait()
            same(swapped, torch.full((SIZE * numel,), s), "all_to_all_single of a coalesced all-gather's output")
            same(gathered, torch.full((SIZE * numel,), SIZE * s), "all_reduce of what an all-to-all reads")


@check
def zero_element_tensors() -> None:
    t = torch.empty(0)
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    outs = [torch.empty(0) for _ in range(SIZE)]
    dist.all_gather(outs, t)
    dist.all_gather_into_tensor(torch.empty(0), t)
    dist.reduce_scatter_tensor(torch.empty(0), torch.empty(0))
    out = torch.empty(0, 2)
    dist.all_to_all_single(out, torch.empty(0, 2), [0] * SIZE, [0] * SIZE)
    assert t.numel() == 0 and out.numel() == 0


@check
def object_collectives() -> None:
    objs = [None] * SIZE
    dist.all_gather_object(objs, {"rank": RANK, "name": f"r{RANK}"})
    assert objs == [{"rank": r, "name": f"r{r}"} for r in range(SIZE)]
    box = [{"from": "root"} if RANK == 0 else None]
    dist.broadcast_object_list(box, src=0)
    assert box == [{"from": "root"}]
    gathered = [None] * SIZE if RANK == 0 else None
    dist.gather_object(("g", RANK), gathered, dst=0)
    if RANK == 0:
        assert gathered == [("g", r) for r in range(SIZE)]
    got = [None]
    dist.scatter_object_list(got, [("s", r) for r in range(SIZE)] if RANK == 0 else None, src=0)
    assert got == [("s", RANK)]


@check
def barrier_and_monotone_sequence() -> None:
    for _ in range(3):
        dist.barrier()
    w = dist.barrier(async_op=True)
    w.wait()
    assert w.is_completed()


run_all(RANK, sys.argv[1] if len(sys.argv) > 1 else None)
dist.destroy_process_group()
