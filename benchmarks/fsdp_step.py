"""FSDP2 training step time: hpccomm (auto), hpccomm with every collective flat on MPI, and Gloo, one run.

    hpccomm-run -n 4 python benchmarks/fsdp_step.py [--layers 8] [--width 1792] [--batch 16] [--steps 20]

Three copies of one MLP (``--layers`` Linear layers of ``--width``, about
25.7M parameters by default), each ``fully_shard``-ed per layer over its own
process group: an hpccomm group as shipped, an hpccomm group whose selector
keeps every collective on MPI's, and a Gloo group. Steps (forward, backward,
SGD) take turns, one per model in a shuffled order each round, so the
machine's slow phases hit all three alike; prints the median step time of
each (the slowest rank's) and the ratios.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from hpccomm.groups import front_of
from hpccomm.transports.collective_paths import Selector
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard


def build(width: int, layers: int, group: dist.ProcessGroup) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU()) for _ in range(layers)])
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1792)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    dist.init_process_group("hpccomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    ranks = list(range(size))
    groups = {"auto": dist.new_group(ranks), "flat": dist.new_group(ranks), "gloo": dist.new_group(ranks, backend="gloo")}
    flat = front_of(groups["flat"])._cpu_transport
    flat.selector = Selector(flat.path, algo="flat")
    models = {name: build(args.width, args.layers, group) for name, group in groups.items()}
    params = sum(p.numel() for p in models["auto"][0].parameters())  # DTensors: global numel
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(rank))

    def step(name: str) -> float:
        model, opt = models[name]
        start = time.perf_counter()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        return time.perf_counter() - start

    for name in models:  # warm-up
        step(name)
    times: dict[str, list[float]] = {name: [] for name in models}
    for i in range(args.steps):
        order = list(models)
        random.Random(i).shuffle(order)
        for name in order:
            dist.barrier()
            times[name].append(step(name))
    med = {name: statistics.median(t) for name, t in times.items()}
    slowest = [None] * size
    dist.all_gather_object(slowest, med)
    med = {name: max(m[name] for m in slowest) for name in med}
    if rank == 0:
        print(f"# {size} ranks, FSDP2 over {args.layers} x Linear({args.width}): {params / 1e6:.1f}M parameters, batch {args.batch}")
        print("| hpccomm auto | hpccomm flat | gloo | flat / auto | gloo / auto |")
        print("|---|---|---|---|---|")
        print(
            f"| {med['auto'] * 1e3:.0f} ms | {med['flat'] * 1e3:.0f} ms | {med['gloo'] * 1e3:.0f} ms | "
            f"{med['flat'] / med['auto']:.2f}x | {med['gloo'] / med['auto']:.2f}x |"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
