"""Where a blocking all-reduce's time goes on hpccomm's UCC path, timed beside the way ucc_perftest times.

    HPCCOMM_TRANSPORT=cuda:ucc HPCCOMM_CUDA_STAGED_MAX_BYTES=0 hpccomm-run -n 2 \\
        python benchmarks/cuda_call_stages.py [--sizes 4,16777216] [--iters 20] [--json FILE]

The GPU acceptance run's UCC path was 400-530 us a call slower than
``ucc_perftest`` at every size on an H100 shared by two ranks (docs/ucc-cuda.md).
The two do not time the same thing: perftest times each rank's init, post and
progress until the request completes, with a barrier between calls, and
prints the average over calls and ranks; ``benchmarks/cuda_allreduce.py``
times back-to-back calls until the device has finished, the slowest rank. So
per size (float32 SUM, in place), this times both ways:

* ``alone``: every rank synchronises its device, then a barrier, then one
  call, timed until it returns; the average over calls and ranks (perftest's);
* ``back_to_back``: ``--iters`` calls, then a device synchronise; the slowest
  rank's time per call (cuda_allreduce.py's);

and, for the back-to-back calls on the host-gated path, each call's stages in
us, the median over calls of the slowest rank's: ``gate`` (the call until
UCC's post: the host waiting for the caller's stream, which holds the
previous call's copy back), ``ucc`` (the post until the request had ended on
the host), ``after`` (from then until the call returned: the local steps
queued) and ``between`` (the return until the next call: the loop itself).
The stages are read by wrapping the host-gated path's post
(``GatedPost.post``) and the end of its requests (``UCCPending.finish``); a
path that runs neither (the staged path, triggered posts, CPU tensors) has
none. Every value is checked (the tensor doubles with every call). ``--device
cpu`` uses CPU tensors, to try this script where no GPU is. Run by
tests/gpu/acceptance.sh.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import signal
import statistics
import time
from collections.abc import Callable
from typing import Any

#: The stages of a call, in order: the name of each is the interval that ends at its stamp.
STAGES = ("gate", "ucc", "after", "between")


class StageStamps:
    """Each call's stage stamps (``time.perf_counter()``), from the host-gated path's post and the end of its requests.

    Use as a context manager; :meth:`call` marks each call's start and
    :meth:`returned` its return. Only the first post and the first end within a
    call count (one request per all-reduce). Also read by
    tests/gpu/ranks/cuda_ops.py, whose failure messages name when the latest
    call's stages happened (:meth:`ms_since_call`, :meth:`stages_ms`).
    """

    def __init__(self) -> None:
        self.calls: list[dict[str, float]] = []

    def __enter__(self) -> StageStamps:
        from hpccomm.transports.ucc import UCCPending
        from hpccomm.transports.ucc_cuda import GatedPost

        self._patched = [(GatedPost, "post", "posted"), (UCCPending, "finish", "ended")]
        self._saved = [getattr(cls, name) for cls, name, _ in self._patched]
        for (cls, name, stamp), original in zip(self._patched, self._saved):
            setattr(cls, name, self._stamping(stamp, original))
        return self

    def __exit__(self, *exc: object) -> None:
        for (cls, name, _), original in zip(self._patched, self._saved):
            setattr(cls, name, original)

    def _stamping(self, stamp: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def stamped(*args: Any, **kwargs: Any) -> Any:
            if self.calls:
                self.calls[-1].setdefault(stamp, time.perf_counter())
            return original(*args, **kwargs)

        return stamped

    def call(self) -> None:
        self.calls.append({"called": time.perf_counter()})

    def returned(self) -> None:
        self.calls[-1]["returned"] = time.perf_counter()

    def ms_since_call(self) -> float:
        """Milliseconds from the latest call's start until now."""
        return (time.perf_counter() - self.calls[-1]["called"]) * 1e3

    def stages_ms(self) -> dict[str, float]:
        """The latest call's stamps (``posted``, ``ended``, ``returned``: those it has), in ms since its start."""
        call = self.calls[-1]
        return {stamp: round((at - call["called"]) * 1e3, 3) for stamp, at in call.items() if stamp != "called"}


def stage_us(calls: list[dict[str, float]]) -> dict[str, float | None]:
    """The median of each stage over ``calls`` (us); None for a stage no call had (its path has no such stamp)."""
    spans: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for call, following in zip(calls, [*calls[1:], None]):
        if "posted" in call and "ended" in call:
            spans["gate"].append(call["posted"] - call["called"])
            spans["ucc"].append(call["ended"] - call["posted"])
            spans["after"].append(call["returned"] - call["ended"])
        if following is not None:
            spans["between"].append(following["called"] - call["returned"])
    return {stage: statistics.median(values) * 1e6 if values else None for stage, values in spans.items()}


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # past its limit its stacks print (tests/gpu/limits.sh)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4,1048576,16777216,67108864", help="bytes, comma-separated")
    parser.add_argument("--iters", type=int, default=20, help="calls per size, each way")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--json", help="write the results here (rank 0)")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    dist.init_process_group("hpccomm")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def across(value: float, op: Any) -> float:
        cell = torch.tensor([value], dtype=torch.float64)  # host tensor: hpccomm's CPU path
        dist.all_reduce(cell, op=op)
        return float(cell)

    rows = []
    for nbytes in (int(size) for size in args.sizes.split(",")):
        t = torch.ones(max(nbytes // 4, 1), device=device)
        calls = 0

        def all_reduce() -> None:
            nonlocal calls
            dist.all_reduce(t)
            calls += 1

        all_reduce()  # warm-up: the path's buffers and UCC's for this size
        spent = 0.0
        for _ in range(args.iters):
            sync()
            dist.barrier()
            start = time.perf_counter()
            all_reduce()
            spent += time.perf_counter() - start
        alone = across(spent / args.iters * 1e6, dist.ReduceOp.SUM) / world
        sync()
        dist.barrier()
        with StageStamps() as stamps:
            start = time.perf_counter()
            for _ in range(args.iters):
                stamps.call()
                all_reduce()
                stamps.returned()
            sync()
            back_to_back = (time.perf_counter() - start) / args.iters * 1e6
        back_to_back = across(back_to_back, dist.ReduceOp.MAX)
        stages = {stage: (None if us is None else across(us, dist.ReduceOp.MAX))
                  for stage, us in stage_us(stamps.calls).items()}
        # Every rank starts from ones, so after k calls each element is world**k (exact in float32 here).
        expected = float(world) ** calls
        right = across(float(bool((t == expected).all())), dist.ReduceOp.MIN) == 1.0
        rows.append({"bytes": nbytes, "alone_us": alone, "back_to_back_us": back_to_back, "stages_us": stages,
                     "right": right})
        if rank == 0:
            print(f"timed {nbytes} B: alone {alone:.1f} us, back to back {back_to_back:.1f} us", flush=True)

    if rank == 0:
        print("| bytes | alone (perftest's way) | back to back | " + " | ".join(STAGES) + " | values |")
        print("|---|---|---|" + "---|" * len(STAGES) + "---|")
        for row in rows:
            cells = [f"{row['stages_us'][stage]:.1f}" if row["stages_us"][stage] is not None else "-"
                     for stage in STAGES]
            print(f"| {row['bytes']} | {row['alone_us']:.1f} | {row['back_to_back_us']:.1f} | " + " | ".join(cells)
                  + f" | {'right' if row['right'] else 'WRONG'} |")
        if args.json:
            with open(args.json, "w") as out:
                json.dump({"world": world, "device": str(device), "iters": args.iters, "rows": rows}, out, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
