"""Train a small MLP with DistributedDataParallel on hpccomm; print loss and throughput.

    hpccomm-run -n 2 python examples/train_ddp.py [--steps 200] [--batch 64]

Synthetic regression data, so it runs anywhere. Rank and world size come
from MPI; no MASTER_ADDR, no torchrun.
"""

from __future__ import annotations

import argparse
import time

import hpccomm  # noqa: F401  (registers the "hpccomm" backend)
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()

    dist.init_process_group("hpccomm")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(
            torch.nn.Linear(64, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, args.width),
            torch.nn.ReLU(), torch.nn.Linear(args.width, 1),
        )
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    teacher = torch.randn(64, 1)
    data = torch.Generator().manual_seed(1000 + rank)

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 64, generator=data)
        y = x @ teacher
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if step % max(1, args.steps // 5) == 0 or step == args.steps:
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
            elapsed = time.perf_counter() - start
            if rank == 0:
                rate = step * args.batch * world / elapsed
                print(f"step {step:5d}  loss {mean_loss.item():.4f}  throughput {rate:,.0f} samples/s", flush=True)

    # Every rank must hold the same weights after DDP training.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    assert torch.equal(flat, reference), "DDP replicas diverged"
    if rank == 0:
        print(f"done: {world} ranks, replicas identical", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
