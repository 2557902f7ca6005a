"""DDP training that survives a rank's death, in hpccomm's fault-tolerant mode.

    hpccomm-run --ft -n 4 python examples/train_ft.py [--steps 60] [--seed S] [--no-kill]
    hpccomm-run --ft --spares 1 -n 4 python examples/train_ft.py --spares 1 [...]

One rank, chosen at random, SIGKILLs itself at a random step, in the middle
of its backward pass (its gradient all-reduces in flight). The survivors'
next operation fails with ``hpccomm.PeerFailure`` (DDP re-raises it from
``backward()`` as a RuntimeError; ``hpccomm.failed_ranks()`` says which ranks
died either way). Without spares they shrink the default group with torch's
``dist.shrink_group`` and re-shard the data over the smaller world; with
spares (``--spares``, as many as ``hpccomm-run`` started) ``hpccomm.repair``
gives a spare the dead rank's number, and the job goes on at its size, the
replacement training on the dead rank's shard. Either way every rank then
calls ``hpccomm.TrainingState.resume``: the ranks agree on the latest step,
and the model, the optimizer and the run's own state (its seed and plan)
go from the rank that has it (a survivor whose all-reduce completed before
the death is one step ahead) to the ranks behind, the replacement among
them. DDP is rebuilt and the run finishes.

Check: every step's global batch is the same whatever the world size (its
size divides by both world sizes), and DDP averages gradients, so every step
equals one full-batch step in one process. Rank 0 replays the whole run that
way and compares the final parameters: they must agree within ``--atol``
(float32 sums taken in another order; see docs/fault-tolerance.md).

Prints ``RECOVERED rank=R/N at step S`` from each rank once recovered, and
from rank 0 one line ``RESULT {json}``: the victim and step, the failed
ranks, how many were replaced, the detection time (``caught_at``, the last
survivor's error, wall clock), the repair or shrink (``repair_s``), the
recovery from error to DDP rebuilt on every rank (``recover_s``), when the
job was back (``resumed_at``), the final world size and the largest
parameter difference.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import time

import hpccomm
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

IN, WIDTH = 32, 256


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, 1))


def make_ddp(model: torch.nn.Module) -> DDP:
    # Small buckets: the last layer's gradients are all-reduced while the first layer's are computed,
    # so the victim dies with an all-reduce in flight.
    return DDP(model, bucket_cap_mb=0.02)


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def global_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's whole batch: the same on every rank and for every world size."""
    data = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(size, IN, generator=data)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, batch: int,
               rank: int, world: int) -> None:
    x, y = global_batch(step, batch)
    x, y = x[rank::world], y[rank::world]  # this rank's shard
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


class Run:
    """The run's own state, which a replacement needs as much as the weights: its seed, the death planned, done."""

    def __init__(self, seed: int = 0, victim: int = -1, kill_at: int = -1) -> None:
        self.seed, self.victim, self.kill_at, self.failed = seed, victim, kill_at, []

    def state_dict(self) -> dict:
        return {"seed": self.seed, "victim": self.victim, "kill_at": self.kill_at, "failed": self.failed}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.victim, self.kill_at, self.failed = (state[k] for k in ("seed", "victim", "kill_at", "failed"))


def kill_mid_backward(model: torch.nn.Module) -> None:
    """SIGKILL this rank once the first gradient is ready: DDP's first bucket is on its way."""
    first = next(iter(model.parameters()))

    def die(grad: torch.Tensor) -> torch.Tensor:
        print(f"KILL rank={dist.get_rank()} at={time.time():.6f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        return grad

    first.register_hook(die)


def replay(steps: int, batch: int) -> torch.nn.Module:
    """The run as one process on each step's whole batch."""
    model = make_model()
    optimizer = make_optimizer(model)
    for step in range(steps):
        train_step(model, optimizer, step, batch, 0, 1)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=None, help="picks the victim and the step (default: the clock)")
    parser.add_argument("--no-kill", action="store_true", help="no rank dies (the clean run)")
    parser.add_argument("--spares", type=int, default=0,
                        help="the job has spares (hpccomm-run --ft --spares K): replace the dead rank, do not shrink")
    parser.add_argument("--atol", type=float, default=1e-4)
    args = parser.parse_args()

    # Built before the group, so that a spare pays for it while it waits (torch's first optimizer takes ~1 s).
    model = make_model()
    optimizer = make_optimizer(model)
    dist.init_process_group("hpccomm")  # a spare waits here until it takes a dead rank's place
    rank, world = dist.get_rank(), dist.get_world_size()
    batch = 8 * math.lcm(world, max(world - 1, 1))  # divides by the world size before and after a death
    run = Run()
    # Everything a rank is made of: a replacement receives it from a survivor (hpccomm.TrainingState.resume).
    state = hpccomm.TrainingState(model=model, optimizer=optimizer, run=run)
    report = {"world": world}
    if hpccomm.is_replacement():
        caught, start = 0.0, time.monotonic()  # detection is the survivors' to report
        step = state.resume(0)
        report.update(replacement=rank, replaced=len(run.failed))
    else:
        seed = torch.tensor([args.seed if args.seed is not None else time.time_ns() % 100_000])
        dist.broadcast(seed, src=0)
        chooser = random.Random(int(seed))
        run.seed, run.victim, run.kill_at = int(seed), chooser.randrange(world), chooser.randrange(1, args.steps - 1)
        if args.no_kill:
            run.victim = -1
        step, caught, start = 0, None, None
        ddp = make_ddp(model)
    while True:
        if caught is not None:
            # Recovered (a survivor after its repair or shrink, or a replacement after its resume).
            rank, world = dist.get_rank(), dist.get_world_size()
            ddp = make_ddp(model)
            times = torch.tensor([caught, time.monotonic() - start], dtype=torch.float64)
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
            report.update(failed=run.failed, step_resumed=step, caught_at=float(times[0]),
                          recover_s=round(float(times[1]), 4), resumed_at=time.time())
            print(f"RECOVERED rank={rank}/{world} at step {step}", flush=True)
            caught = None
        if step >= args.steps:
            break
        try:
            if rank == run.victim and step == run.kill_at and not run.failed:
                kill_mid_backward(model)
            train_step(ddp, optimizer, step, batch, rank, world)
            step += 1
        except Exception as error:  # hpccomm.PeerFailure, or DDP's RuntimeError around it
            caught = time.time()
            failed = hpccomm.failed_ranks()
            if not failed:
                raise
            start = time.monotonic()
            run.failed = failed
            if args.spares:
                replaced = hpccomm.repair(failed)  # spares take the dead ranks' places (or, with none left, shrink)
            else:
                dist.shrink_group(failed)
                replaced = 0
            report.update(repair_s=round(time.monotonic() - start, 4), replaced=replaced, error=type(error).__name__)
            # A survivor whose all-reduce completed before the death is a step ahead: every rank takes its state.
            step = state.resume(step)

    report.update(seed=run.seed, victim=run.victim, kill_at=run.kill_at)
    if rank == 0:
        reference = replay(args.steps, batch)
        diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))
        report.update(world_after=world, max_diff=diff, ok=diff <= args.atol)
        print("RESULT " + json.dumps(report), flush=True)
        if diff > args.atol:
            raise SystemExit(f"final parameters differ from the one-process replay by {diff:.3g} > {args.atol}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
