"""Soak: many small and some large all_reduces; no error and no growth in resident memory.

    hpccomm-run -n 4 python benchmarks/soak.py [--small 100000] [--large 1000] [--large-mib 16]

Resident memory (VmRSS) is sampled after a warm-up and then every tenth of
the run; each rank reports its growth after warm-up, and rank 0 the maximum
over ranks. Results are checked on every call (a sum of ones).
"""

from __future__ import annotations

import argparse
import time

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def phase(name: str, calls: int, numel: int, async_every: int) -> dict[str, float]:
    """Run ``calls`` all_reduces of ``numel`` floats; every ``async_every``-th is async."""
    size = dist.get_world_size()
    tensor = torch.ones(numel)
    warmup = max(1, calls // 20)
    samples: list[float] = []
    start = time.perf_counter()
    for i in range(calls):
        tensor.fill_(1.0)
        if async_every and i % async_every == 0:
            dist.all_reduce(tensor, async_op=True).wait()
        else:
            dist.all_reduce(tensor)
        if tensor[0].item() != size or tensor[-1].item() != size:
            raise RuntimeError(f"{name}: call {i} gave {tensor[0].item()} instead of {size}")
        if i == warmup or (i > warmup and i % max(1, calls // 10) == 0):
            samples.append(rss_mib())
    elapsed = time.perf_counter() - start
    samples.append(rss_mib())
    return {"seconds": elapsed, "rss_after_warmup": samples[0], "rss_end": samples[-1], "rss_max": max(samples)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--large", type=int, default=1000)
    parser.add_argument("--large-mib", type=int, default=16)
    args = parser.parse_args()
    dist.init_process_group("hpccomm")
    rank = dist.get_rank()
    results = {
        "small (4 B)": phase("small", args.small, 1, async_every=10),
        f"large ({args.large_mib} MiB)": phase("large", args.large, args.large_mib * 2**20 // 4, async_every=10),
    }
    gathered: list[dict] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(gathered, results)
    if rank == 0:
        print("| phase | calls/s | RSS after warm-up (MiB, rank 0) | max growth after warm-up over ranks (MiB) |")
        print("|---|---|---|---|")
        for name in results:
            calls = args.small if name.startswith("small") else args.large
            growth = max(r[name]["rss_max"] - r[name]["rss_after_warmup"] for r in gathered)
            rate = calls / results[name]["seconds"]
            print(f"| {name} | {rate:,.0f} | {results[name]['rss_after_warmup']:.1f} | {growth:+.1f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
