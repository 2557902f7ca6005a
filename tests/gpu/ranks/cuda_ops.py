"""CUDA tensors on hpccomm, on a GPU: values, stream ordering, lifetime, overlap, failures, DDP, FSDP2.

Run by tests/gpu/test_cuda.py (2 ranks; both may share one GPU), once per
CUDA path (the environment picks it: HPCCOMM_TRANSPORT,
HPCCOMM_CUDA_STAGED_MAX_BYTES). Each rank uses the device hpccomm picks
(``cuda:LOCAL_RANK % count``). Usage: cuda_ops.py [name-filter]
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ranks"))  # tests/ranks: rankcheck, expected
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))  # cuda_call_stages: StageStamps

import hpccomm  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from cuda_call_stages import StageStamps  # noqa: E402
from expected import ALL, combine, inputs, same, torch_op, valid_ops  # noqa: E402
from rankcheck import check, expect_error, run_all  # noqa: E402

dist.init_process_group("hpccomm")
RANK, SIZE = dist.get_rank(), dist.get_world_size()
LOCAL_RANK = hpccomm.topology().local_rank
DEVICE = torch.device("cuda", torch.cuda.current_device())


def on_gpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(DEVICE)


@check
def each_rank_uses_its_local_ranks_device() -> None:
    assert DEVICE.index == LOCAL_RANK % torch.cuda.device_count(), (DEVICE, LOCAL_RANK)


@check
def all_reduce_every_dtype_and_reduce_op() -> None:
    for dtype in ALL:
        for op in valid_ops(dtype):
            values = inputs(dtype, op, SIZE)
            t = on_gpu(values[RANK])
            dist.all_reduce(t, op=torch_op(op))
            same(t.cpu(), combine(op, dtype, values), f"all_reduce {dtype} {op}")


@check
def all_reduce_sizes_from_empty_to_64_mib() -> None:
    for numel in (0, 1, 1001, 1024, 1 << 18, 1 << 24):
        t = torch.full((numel,), float(RANK + 1), device=DEVICE)
        dist.all_reduce(t)
        assert bool((t == SIZE * (SIZE + 1) / 2).all()), (numel, t[:4])


@check
def in_place_reductions_through_the_scratch_are_counted_and_freed_with_the_group() -> None:
    # UCC on device memory (HPCCOMM_UCC_IN_PLACE=scratch, the default): an 8 MiB all-reduce writes
    # into the group's scratch, from torch's allocator, which the group gives back when destroyed.
    from hpccomm.config import settings

    if os.environ.get("HPCCOMM_TRANSPORT") != "cuda:ucc" or settings.ucc_in_place != "scratch":
        return
    group = dist.new_group(list(range(SIZE)))
    t = torch.full((1 << 21,), float(RANK + 1), device=DEVICE)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(DEVICE)
    for _ in range(3):  # reused: one buffer, not three
        dist.all_reduce(t, group=group)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated(DEVICE) - before
    assert t.nbytes <= held < 2 * t.nbytes, (held, t.nbytes)
    assert bool((t == (SIZE * (SIZE + 1) / 2) * SIZE**2).all()), t[:4]
    dist.destroy_process_group(group)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated(DEVICE) == before, (torch.cuda.memory_allocated(DEVICE), before)


@check
def every_other_collective_and_point_to_point() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        mine = torch.full((5,), RANK + 1, dtype=dtype, device=DEVICE)
        root = SIZE - 1
        b = mine.clone()
        dist.broadcast(b, src=root)
        assert bool((b == root + 1).all()), b
        r = mine.clone()
        dist.reduce(r, dst=0)
        if RANK == 0:
            assert bool((r == SIZE * (SIZE + 1) // 2).all()), r
        outs = [torch.empty_like(mine) for _ in range(SIZE)]
        dist.all_gather(outs, mine)
        assert [int(o[0]) for o in outs] == [k + 1 for k in range(SIZE)], outs
        flat = torch.empty(5 * SIZE, dtype=dtype, device=DEVICE)
        dist.all_gather_into_tensor(flat, mine)
        assert flat.view(SIZE, 5)[:, 0].tolist() == [k + 1 for k in range(SIZE)], flat
        piece = torch.empty(5, dtype=dtype, device=DEVICE)
        dist.reduce_scatter_tensor(piece, torch.ones(5 * SIZE, dtype=dtype, device=DEVICE))
        assert bool((piece == SIZE).all()), piece
        swapped = torch.empty(SIZE, dtype=dtype, device=DEVICE)
        dist.all_to_all_single(swapped, torch.full((SIZE,), RANK, dtype=dtype, device=DEVICE))
        assert swapped.tolist() == list(range(SIZE)), swapped
        gathered = [torch.empty_like(mine) for _ in range(SIZE)] if RANK == 0 else None
        dist.gather(mine, gathered, dst=0)
        if RANK == 0:
            assert [int(g[0]) for g in gathered] == [k + 1 for k in range(SIZE)], gathered
        got = torch.empty_like(mine)
        dist.scatter(got, [torch.full((5,), k, dtype=dtype, device=DEVICE) for k in range(SIZE)] if RANK == 0 else None,
                     src=0)
        assert bool((got == RANK).all()), got
        right, left = (RANK + 1) % SIZE, (RANK - 1) % SIZE
        incoming = torch.empty_like(mine)
        for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, right), dist.P2POp(dist.irecv, incoming, left)]):
            req.wait()
        assert bool((incoming == left + 1).all()), incoming
    dist.barrier()


@check
def non_contiguous_tensors() -> None:
    base = torch.arange(12, dtype=torch.float32, device=DEVICE).view(3, 4) + RANK
    t = base.t()
    dist.all_reduce(t)
    expected = sum(torch.arange(12, dtype=torch.float32).view(3, 4) + k for k in range(SIZE)).t()
    assert torch.equal(t.cpu(), expected), t


@check
def a_producer_on_a_side_stream_and_a_consumer_after_wait_no_host_sync() -> None:
    # 1,000 loops: a slow kernel then a fill on a side stream, the collective on the current stream
    # (which waits for the side stream), a consumer right after. The host never synchronises until the end.
    side = torch.cuda.Stream(device=DEVICE)
    x = torch.zeros(1 << 10, device=DEVICE)
    results = torch.empty(1000, device=DEVICE)
    for i in range(1000):
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000)  # cycles: the fill lands late unless the collective waits for it
            x.fill_(float(RANK + i))
        torch.cuda.current_stream().wait_stream(side)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        results[i] = x[0] * 1  # the consumer, queued on the current stream
    expected = torch.tensor([float(sum(k + i for k in range(SIZE))) for i in range(1000)])
    assert torch.equal(results.cpu(), expected), (results[:4], expected[:4])


@check
def tensors_dropped_after_an_async_call_still_get_right_results() -> None:
    works = []
    for i in range(50):
        t = torch.full((1 << 16,), float(RANK + i), device=DEVICE)
        works.append(dist.all_reduce(t, async_op=True).get_future())
        del t  # the caller's last reference
        torch.full((1 << 16,), -1.0, device=DEVICE)  # allocate and scribble where it was
    for i, future in enumerate(works):
        value = future.wait()[0]
        assert bool((value == sum(k + i for k in range(SIZE))).all()), (i, value[:4])


@check
def async_collectives_keep_call_order_on_one_tensor_and_end_before_a_barrier() -> None:
    # As NCCL's one stream orders them: the second all-reduce reads the first one's results, which land on
    # hpccomm's side stream (hpccomm/in_flight.py; on the CPU: tests/ranks/collectives.py, device_paths.py).
    # Sizes either side of the staged path's limit: both paths where UCC serves the larger.
    s = float(sum(r + 1 for r in range(SIZE)))
    for numel in (4, 1 << 20):
        for _ in range(10):
            t = torch.full((numel,), float(RANK + 1), device=DEVICE)
            first, second = dist.all_reduce(t, async_op=True), dist.all_reduce(t, async_op=True)
            second.wait()
            first.wait()
            assert bool((t == SIZE * s).all()), (numel, t[:4])
        # And a barrier ends after the group's earlier collectives, as NCCL's (its stream) and Gloo's do.
        t = torch.full((numel,), float(RANK + 1), device=DEVICE)
        work = dist.all_reduce(t, async_op=True)
        dist.barrier()
        assert work.is_completed(), f"an all-reduce of {numel} floats still running after the barrier"
        assert bool((t == s).all()), (numel, t[:4])


@check
def the_compute_stream_runs_while_the_collective_does() -> None:
    # On an H100 (UCC path) work.wait() returned only after a kernel the caller queued after the
    # call. Timed stage by stage, on the default (legacy) stream and on a stream of the caller's own,
    # so that a failure names the stage that waited for the kernel: on the host-gated UCC path, "posted"
    # (UCC's post: the caller's stream reached the gate) and "ended" (UCC's request ended and the local
    # steps were queued), in ms since the call; other paths have neither.
    completes_before_the_kernel_queued_after_it(later_call=False)


@check
def results_land_before_a_kernel_queued_ahead_of_a_later_call() -> None:
    # The same with a second, small call after the kernel (DDP's next bucket), whose inputs wait for the
    # kernel on a stream of hpccomm's: the first one's results must not land behind it (until 2026-12-06 the
    # staged path's copies back and the host-gated path's local steps shared that stream; caught on the CPU by
    # tests/ranks/device_paths.py, never run on a GPU before).
    completes_before_the_kernel_queued_after_it(later_call=True)


def completes_before_the_kernel_queued_after_it(later_call: bool) -> None:
    """An async all-reduce, a 0.5 s kernel queued after it (and a small async all-reduce after that, where
    ``later_call``): the first completes before the kernel ends, on both kinds of stream, with right values."""
    late = []
    for name, stream in (("default stream", torch.cuda.default_stream(DEVICE)),
                         ("a stream of the caller's", torch.cuda.Stream(device=DEVICE))):
        with torch.cuda.stream(stream):
            t = torch.ones(1 << 20, device=DEVICE)
            small = torch.ones(1, device=DEVICE)
            stream.synchronize()
            with StageStamps() as stamps:
                stamps.call()
                work = dist.all_reduce(t, async_op=True)
                torch.cuda._sleep(1_000_000_000)  # about 0.5 s: far beyond the collective
                slept = torch.cuda.Event()
                slept.record(stream)
                later = dist.all_reduce(small, async_op=True) if later_call else None
                completed = kernel_ended = None
                while completed is None:  # polled: is_completed() drives the work as wait() would
                    kernel_done = slept.query()  # before the work's poll: a late kernel is never missed
                    if work.is_completed():
                        completed = stamps.ms_since_call()
                    if kernel_done and kernel_ended is None:
                        kernel_ended = stamps.ms_since_call()
                    time.sleep(0.0005)
                work.wait()
                if later is not None:
                    later.wait()
            if kernel_ended is not None:
                late.append(f"{name}: the work completed {completed:.0f} ms after the call, the kernel queued after "
                            f"it ended at {kernel_ended:.0f} ms; stages {stamps.stages_ms()}")
            stream.synchronize()
            assert bool((t == SIZE).all()), (name, t[:4])
            assert small.item() == (SIZE if later_call else 1), (name, small.item())
    assert not late, "the host waited for the compute stream: " + " | ".join(late)


@check
def the_profiler_shows_each_operation_and_the_gpu_work_inside_it() -> None:
    # hpccomm/profiling.py on a GPU (never run on one before this check): each operation's span and its
    # metadata event on the calling thread, and the GPU work the operation caused (the staged path's copies,
    # UCC's kernels) inside the span, on the device's rows of the trace.
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    t = torch.ones(1 << 20, device=DEVICE)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as recorded:
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        recorded.export_chrome_trace(trace.name)
        events = [e for e in json.load(open(trace.name))["traceEvents"] if e.get("ph") == "X"]
    spans = sorted((e for e in events if e["name"] == "hpccomm:all_reduce"), key=lambda e: e["ts"])
    metadata = [e for e in events if e["name"] == "hpccomm:record_param_comms"]
    assert len(spans) == 2 and len(metadata) == 2, [e["name"] for e in events if e["name"].startswith("hpccomm")]
    paths = {e["args"].get("Path") for e in metadata}
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    inside = [e["name"] for e in gpu if spans[0]["ts"] <= e["ts"] <= spans[0]["ts"] + spans[0]["dur"]]
    assert inside, (f"path {paths}: no GPU work inside the blocking all-reduce's span; GPU events: "
                    f"{sorted({e['name'] for e in gpu})[:10]}")
    assert bool((t == SIZE ** 3).all()), t[:4]


@check
def graph_capture_is_refused_with_a_clear_error() -> None:
    t = torch.ones(4, device=DEVICE)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream(device=DEVICE)
    with torch.cuda.stream(stream):
        try:
            with torch.cuda.graph(graph, stream=stream):
                expect_error(RuntimeError, "graph capture", lambda: dist.all_reduce(t))
        except RuntimeError as exc:  # the capture itself may end in error once the op refused
            assert "graph capture" in str(exc) or "capture" in str(exc), exc
    dist.barrier()


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(DEVICE)


def train_beside_one_process(model: torch.nn.Module, steps: int) -> torch.nn.Module:
    """Train ``model`` (this rank's rows RANK::SIZE) and one process's copy (every row) alike; return the copy."""
    reference = make_model()
    solo = torch.optim.SGD(reference.parameters(), lr=0.05)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        data = torch.randn(8 * SIZE, 16, generator=generator).to(DEVICE)
        target = torch.randn(8 * SIZE, 4, generator=generator).to(DEVICE)
        solo.zero_grad()
        torch.nn.functional.mse_loss(reference(data), target).backward()
        solo.step()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(data[RANK::SIZE]), target[RANK::SIZE]).backward()
        optimizer.step()
    return reference


@check
def ddp_on_cuda_matches_single_process_training() -> None:
    model = torch.nn.parallel.DistributedDataParallel(make_model(), device_ids=[DEVICE.index])
    reference = train_beside_one_process(model, steps=20)
    for a, b in zip(reference.parameters(), model.module.parameters()):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


@check
def fsdp2_on_a_cuda_device_mesh_matches_single_process_training() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    mesh = init_device_mesh("cuda", (SIZE,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    reference = train_beside_one_process(model, steps=5)
    for a, b in zip(reference.parameters(), model.parameters()):
        full = b.full_tensor().detach()
        assert torch.allclose(a, full, atol=1e-5, rtol=1e-4), (a - full).abs().max()


@check
def a_graph_captured_while_an_async_collective_is_in_flight_stands() -> None:
    # torch.cuda.graph captures in "global" mode by default: meanwhile CUDA refuses an event query or a pinned
    # allocation from every other thread of the process still in that mode, and the capture breaks. hpccomm's
    # progress thread polls the events of async work; it is kept out of other threads' captures (thread-local
    # mode). Written 2026-12-06 without a GPU; its CPU counterpart is in tests/ranks/device_paths.py.
    from hpccomm.progress import engine

    assert engine().enabled, "no progress thread (MPI_THREAD_MULTIPLE): nothing of hpccomm's polls meanwhile"
    t = torch.ones(1 << 20, device=DEVICE)
    static = torch.zeros(16, device=DEVICE)
    side = torch.cuda.Stream(device=DEVICE)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        static.add_(0)  # the kernel loaded before the capture (torch's advice: warm up on a side stream)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda._sleep(1_000_000_000)  # about 0.5 s: the all-reduce's inputs wait for it, its events stay pending
    work = dist.all_reduce(t, async_op=True)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(side):
            graph.capture_begin(capture_error_mode="global")
            try:
                static.add_(1)
                time.sleep(0.3)  # the progress thread polls meanwhile
            finally:
                graph.capture_end()  # raises where the capture was broken
    finally:
        try:
            work.wait()  # a broken capture may have failed the work too: never leave the other rank in it
        finally:
            dist.barrier()
    graph.replay()
    assert static.tolist() == [1.0] * 16, static
    assert bool((t == SIZE).all()), t[:4]


@check
def a_missing_peer_times_out() -> None:
    # Last: where it hangs (it did on an H100, inside ucc_collective_init), the rank ends with it.
    group = dist.new_group(list(range(SIZE)), timeout=timedelta(seconds=3))
    if RANK == 0:
        expect_error(RuntimeError, "Timed out", lambda: dist.all_reduce(torch.ones(4, device=DEVICE), group=group))
    dist.barrier()


os.environ.setdefault("RANKCHECK_TRACE", "1")
run_all(RANK, sys.argv[1] if len(sys.argv) > 1 else None)
