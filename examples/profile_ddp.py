"""Profile a few DDP steps with torch.profiler; write each rank's trace, and optionally draw rank 0's.

    hpccomm-run -n 2 python examples/profile_ddp.py --out traces [--backend gloo] [--plot step.png]

Each rank writes ``<out>/rank<R>.json``, a Chrome trace that TensorBoard,
Perfetto (ui.perfetto.dev), chrome://tracing and Holistic Trace Analysis read.
hpccomm's operations appear as ``hpccomm:all_reduce`` spans, from the post of
DDP's bucket to its completion, and ``hpccomm:record_param_comms`` events that
hold each operation's metadata (see docs/observability.md). ``--backend gloo``
runs the same steps with DDP on a Gloo group, for comparison. ``--plot`` draws
the last profiled step of every rank from the trace files (needs matplotlib).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import hpccomm  # noqa: F401  (registers the "hpccomm" backend)
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function, schedule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="traces", help="directory for the per-rank traces")
    parser.add_argument("--backend", choices=("hpccomm", "gloo"), default="hpccomm", help="DDP's group")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (after 2 unrecorded ones)")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--bucket-mb", type=float, default=0.5, help="DDP's bucket_cap_mb: several buckets per step")
    parser.add_argument("--plot", help="draw the last step of each rank into this PNG (rank 0, after all wrote)")
    args = parser.parse_args()

    dist.init_process_group("hpccomm")
    rank = dist.get_rank()
    group = dist.new_group(backend="gloo") if args.backend == "gloo" else None
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, args.width), torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = DDP(torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 1)), process_group=group,
                bucket_cap_mb=args.bucket_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1000 + rank)

    def step(number: int) -> None:
        with record_function(f"step {number}"):
            x = torch.randn(64, 64, generator=data)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), x[:, :1]).backward()
            optimizer.step()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Two steps unrecorded (the first sets DDP up, the second warms the profiler), then the profiled ones, each
    # marked ProfilerStep#N as HTA expects.
    plan = schedule(wait=1, warmup=1, active=args.steps, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=plan) as recorded:
        for number in range(2 + args.steps):
            step(number)
            recorded.step()
    recorded.export_chrome_trace(str(out / f"rank{rank}.json"))
    dist.barrier()
    if args.plot and rank == 0:
        draw(sorted(out.glob("rank*.json")), f"step {1 + args.steps}", args.plot, args.backend)
        print(f"drew {args.plot}")
    dist.destroy_process_group()


def draw(traces: list[Path], step: str, path: str, backend: str) -> None:
    """Draw one step of each rank from its trace file: its thread's work, and its all-reduces in flight below it.

    All-reduces in flight at the same time go to lanes of their own.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(traces), 1, figsize=(11, 2.2 * len(traces)), squeeze=False)
    for axis, trace in zip(axes[:, 0], traces):
        events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
        (window,) = [e for e in events if e["name"] == step]
        start, end = window["ts"], window["ts"] + window["dur"]
        work = [e for e in events if e["tid"] == window["tid"] and start <= e["ts"] <= end
                and e["name"].startswith(("autograd::engine", "Optimizer.step", "aten::linear"))]
        comms = sorted((e for e in events if e["name"] == f"{backend}:all_reduce" and start <= e["ts"] <= end),
                       key=lambda e: e["ts"])
        lanes: list[float] = []  # the end of the last span in each lane
        for span in comms:
            lane = next((i for i, busy_until in enumerate(lanes) if busy_until <= span["ts"]), len(lanes))
            lanes[lane:lane + 1] = [span["ts"] + span["dur"]]
            axis.broken_barh([((span["ts"] - start) / 1000, span["dur"] / 1000)], (-lane - 1.4, 0.8),
                             facecolors="tab:blue", edgecolors="white")
        axis.broken_barh([((e["ts"] - start) / 1000, e["dur"] / 1000) for e in work], (-0.4, 0.8),
                         facecolors="tab:gray", edgecolors="white", linewidth=0.3)
        axis.set_yticks([0] + [-lane - 1 for lane in range(len(lanes))],
                        ["forward, backward, optimizer"] + [f"{backend}:all_reduce"] * len(lanes))
        axis.set_xlim(0, (end - start) / 1000)
        axis.set_title(f"{trace.stem}, {step}: {len(comms)} bucket all-reduces", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("ms since the step began")
    figure.tight_layout()
    figure.savefig(path, dpi=110)

if __name__ == "__main__":
    main()
