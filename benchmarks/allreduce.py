"""all_reduce latency and bus bandwidth: raw mpi4py vs hpccomm vs gloo, one run, same buffers.

    hpccomm-run -n 2 python benchmarks/allreduce.py [--sizes 4,1048576] [--iters N] [--block K]

For each message size the contenders (raw mpi4py ``Allreduce``, hpccomm
float32, hpccomm bfloat16 with the same element count, and gloo) take turns in
rounds, in an order shuffled each round (the same order on every rank), over
the same tensors: this machine's noise comes in phases of seconds, and short
rounds spread each phase over all of them alike. In a round each contender
makes ``--block`` calls in a row (8; a round of 4 MiB calls takes ~10 ms), so
the medians are of back-to-back calls, as in OSU's and nccl-tests' loops:
with ``--block 1`` each call instead inherits the caches another library left
(raw MPI's 4 MiB all-reduce pushes out hpccomm's segment and the bfloat16
tensor, but warms the float32 tensor, which it shares), which moves the
bf16/fp32 ratio at 4 MiB from ~0.55 to ~0.6-0.7. Reports medians and same-run
ratios:

* latency ratio hpccomm / raw mpi4py (target at 4 B: <= 8x);
* busbw ratio hpccomm / raw (target at >= 1 MiB: >= 0.95);
* bf16 time / fp32 time for the same element count (target at >= 1 MiB: <= 0.6).

busbw = 2 (n-1)/n x bytes / time, the usual all-reduce bus bandwidth.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from mpi4py import MPI

DEFAULT_SIZES = [4, 1024, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def iterations_for(nbytes: int) -> int:
    """Enough calls for stable medians: ~2,000 for small messages, 20 at 64 MiB."""
    return max(20, min(2000, (1 << 30) // max(nbytes, 1) // 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="bytes of float32 per message")
    parser.add_argument("--iters", type=int, default=0, help="calls per contender (default: by size)")
    parser.add_argument("--block", type=int, default=8, help="calls in a row per contender and round")
    parser.add_argument("--gloo-every", type=int, default=10, help="time gloo on every k-th round")
    parser.add_argument("--no-gloo", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("hpccomm")
    gloo = None if args.no_gloo else dist.new_group(backend="gloo")
    comm = MPI.COMM_WORLD
    size = comm.size
    if comm.rank == 0:
        print(f"# {size} ranks, {MPI.Get_library_version().splitlines()[0]}")
        print(
            "| size | raw mpi4py | hpccomm | gloo | hpccomm/raw | busbw raw | busbw hpccomm | busbw ratio "
            "| gloo/hpccomm | bf16 hpccomm | bf16/fp32 |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    for nbytes in (int(s) for s in args.sizes.split(",")):
        numel = max(1, nbytes // 4)
        iters = args.iters or iterations_for(nbytes)
        f32 = torch.ones(numel)
        bf16 = torch.ones(numel, dtype=torch.bfloat16)
        array = f32.numpy()
        calls = {
            "raw": lambda: comm.Allreduce(MPI.IN_PLACE, array, MPI.SUM),
            "hpccomm": lambda: dist.all_reduce(f32),
            "bf16": lambda: dist.all_reduce(bf16),
            "gloo": lambda: dist.all_reduce(f32, group=gloo),
        }
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for fn in calls.values():  # warm-up: connections, MPI ops, caches
            if fn is not calls["gloo"] or gloo is not None:
                for _ in range(3):
                    fn()
        comm.Barrier()
        for i in range(-(-iters // args.block)):
            order = [n for n in calls if n != "gloo" or (gloo is not None and i % args.gloo_every == 0)]
            random.Random(i).shuffle(order)  # same seed, same order on every rank
            for name in order:
                for _ in range(args.block):
                    start = time.perf_counter()
                    calls[name]()
                    samples[name].append(time.perf_counter() - start)
            f32.fill_(1.0)  # keep values bounded (ones double each call)
            bf16.fill_(1.0)
        med = {k: statistics.median(v) if v else float("nan") for k, v in samples.items()}
        factor = 2 * (size - 1) / size if size > 1 else 1.0
        busbw = {k: factor * numel * 4 / med[k] / 1e9 for k in ("raw", "hpccomm")}
        if comm.rank == 0:
            print(
                f"| {numel * 4} B | {med['raw'] * 1e6:.1f} us | {med['hpccomm'] * 1e6:.1f} us | "
                f"{med['gloo'] * 1e6:.1f} us | {med['hpccomm'] / med['raw']:.2f}x | {busbw['raw']:.2f} GB/s | "
                f"{busbw['hpccomm']:.2f} GB/s | {busbw['hpccomm'] / busbw['raw']:.2f} | "
                f"{med['gloo'] / med['hpccomm']:.1f}x | {med['bf16'] * 1e6:.1f} us | {med['bf16'] / med['hpccomm']:.2f} |",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
