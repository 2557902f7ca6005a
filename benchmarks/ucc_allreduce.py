"""hpccomm's all_reduce on UCC, timed the way ``ucc_perftest`` times UCC's own.

    HPCCOMM_TRANSPORT=ucc hpccomm-run -n 2 python benchmarks/ucc_allreduce.py [--counts 1,262144] [--iters N]

and, just before or after, in the same sitting (UCC's benchmark, from the UCC
installation, under the MPI it was built with)::

    mpirun -n 2 $UCC_HOME/bin/ucc_perftest -c allreduce -b 1 -e 16777216 -d float32 -o sum -i -F

ucc_perftest times each iteration from ``ucc_collective_init`` to
``ucc_collective_finalize`` after a UCC barrier, averages over iterations on
each rank, and prints the mean of those over ranks (its ``avg`` column, from
which its ``avg`` bus bandwidth comes). This does the same for
``dist.all_reduce`` (float32 SUM, in place, as ``-i``): a ``dist.barrier()``
(UCC's barrier, through hpccomm), then one timed blocking all_reduce; 100
warm-up and 1,000 timed iterations below 64 KiB, 20 and 200 from there
(perftest's defaults). It prints per element count the mean over ranks of
each rank's mean time (perftest's ``avg``), the median over iterations of the
slowest rank, and the bus bandwidth of the mean: 2 (n-1)/n x bytes / time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from hpccomm.groups import front_of

#: perftest's switch from small to large iteration counts, in bytes.
LARGE_BYTES = 64 * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,256,16384,262144,1048576,4194304,16777216",
                        help="float32 elements per all_reduce (perftest's -b/-e are counts too)")
    parser.add_argument("--iters", type=int, default=0, help="timed iterations (default: perftest's)")
    args = parser.parse_args()

    dist.init_process_group("hpccomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        route = type(front_of(dist.group.WORLD)._transports["cpu"]).__name__
        print(f"# {size} ranks, host tensors on {route}; float32 SUM in place; times in us")
        print(f"{'count':>10} {'bytes':>10} {'avg_us':>10} {'median_us':>10} {'busbw_GB/s':>11}")
    for count in map(int, args.counts.split(",")):
        nbytes = 4 * count
        warmup, iters = (100, 1000) if nbytes < LARGE_BYTES else (20, 200)
        iters = args.iters or iters
        tensor = torch.zeros(count)
        times = []
        for i in range(warmup + iters):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        means = [None] * size
        dist.all_gather_object(means, (statistics.fmean(times), statistics.median(times)))
        if rank == 0:
            avg = statistics.fmean(mean for mean, _ in means)
            median = max(med for _, med in means)
            busbw = nbytes * 2 * (size - 1) / size / avg / 1e9
            print(f"{count:>10} {nbytes:>10} {avg * 1e6:>10.2f} {median * 1e6:>10.2f} {busbw:>11.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
