"""Topology-aware collectives vs flat MPI vs raw mpi4py: time and bus bandwidth, one run, same buffers.

    hpccomm-run -n 4 python benchmarks/topology.py [--ops all_gather_into_tensor,...] [--sizes 1048576,...]

On one node the topology-aware path is shared memory; across nodes (run it
under srun or a multi-node mpirun) it is the hierarchy. For every collective
and size, three contenders take turns in rounds of ``--block`` calls, in an
order shuffled each round (the same on every rank), over the same tensors:

* ``raw``: mpi4py's blocking collective on numpy views of the tensors;
* ``flat``: hpccomm with every call on MPI's collectives (``HPCCOMM_ALGO=flat``);
* ``aware``: hpccomm's topology-aware path at every size (``HPCCOMM_ALGO=hier``);
* ``auto``: hpccomm as shipped, the selector choosing by size.

It prints medians and same-run ratios, including aware/flat time (where the
selector's thresholds come from: the smallest size from which aware wins).
Bus bandwidth follows nccl-tests: all-reduce 2(n-1)/n x bytes / time,
all-gather and reduce-scatter (n-1)/n x total bytes / time, broadcast and
reduce bytes / time. Sizes are the larger buffer of each collective (see
hpccomm.transports.collective_paths).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import hpccomm
import numpy as np
import torch
import torch.distributed as dist
from hpccomm.groups import front_of
from hpccomm.transports.collective_paths import Selector
from hpccomm.transports.topology_aware import TopologyAwareTransport
from mpi4py import MPI

DEFAULT_SIZES = [4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
OPS = ["all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "all_gather", "reduce_scatter_tensor", "reduce_scatter"]


def iterations_for(nbytes: int) -> int:
    """Enough calls for stable medians: ~400 for small messages, 16 at 64 MiB."""
    return max(16, min(400, (1 << 30) // max(nbytes, 1) // 16))


def bus_factor(op: str, size: int) -> float:
    if op == "all_reduce":
        return 2 * (size - 1) / size
    if op.startswith(("all_gather", "reduce_scatter")):
        return (size - 1) / size
    return 1.0


def contenders(op: str, nbytes: int, comm: MPI.Comm, size: int, rank: int) -> dict[str, Callable[[], object]]:
    """The calls to time for one collective and size; every contender uses the same tensors."""
    numel = max(size, nbytes // 4) // size * size  # divisible by the rank count
    block = numel // size
    big = torch.ones(numel)
    small = torch.ones(block)
    outs = list(big.view(size, block).unbind(0))
    arr_big, arr_small = big.numpy(), small.numpy()
    if op == "all_reduce":
        raw = lambda: comm.Allreduce(MPI.IN_PLACE, arr_big, MPI.SUM)  # noqa: E731
        ours = lambda: dist.all_reduce(big)  # noqa: E731
    elif op == "broadcast":
        raw = lambda: comm.Bcast(arr_big, root=0)  # noqa: E731
        ours = lambda: dist.broadcast(big, src=0)  # noqa: E731
    elif op == "reduce":
        scratch = np.empty_like(arr_big) if rank == 0 else None
        raw = lambda: comm.Reduce(arr_big, scratch, MPI.SUM, root=0)  # noqa: E731
        ours = lambda: dist.reduce(big, dst=0)  # noqa: E731
    elif op == "all_gather_into_tensor":
        raw = lambda: comm.Allgather(arr_small, arr_big)  # noqa: E731
        ours = lambda: dist.all_gather_into_tensor(big, small)  # noqa: E731
    elif op == "all_gather":
        raw = lambda: comm.Allgather(arr_small, arr_big)  # noqa: E731
        ours = lambda: dist.all_gather(outs, small)  # noqa: E731
    elif op == "reduce_scatter_tensor":
        raw = lambda: comm.Reduce_scatter_block(arr_big, arr_small, MPI.SUM)  # noqa: E731
        ours = lambda: dist.reduce_scatter_tensor(small, big)  # noqa: E731
    elif op == "reduce_scatter":
        raw = lambda: comm.Reduce_scatter_block(arr_big, arr_small, MPI.SUM)  # noqa: E731
        ours = lambda: dist.reduce_scatter(small, outs)  # noqa: E731
    else:
        raise ValueError(f"unknown op {op}")
    return {"raw": raw, "flat": ours, "aware": ours, "auto": ours}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="bytes of float32")
    parser.add_argument("--block", type=int, default=4, help="calls in a row per contender and round")
    parser.add_argument("--iters", type=int, default=0, help="calls per contender (default: by size)")
    args = parser.parse_args()

    dist.init_process_group("hpccomm")
    transport = front_of(dist.group.WORLD)._cpu_transport
    if not isinstance(transport, TopologyAwareTransport):
        raise SystemExit("this group has no topology-aware path (one rank per node, uneven nodes, shm off, or HPCCOMM_ALGO=flat)")
    path = transport.path
    # "auto" is the group's own selector, as shipped (its thresholds depend on the node's cache).
    selectors = {"flat": Selector(path, algo="flat"), "aware": Selector(path, algo="hier"), "auto": transport.selector}
    comm = MPI.COMM_WORLD
    size, rank = comm.size, comm.rank
    topo = hpccomm.topology()
    if rank == 0:
        print(f"# {size} ranks on {topo.num_nodes} node(s), path '{path}', {MPI.Get_library_version().splitlines()[0]}")
        print("| op | size | raw | flat | aware | auto | busbw raw | busbw aware | aware/raw busbw | aware/flat time | auto/flat time |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    for op in args.ops.split(","):
        for nbytes in (int(s) for s in args.sizes.split(",")):
            calls = contenders(op, nbytes, comm, size, rank)
            samples: dict[str, list[float]] = {name: [] for name in calls}
            for name, fn in calls.items():  # warm-up: connections, caches, segment pages
                if name in selectors:
                    transport.selector = selectors[name]
                for _ in range(3):
                    fn()
            comm.Barrier()
            iters = args.iters or iterations_for(nbytes)
            for i in range(-(-iters // args.block)):
                order = list(calls)
                random.Random(i).shuffle(order)  # same seed, same order on every rank
                for name in order:
                    if name in selectors:
                        transport.selector = selectors[name]
                    for _ in range(args.block):
                        start = time.perf_counter()
                        calls[name]()
                        samples[name].append(time.perf_counter() - start)
            med = {name: statistics.median(v) for name, v in samples.items()}
            # The slowest rank's median: a collective is as fast as its slowest rank.
            med = {name: comm.allreduce(t, op=MPI.MAX) for name, t in med.items()}
            factor = bus_factor(op, size)
            busbw = {name: factor * nbytes / t / 1e9 for name, t in med.items()}
            if rank == 0:
                print(
                    f"| {op} | {_size(nbytes)} | {_us(med['raw'])} | {_us(med['flat'])} | {_us(med['aware'])} | "
                    f"{_us(med['auto'])} | {busbw['raw']:.2f} GB/s | {busbw['aware']:.2f} GB/s | "
                    f"{busbw['aware'] / busbw['raw']:.2f} | {med['aware'] / med['flat']:.2f} | {med['auto'] / med['flat']:.2f} |",
                    flush=True,
                )
    transport.selector = selectors["auto"]
    dist.destroy_process_group()


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-2 else f"{seconds * 1e3:.1f} ms"


def _size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


if __name__ == "__main__":
    main()
