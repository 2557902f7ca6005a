"""``bench --model ddp|fsdp``: training steps on hpccomm and on Gloo, and how much of a step waits on communication.

::

    hpccomm-run -n 2 python -m hpccomm bench --model ddp                # 25M-parameter transformer, batch 2
    hpccomm-run -n 2 python -m hpccomm bench --model ddp --arch mlp --width 512 --batch 64   # examples/train_ddp.py

In one launch, copies of the same model (same initial weights, same batch)
take training steps (forward, backward, SGD step) in rounds of
``--step-block`` steps each, in an order shuffled every round:

* ``compute``: the plain model, no communication: the step's compute;
* ``no comm`` (DDP only): wrapped in DDP whose communication hook hands each
  bucket back untouched: compute plus DDP's own work (hooks, copies into and
  out of its buckets);
* ``hpccomm``: wrapped in DDP (or FSDP2's ``fully_shard``) on hpccomm's group;
* ``gloo``: the same on a Gloo group.

A step's time is the slowest rank's; each row gives the median. The exposed
communication is what a backend adds to the step without communication
(``no comm`` for DDP, ``compute`` for FSDP): communication that overlapped
with backward costs nothing there. Alongside, ``comm alone`` is the same
traffic with no compute: DDP's gradient buckets all-reduced (posted
asynchronously, as DDP does), or FSDP's per-layer all-gathers (forward and
backward) and reduce-scatters; ``hidden`` = 1 - exposed / comm alone is the
part of it the step did not wait for (negative: the step lost more than the
communication takes alone, e.g. to CPU contention).

The default model makes communication a real share of the step: 8
transformer layers of width 512 (25M parameters, 100 MB of float32
gradients per step) on 2 x 16 tokens per rank.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from .contenders import all_gather_single, reduce_scatter_single
from .sweep import slowest_median, time_calls
from .table import Column, Table, fmt_ratio

COMPUTE = "compute"
NO_COMM = "no comm"
_BUCKET_BYTES = 25 << 20  # DDP's default bucket_cap_mb


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--model`` options, on the bench's command line."""
    group = parser.add_argument_group("training-step benchmark (--model)")
    group.add_argument("--model", choices=("ddp", "fsdp"), help="time training steps instead of a collective sweep")
    group.add_argument("--arch", choices=("transformer", "mlp"), default="transformer",
                       help="transformer layers (default), or examples/train_ddp.py's MLP")
    group.add_argument("--width", type=int, default=512, help="model width (default 512)")
    group.add_argument("--layers", type=int, default=8, help="transformer layers (default 8)")
    group.add_argument("--heads", type=int, default=8, help="attention heads (default 8)")
    group.add_argument("--seq", type=int, default=16, help="tokens per sample (default 16)")
    group.add_argument("--batch", type=int, default=2, help="samples per rank per step (default 2)")
    group.add_argument("--steps", type=int, default=30, help="timed steps per contender (default 30)")
    group.add_argument("--warmup-steps", type=int, default=3, help="untimed steps per contender first (default 3)")
    group.add_argument("--step-block", type=int, default=5, help="steps in a row per contender and round (default 5)")


def build_model(args: argparse.Namespace) -> tuple[torch.nn.Module, list[torch.nn.Module], Callable[[], torch.Tensor]]:
    """The model, its layers (FSDP's units), and a function making one rank's batch.

    Args:
        args: ``--arch``, ``--width``, ``--layers``, ``--heads``, ``--seq``, ``--batch``.
    """
    if args.arch == "mlp":
        layers = [torch.nn.Linear(64, args.width), torch.nn.Linear(args.width, args.width), torch.nn.Linear(args.width, 1)]
        model = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2])
        return model, layers, lambda: torch.randn(args.batch, 64)
    layers = [
        torch.nn.TransformerEncoderLayer(
            args.width, args.heads, dim_feedforward=4 * args.width, dropout=0.0, batch_first=True
        )
        for _ in range(args.layers)
    ]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 1))
    return model, layers, lambda: torch.randn(args.batch, args.seq, args.width)


