"""CUDA all_reduce: hpccomm against Gloo on the same CUDA tensors, interleaved, on a GPU.

    hpccomm-run -n 2 python benchmarks/cuda_allreduce.py [--sizes 4,4096,1048576,67108864] [--rounds 7]

Per size (bytes of float32), each round times ``--iters`` blocking
``dist.all_reduce`` calls of each backend in turn, ending with
``torch.cuda.synchronize()`` so that every byte has landed, after a barrier;
a row shows the median over rounds of the slowest rank's time per call and
Gloo's time / hpccomm's (above 1: hpccomm faster). Which path hpccomm takes
for CUDA tensors is in its log line and the table's title
(``HPCCOMM_TRANSPORT``, ``HPCCOMM_CUDA_STAGED_MAX_BYTES``): run it once per
path to choose the size threshold. Run by tests/gpu/acceptance.sh; prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from hpccomm.config import settings


def timed(tensor: torch.Tensor, group: dist.ProcessGroup, iters: int) -> float:
    """The slowest rank's time per call (us) over ``iters`` calls."""
    dist.barrier()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor, group=group)
    torch.cuda.synchronize()
    elapsed = torch.tensor([(time.perf_counter() - start) / iters * 1e6])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # host tensor: hpccomm's CPU path
    return float(elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,4096,65536,1048576,16777216,67108864", help="bytes, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=0, help="calls per round (default: by size)")
    args = parser.parse_args()
    dist.init_process_group("hpccomm")
    device = torch.device("cuda", torch.cuda.current_device())
    hpc = dist.group.WORLD
    gloo = dist.new_group(list(range(dist.get_world_size())), backend="gloo")
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        tensor = torch.ones(max(1, size // 4), device=device)
        iters = args.iters or (200 if size <= 65536 else 20)
        samples: dict[str, list[float]] = {"hpccomm": [], "gloo": []}
        for _ in range(args.rounds + 1):  # the first round warms up
            for name, group in (("hpccomm", hpc), ("gloo", gloo)):
                samples[name].append(timed(tensor, group, iters))
        medians = {name: statistics.median(values[1:]) for name, values in samples.items()}
        rows.append((size, medians["hpccomm"], medians["gloo"]))
    if dist.get_rank() == 0:
        from hpccomm.transports import selection

        route = selection.routes().get("cuda")
        print(f"# torch {torch.__version__}, {dist.get_world_size()} ranks, {torch.cuda.get_device_name(device)}; "
              f"CUDA route {route} (HPCCOMM_CUDA_STAGED_MAX_BYTES={settings.cuda_staged_max_bytes}); "
              f"median of {args.rounds} rounds, slowest rank, us per call")
        print("| bytes | hpccomm us | gloo us | gloo / hpccomm |\n|---|---|---|---|")
        for size, ours, theirs in rows:
            print(f"| {size} | {ours:.1f} | {theirs:.1f} | {theirs / ours:.2f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
