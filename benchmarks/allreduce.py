"""all_reduce latency and bus bandwidth: raw mpi4py vs hpccomm vs gloo, one run, same buffers.

    hpccomm-run -n 2 python benchmarks/allreduce.py [--sizes 4,1048576] [--reps 200]

For each message size, the three contenders (and hpccomm bfloat16 with the
same element count) run in interleaved rounds over the same tensors, so the
machine's noise hits them alike. Reports medians and same-run ratios:

* latency ratio hpccomm / raw mpi4py (target at 4 B: <= 8x);
* busbw ratio hpccomm / raw (target at >= 1 MiB: >= 0.95);
* bf16 time / fp32 time for the same element count (target at >= 1 MiB: <= 0.6).

busbw = 2 (n-1)/n x bytes / time, the usual all-reduce bus bandwidth.
"""

from __future__ import annotations

import argparse
import statistics
import time

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from mpi4py import MPI

DEFAULT_SIZES = [4, 1024, 65536, 1 << 20, 16 << 20, 64 << 20]


def timed(fn, reps: int, comm) -> list[float]:
    """Per-call seconds for ``reps`` calls, after warm-up, started together."""
    for _ in range(max(3, reps // 10)):
        fn()
    comm.Barrier()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="bytes of float32 per message")
    parser.add_argument("--reps", type=int, default=0, help="calls per round (default: by size)")
    parser.add_argument("--rounds", type=int, default=5)
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
        reps = args.reps or max(10, min(5000, (64 << 20) // max(nbytes, 1) // 8))
        f32 = torch.ones(numel)
        bf16 = torch.ones(numel, dtype=torch.bfloat16)
        array = f32.numpy()
        samples: dict[str, list[float]] = {"raw": [], "hpccomm": [], "gloo": [], "bf16": []}
        for _ in range(args.rounds):
            samples["raw"] += timed(lambda: comm.Allreduce(MPI.IN_PLACE, array, MPI.SUM), reps, comm)
            samples["hpccomm"] += timed(lambda: dist.all_reduce(f32), reps, comm)
            samples["bf16"] += timed(lambda: dist.all_reduce(bf16), reps, comm)
            if gloo is not None:
                samples["gloo"] += timed(lambda: dist.all_reduce(f32, group=gloo), max(3, reps // 10), comm)
            # keep values bounded
            f32.fill_(1.0)
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