class Contender:
    """One copy of the model with its optimizer: a training step, and the same traffic with no compute.

    Args:
        name: ``compute``, ``hpccomm`` or ``gloo``.
        args: the command line.
        group: the backend's process group (None for ``compute``).
    """

    def __init__(self, name: str, args: argparse.Namespace, group: dist.ProcessGroup | None) -> None:
        self.name = name
        self.group = group
        torch.manual_seed(0)  # the same initial weights in every copy
        model, layers, self.make_batch = build_model(args)
        self.numels = [sum(p.numel() for p in layer.parameters()) for layer in layers]
        self.parameters = sum(p.numel() for p in model.parameters())
        if name == NO_COMM:
            # DDP's own work (hooks, copies into and out of its buckets) without communicating.
            model = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
            model.register_comm_hook(None, _no_communication)
            self.group = None
        elif group is not None and args.model == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        elif group is not None:
            from torch.distributed.device_mesh import DeviceMesh
            from torch.distributed.fsdp import fully_shard

            mesh = DeviceMesh.from_group(group, "cpu")
            for layer in layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        generator = torch.Generator().manual_seed(1000 + dist.get_rank())
        torch.manual_seed(int(torch.randint(1 << 30, (1,), generator=generator)))
        self.batch = self.make_batch()
        self.samples: list[float] = []

    def step(self) -> None:
        """One training step: forward, backward (DDP/FSDP communicate here), SGD step."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.model(self.batch).float().pow(2).mean()
        loss.backward()
        self.optimizer.step()

    def traffic(self, model_kind: str) -> Callable[[], None] | None:
        """The step's communication alone, on this contender's group; None for ``compute``."""
        if self.group is None:
            return None
        group, size = self.group, dist.get_world_size(self.group)
        if model_kind == "ddp":
            buckets = [torch.zeros(n) for n in _ddp_bucket_numels(self.model, self.parameters)]

            def all_reduce_buckets() -> None:
                works = [dist.all_reduce(b, group=group, async_op=True) for b in buckets]
                for work in works:
                    work.wait()

            return all_reduce_buckets
        # FSDP2: per unit, all-gather in forward and again in backward, reduce-scatter of gradients.
        shards = [(torch.zeros(-(-n // size)), torch.zeros(-(-n // size) * size)) for n in self.numels if n]

        def fsdp_traffic() -> None:
            for shard, whole in shards:
                all_gather_single(whole, shard, group=group)
            for shard, whole in reversed(shards):
                all_gather_single(whole, shard, group=group)
                reduce_scatter_single(shard, whole, group=group)

        return fsdp_traffic


def _no_communication(_state, bucket):  # noqa: ANN001, ANN202
    """A DDP comm hook that hands the bucket back as it is.

    Unannotated on purpose: DDP rejects a hook whose annotations are not the
    very objects ``dist.GradBucket`` and ``Future[Tensor]`` (this module's are
    strings).
    """
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _ddp_bucket_numels(ddp: Any, parameters: int) -> list[int]:
    """Gradient elements per DDP bucket, as DDP rebuilt them after the first step (25 MiB buckets if unknown)."""
    try:
        sizes = str(ddp._get_ddp_logging_data().get("bucket_sizes", ""))
        numels = [int(s) // 4 for s in sizes.replace(" ", "").split(",") if s]
    except Exception:  # private API: fall back to DDP's default bucket size
        numels = []
    if sum(numels) != parameters:
        per = _BUCKET_BYTES // 4
        numels = [min(per, parameters - i) for i in range(0, parameters, per)]
    return numels


def _replicas_agree(contender: Contender) -> bool:
    """Every rank holds the same weights (DDP); FSDP shards are checked by gathering them."""
    state = contender.model.state_dict()
    flat = torch.cat([(t.full_tensor() if hasattr(t, "full_tensor") else t).detach().reshape(-1).float() for t in state.values()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    return bool(torch.equal(flat, reference))


def main(args: argparse.Namespace) -> int:
    """Run the training-step benchmark; returns the exit status."""
    from .. import world

    MPI = world.mpi()
    dist.init_process_group("hpccomm")
    comm = world.members().Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    gloo = dist.new_group(backend="gloo")
    contenders = [Contender(COMPUTE, args, None), Contender("hpccomm", args, dist.group.WORLD), Contender("gloo", args, gloo)]
    if args.model == "ddp":
        contenders.insert(1, Contender(NO_COMM, args, dist.group.WORLD))
    out = print if rank == 0 else (lambda *a, **k: None)
    out(_describe(args, contenders[0], size))
    for contender in contenders:
        for _ in range(args.warmup_steps):
            contender.step()
    rounds = -(-args.steps // args.step_block)
    for index in range(rounds):
        order = list(contenders)
        random.Random(index).shuffle(order)
        for contender in order:
            time_calls(contender.step, min(args.step_block, args.steps - index * args.step_block), contender.samples)
    step = {c.name: slowest_median(c.samples, comm, MPI) for c in contenders}
    alone = {}
    for contender in contenders:
        if contender.group is None:
            continue
        traffic, samples = contender.traffic(args.model), []
        traffic()
        time_calls(traffic, max(5, args.steps // 3), samples)
        alone[contender.name] = slowest_median(samples, comm, MPI)
    agree = {c.name: _replicas_agree(c) for c in contenders if c.group is not None}
    _report(out, args, step, alone, agree, size)
    dist.destroy_process_group()
    return 0 if all(agree.values()) else 1


def _describe(args: argparse.Namespace, contender: Contender, size: int) -> str:
    shape = (
        f"MLP 64-{args.width}-{args.width}-1, batch {args.batch}"
        if args.arch == "mlp"
        else f"{args.layers} transformer layers of width {args.width}, {args.batch} x {args.seq} tokens"
    )
    return (
        f"# {args.model.upper()} training step: {shape} per rank, {contender.parameters / 1e6:.1f}M parameters "
        f"({contender.parameters * 4 / 1e6:.0f} MB of float32 gradients), {size} ranks, {torch.get_num_threads()} "
        f"torch thread(s) per rank; {args.steps} steps per contender in rounds of {args.step_block}, shuffled; "
        "time = median of the slowest rank's step"
    )


def _report(
    out: Callable[..., None],
    args: argparse.Namespace,
    step: dict[str, float],
    alone: dict[str, float],
    agree: dict[str, bool],
    size: int,
) -> None:
    baseline = step.get(NO_COMM, step[COMPUTE])
    table = Table([Column("contender", width=9), Column("step", "ms", width=8), Column("samples/s", width=9),
                   Column("vs hpccomm", "x", width=10), Column("exposed comm", "ms", width=12),
                   Column("exposed share", width=13), Column("comm alone", "ms", width=10), Column("hidden", width=7)],
                  markdown=args.format == "markdown")
    for line in table.header():
        out(line)
    for name, seconds in step.items():
        exposed = seconds - baseline if name in alone else None
        hidden = 1 - exposed / alone[name] if exposed is not None and alone.get(name) else None
        out(table.row([
            name,
            f"{seconds * 1e3:.1f}",
            f"{args.batch * size / seconds:.0f}",
            fmt_ratio(seconds / step["hpccomm"]),
            f"{exposed * 1e3:.1f}" if exposed is not None else "-",
            f"{exposed / seconds:.0%}" if exposed is not None else "-",
            f"{alone[name] * 1e3:.1f}" if name in alone else "-",
            f"{hidden:.0%}" if hidden is not None else "-",
        ]))
    out(f"# {args.model.upper()} step time hpccomm / gloo: {step['hpccomm'] / step['gloo']:.2f}")
    out("# replicas identical after training: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in agree.items()))
