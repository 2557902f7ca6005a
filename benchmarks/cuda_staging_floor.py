"""The floor under the host-staged CUDA path: a copy out and back with no communication, per call.

    hpccomm-run -n 1 python benchmarks/cuda_staging_floor.py
    hpccomm-run -n 2 python benchmarks/cuda_staging_floor.py   # two ranks on one GPU, if it has one

Each rank times, on the device hpccomm gives it, ``--iters`` calls of each of:

* ``staged, ...``: what the staged path does around its communication, with
  none, through the same device seam (``CudaOps``): an event on the current
  stream, the gate stream waiting on it, a copy into pinned host memory on the
  gate stream, an event polled until done, the copy back on the side stream,
  an event; three ways: each stream entered with ``torch.cuda.set_stream``
  and back (as ``CudaOps`` does) or, as it did before, with ``with
  torch.cuda.stream``, and the landing awaited by the host spinning on its
  event or by the current stream waiting on it (the host goes on at once, as a
  blocking call does);
* ``tensor.cpu()``: torch's own blocking copy out, for scale;
* ``hpccomm all_reduce``: the real blocking call on the same tensor.

at ``--bytes`` (default 4), and prints, per rank, the median over rounds in
us. Then rank 0 times, alone, the host-side cost of each ``torch.cuda`` call
the staged path makes (or could make instead), to show where its floor goes.
With several ranks on one GPU, compare against one rank: the difference is
what sharing the GPU costs (its contexts take turns), which no transport
avoids; with one GPU per rank the single-rank floor is the one that applies.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import signal
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from hpccomm.transports.device_ops import CudaOps, DeviceOps


def spin(ops: DeviceOps, event: Any) -> None:
    while not ops.query(event):
        pass


class ContextSwitchOps(CudaOps):
    """:class:`CudaOps` as it switched streams before (one ``with torch.cuda.stream`` per copy), for comparison."""

    def copy(self, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], stream: Any) -> None:
        for dst, src in pairs:
            with torch.cuda.stream(stream):
                dst.copy_(src, non_blocking=True)


def staged_round_trip(tensor: torch.Tensor, ops: DeviceOps, landing: str) -> Callable[[], None]:
    """One staged round trip through the device seam ``ops``, its landing awaited by ``landing``
    ("spin": the host polls the event; "join": the current stream waits on it)."""
    host = ops.host_buffer(tensor)

    def once() -> None:
        gate, side = ops.gate_stream(), ops.side_stream()
        ops.wait_event(gate, ops.record(ops.current_stream()))
        ops.copy([(host, tensor)], gate)
        spin(ops, ops.record(gate))
        ops.copy([(tensor, host)], side)
        landed = ops.record(side)
        if landing == "spin":
            spin(ops, landed)
        else:
            ops.wait_event(ops.current_stream(), landed)

    return once


def per_call_us(call: Callable[[], None], iters: int, rounds: int) -> float:
    """The median over ``rounds`` of the mean time per call (us), after one warm-up round."""
    samples = []
    for _ in range(rounds + 1):
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(samples[1:])


def host_costs(tensor: torch.Tensor, side: torch.cuda.Stream, iters: int) -> dict[str, float]:
    """Median host time (us) of each torch.cuda call on its own, the GPU idle in between."""
    index = tensor.device.index
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    done = torch.cuda.Event()
    done.record()
    torch.cuda.synchronize()

    def switch_with_context() -> None:
        with torch.cuda.stream(side):
            pass

    def switch_with_set_stream() -> None:
        previous = torch.cuda.current_stream(index)
        torch.cuda.set_stream(side)
        torch.cuda.set_stream(previous)

    def event_record() -> None:
        torch.cuda.Event().record(side)

    calls = {
        "torch.cuda.current_stream(device)": lambda: torch.cuda.current_stream(tensor.device),
        "torch.cuda.current_stream(index)": lambda: torch.cuda.current_stream(index),
        "with torch.cuda.stream(side)": switch_with_context,
        "set_stream(side) and back": switch_with_set_stream,
        "Event() + record(side)": event_record,
        "side.wait_event(done)": lambda: side.wait_event(done),
        "event.query() (completed)": done.query,
        "is_current_stream_capturing()": torch.cuda.is_current_stream_capturing,
        "torch.empty(pin_memory=True)": lambda: torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True),
        "host.copy_(tensor, non_blocking) queued": lambda: host.copy_(tensor, non_blocking=True),
    }
    costs = {}
    for name, call in calls.items():
        samples = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(iters):
                call()
            samples.append((time.perf_counter() - start) / iters * 1e6)
            torch.cuda.synchronize()
        costs[name] = statistics.median(samples)
    return costs


def profile_calls(tensor: torch.Tensor, calls: int) -> None:
    """Where a blocking ``dist.all_reduce``'s host time goes: cProfile over ``calls`` calls, the top functions.

    cProfile adds its own cost per Python call, so the shares, not the totals,
    are what to read; C functions torch calls from Python (event records,
    stream switches, pinned allocations) show as their own rows.
    """
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    torch.cuda.synchronize()
    profiler.enable()
    for _ in range(calls):
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    print(f"\n## cProfile, {calls} blocking all_reduce calls (rank 0), by own time\n```\n{text.getvalue()}```")


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # past its limit its stacks print (tests/gpu/limits.sh)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=4)
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write rank 0's table here (tests/gpu/targets.py reads it)")
    parser.add_argument("--profile", type=int, default=0, help="at one rank: cProfile this many all_reduce calls")
    args = parser.parse_args()
    dist.init_process_group("hpccomm")
    device = torch.device("cuda", torch.cuda.current_device())
    tensor = torch.ones(max(1, args.bytes // 4), device=device)
    side = torch.cuda.Stream(device=device)
    cases = {
        "staged, context switch, spin": staged_round_trip(tensor, ContextSwitchOps(device), "spin"),
        "staged, set_stream, spin": staged_round_trip(tensor, CudaOps(device), "spin"),
        "staged, set_stream, join": staged_round_trip(tensor, CudaOps(device), "join"),
        "tensor.cpu()": lambda: tensor.cpu(),
        "hpccomm all_reduce": lambda: dist.all_reduce(tensor),
    }
    mine = [per_call_us(call, args.iters, args.rounds) for call in cases.values()]
    table = [None] * dist.get_world_size()
    dist.all_gather_object(table, mine)
    if dist.get_rank() == 0:
        print(f"# torch {torch.__version__}, {dist.get_world_size()} rank(s) on {torch.cuda.get_device_name(device)}, "
              f"{args.bytes} B; median of {args.rounds} rounds of {args.iters} calls, us per call")
        print("| rank | " + " | ".join(cases) + " |\n" + "|---" * (len(cases) + 1) + "|")
        for rank, row in enumerate(table):
            print(f"| {rank} | " + " | ".join(f"{us:.1f}" for us in row) + " |")
        print("\n| host-side call (rank 0) | us |\n|---|---|")
        for name, us in host_costs(tensor, side, args.iters).items():
            print(f"| {name} | {us:.2f} |")
        if args.json:
            record = {"ranks": dist.get_world_size(), "bytes": args.bytes, "cases": list(cases), "per_rank": table}
            Path(args.json).write_text(json.dumps(record))
        if args.profile and dist.get_world_size() == 1:
            profile_calls(tensor, args.profile)
    dist.barrier()  # the other ranks wait for rank 0's timings before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
