"""The node-local shared-memory all-reduce: chunking, ordering, identical results, cleanup.

Run under ``hpccomm-run -n N`` with HPCCOMM_SHM_MIN_BYTES=1 and a small
HPCCOMM_SHM_SLOT_BYTES, so small tensors take the shared-memory path in many
chunks; the every-collective checker covers every dtype and op that way too
(tests/test_shm.py).
"""

from __future__ import annotations

import os

import hpccomm  # noqa: F401  (registers the backend)
import torch
import torch.distributed as dist
from hpccomm.transports import half_reduce
from hpccomm.transports.shm import SharedMemoryChannel
from rankcheck import check, run_all

dist.init_process_group("hpccomm")
RANK, SIZE = dist.get_rank(), dist.get_world_size()
KINDS = {
    dist.ReduceOp.SUM: torch.add,
    dist.ReduceOp.PRODUCT: torch.mul,
    dist.ReduceOp.MIN: torch.minimum,
    dist.ReduceOp.MAX: torch.maximum,
}
DTYPES = (
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.complex64,
    torch.complex128,
)


def channel(group=None) -> SharedMemoryChannel | None:
    pg = group if group is not None else dist.group.WORLD
    return pg._cpu_transport._shm


def data(rank: int, numel: int, dtype: torch.dtype, kind) -> torch.Tensor:
    """Small integers (exact in every dtype), different per rank and position."""
    gen = torch.Generator().manual_seed(1000 + rank)
    low, high = (-1, 2) if kind == dist.ReduceOp.PRODUCT else (-4, 5)
    if dtype == torch.uint8:
        low, high = 0, high - low
    values = torch.randint(low, high, (numel,), generator=gen)
    if dtype.is_complex:
        values = torch.complex(values.double(), torch.randint(low, high, (numel,), generator=gen).double())
    return values.to(dtype)


def expected(numel: int, dtype: torch.dtype, kind) -> torch.Tensor:
    want = data(0, numel, dtype, kind)
    for r in range(1, SIZE):
        want = KINDS[kind](want, data(r, numel, dtype, kind))
    return want


@check
def groups_on_one_node_get_a_channel():
    assert channel() is not None, "the world group has no shared-memory channel"
    sub = dist.new_group([0, 1])
    if RANK in (0, 1):
        assert channel(sub) is not None, "a two-rank subgroup has no channel"
    dist.destroy_process_group(sub)


@check
def all_reduce_in_many_chunks_matches_local_values():
    wrong = []
    for dtype in DTYPES:
        per_chunk = channel().chunk_bytes // dtype.itemsize
        # Around chunk boundaries, more chunks than a slot holds, fewer elements than ranks, and
        # large enough for larger chunks (odd-sized, then a whole buffer each).
        for numel in (1, SIZE - 1 or 1, per_chunk - 1, per_chunk, per_chunk + 1, 9 * per_chunk + 7,
                      40 * per_chunk + 3, 100 * per_chunk + 1):
            for kind in KINDS:
                if dtype.is_complex and kind != dist.ReduceOp.SUM:
                    continue  # rejected before any communication (tests/ranks/collectives.py)
                t = data(RANK, numel, dtype, kind)
                before = channel().chunks_posted
                dist.all_reduce(t, op=kind)
                # 16-bit floats take the shared-memory path only where a compiled kernel serves them
                # (bfloat16 has none without AVX-512; HPCCOMM_HALF_KERNELS=torch turns them off).
                shared = dtype not in half_reduce.HALF_DTYPES or half_reduce.path(dtype) != "torch"
                if (channel().chunks_posted != before) != shared:
                    wrong.append(f"{dtype} n={numel} {kind}: shared-memory path taken: {not shared}")
                if not torch.equal(t, expected(numel, dtype, kind)):
                    wrong.append(f"{dtype} n={numel} {kind}")
    assert not wrong, f"{len(wrong)} wrong, first: {wrong[:5]}"


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
def async_all_reduces_complete_in_any_wait_order_among_other_collectives():
    tensors = [torch.full((5000,), float(RANK + i)) for i in range(6)]
    works = []
    for i, t in enumerate(tensors):
        works.append(dist.all_reduce(t, async_op=True))
        if i % 2:
            b = torch.full((3,), float(RANK))
            dist.broadcast(b, src=0)  # an MPI collective between them
            assert torch.equal(b, torch.zeros(3))
    for work in reversed(works):
        work.wait()
    for i, t in enumerate(tensors):
        assert torch.all(t == sum(r + i for r in range(SIZE))), f"tensor {i}"
    fut = dist.all_reduce(torch.ones(7000), async_op=True).get_future()
    (value,) = fut.wait()
    assert torch.all(value == SIZE)


@check
def the_segment_leaves_no_file_behind():
    leftovers = [name for name in os.listdir("/dev/shm") if name.startswith("hpccomm-")]
    mine = [name for name in leftovers if name.split("-")[1] in {str(os.getpid())}]
    assert not mine, f"segment files left in /dev/shm: {mine}"


@check
def destroy_and_init_again_gets_a_working_channel():
    dist.destroy_process_group()
    dist.init_process_group("hpccomm")
    assert channel() is not None
    t = torch.full((9000,), float(RANK))
    dist.all_reduce(t)
    assert torch.all(t == sum(range(SIZE)))


if __name__ == "__main__":
    run_all(RANK)
