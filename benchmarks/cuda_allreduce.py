"""CUDA all_reduce: each hpccomm path against Gloo on the same CUDA tensors, and the size to switch paths at.

    python benchmarks/cuda_allreduce.py --compare [-n 2] [--json FILE]   # every path, one job each
    hpccomm-run -n 2 python benchmarks/cuda_allreduce.py [--gloo]        # the path the environment picks

``--compare`` (no launcher: it starts the jobs) runs one job per path, each
with the environment that selects it, and prints one table: per size (bytes
of float32), the median us per blocking call of every path, Gloo's, which
path is fastest, and ``auto``'s time against the fastest; then the size
threshold to set (``HPCCOMM_CUDA_STAGED_MAX_BYTES``: the largest size the
staged path wins, below every size UCC wins). The paths:

* ``staged``: through pinned host memory and the CPU transport;
* ``ucc``: UCC on device memory, in-place reductions through the group's scratch
  (``HPCCOMM_UCC_IN_PLACE=scratch``, the default); ``ucc-native`` and
  ``ucc-tuned``: UCC's in-place flag, as it is and with its pipelining off;
  ``ucc-triggered``: the scratch, posted on an execution engine
  (``HPCCOMM_UCC_TRIGGERED=1``);
* ``auto``: the default routing (staged up to the threshold, then UCC);
* Gloo, timed in the staged job (``--gloo``).

A path whose job fails (no UCC with CUDA, say) is reported and left out.
One job (no ``--compare``) times ``--iters`` blocking ``dist.all_reduce``
calls per round, ending with ``torch.cuda.synchronize()`` so every byte has
landed, after a barrier; a row is the median over rounds of the slowest
rank's time per call. Run by tests/gpu/acceptance.sh, whose targets table
(tests/gpu/targets.py) reads ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Each path's environment, on top of the caller's.
PATHS: dict[str, dict[str, str]] = {
    "staged": {"HPCCOMM_TRANSPORT": "cuda:staged"},
    "ucc": {"HPCCOMM_TRANSPORT": "cuda:ucc", "HPCCOMM_CUDA_STAGED_MAX_BYTES": "0", "HPCCOMM_UCC_IN_PLACE": "scratch"},
    "ucc-native": {"HPCCOMM_TRANSPORT": "cuda:ucc", "HPCCOMM_CUDA_STAGED_MAX_BYTES": "0",
                   "HPCCOMM_UCC_IN_PLACE": "native"},
    "ucc-tuned": {"HPCCOMM_TRANSPORT": "cuda:ucc", "HPCCOMM_CUDA_STAGED_MAX_BYTES": "0",
                  "HPCCOMM_UCC_IN_PLACE": "tuned"},
    "ucc-triggered": {"HPCCOMM_TRANSPORT": "cuda:ucc", "HPCCOMM_CUDA_STAGED_MAX_BYTES": "0",
                      "HPCCOMM_UCC_TRIGGERED": "1"},
    "auto": {},
}
SIZES = "4,65536,1048576,2097152,4194304,16777216,67108864"


def timed(tensor, group, iters: int) -> float:  # type: ignore[no-untyped-def]
    """The slowest rank's time per call (us) over ``iters`` blocking calls."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor, group=group)
    torch.cuda.synchronize()
    elapsed = torch.tensor([(time.perf_counter() - start) / iters * 1e6])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # host tensor: hpccomm's CPU path
    return float(elapsed)


def one_job(args: argparse.Namespace) -> None:
    """Time the path this job's environment selects (and Gloo with ``--gloo``); rank 0 reports."""
    import hpccomm  # noqa: F401
    import torch
    import torch.distributed as dist
    from hpccomm.config import settings
    from hpccomm.transports import device_routes

    dist.init_process_group("hpccomm")
    device = torch.device("cuda", torch.cuda.current_device())
    groups = {"hpccomm": dist.group.WORLD}
    if args.gloo:
        groups["gloo"] = dist.new_group(list(range(dist.get_world_size())), backend="gloo")
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        tensor = torch.ones(max(1, size // 4), device=device)
        iters = args.iters or (200 if size <= 65536 else 20)
        samples: dict[str, list[float]] = {name: [] for name in groups}
        for _ in range(args.rounds + 1):  # the first round warms up
            for name, group in groups.items():
                samples[name].append(timed(tensor, group, iters))
        rows.append({"bytes": size, **{name: statistics.median(values[1:]) for name, values in samples.items()}})
    if dist.get_rank() == 0:
        record = {
            "torch": torch.__version__, "ranks": dist.get_world_size(), "gpu": torch.cuda.get_device_name(device),
            "route": device_routes.describe("cuda"), "staged_max_bytes": settings.cuda_staged_max_bytes,
            "rounds": args.rounds, "rows": rows,
        }
        print(f"# torch {record['torch']}, {record['ranks']} ranks, {record['gpu']}; CUDA route: {record['route']}; "
              f"median of {args.rounds} rounds, slowest rank, us per call")
        names = list(groups)
        print("| bytes | " + " | ".join(f"{name} us" for name in names) + " |\n" + "|---" * (len(names) + 1) + "|")
        for row in rows:
            print(f"| {row['bytes']} | " + " | ".join(f"{row[name]:.1f}" for name in names) + " |")
        if args.json:
            Path(args.json).write_text(json.dumps(record))
    dist.destroy_process_group()


def compare(args: argparse.Namespace) -> None:
    """One job per path; the combined table, the fastest path per size and the threshold to set."""
    results: dict[str, dict] = {}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for index, path in enumerate(args.paths.split(",")):
            out = Path(tmp) / f"{path}.json"
            command = ["hpccomm-run", "-n", str(args.n), sys.executable, __file__, "--sizes", args.sizes,
                       "--rounds", str(args.rounds), "--iters", str(args.iters), "--json", str(out)]
            if index == 0:
                command.append("--gloo")  # once: Gloo does not depend on hpccomm's path
            env = {**os.environ, **PATHS[path]}
            try:
                proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.job_timeout)
                if proc.returncode == 0 and out.exists():
                    results[path] = json.loads(out.read_text())
                else:
                    failed[path] = f"exit {proc.returncode}: {(proc.stdout + proc.stderr).strip()[-300:]}"
            except subprocess.TimeoutExpired:
                failed[path] = f"over {args.job_timeout} s"
            print(f"# {path}: {'ok' if path in results else failed[path]}", file=sys.stderr, flush=True)
    summary = summarise(results, failed)
    print(report(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary))


def summarise(results: dict[str, dict], failed: dict[str, str]) -> dict:
    """Per size, every path's time and Gloo's, the fastest path, auto against it; the threshold to set."""
    paths = [path for path in PATHS if path in results]
    sizes = [row["bytes"] for row in next(iter(results.values()))["rows"]] if results else []
    rows = []
    for i, size in enumerate(sizes):
        times = {path: results[path]["rows"][i]["hpccomm"] for path in paths}
        gloo = next((r["rows"][i]["gloo"] for r in results.values() if "gloo" in r["rows"][i]), None)
        candidates = {path: us for path, us in times.items() if path != "auto"}
        best = min(candidates, key=candidates.get) if candidates else None
        rows.append({"bytes": size, "us": times, "gloo": gloo, "best": best,
                     "auto_over_best": times["auto"] / candidates[best] if "auto" in times and best else None})
    return {"paths": paths, "failed": failed, "rows": rows, "threshold": threshold(rows),
            "machine": {key: next(iter(results.values()))[key] for key in ("torch", "ranks", "gpu")} if results else {},
            "auto_staged_max_bytes": results["auto"]["staged_max_bytes"] if "auto" in results else None}


def threshold(rows: list[dict]) -> int | None:
    """The largest size measured at which the staged path beat UCC (scratch): 0 if it never did; None if unknown."""
    measured = [row for row in rows if "staged" in row["us"] and "ucc" in row["us"]]
    if not measured:
        return None
    limit = 0
    for row in measured:
        if row["us"]["staged"] <= row["us"]["ucc"]:
            limit = row["bytes"]
    return limit


def report(summary: dict) -> str:
    """The combined Markdown table and the threshold line."""
    paths = summary["paths"]
    machine = summary["machine"]
    lines = [f"# CUDA all_reduce per path: {machine.get('ranks')} ranks, {machine.get('gpu')}, torch "
             f"{machine.get('torch')}; us per blocking call (median, slowest rank)"]
    lines.append("| bytes | " + " | ".join(paths) + " | gloo | fastest | auto / fastest |")
    lines.append("|---" * (len(paths) + 4) + "|")
    for row in summary["rows"]:
        cells = [f"{row['us'][path]:.1f}" for path in paths]
        gloo = f"{row['gloo']:.1f}" if row["gloo"] is not None else "-"
        ratio = f"{row['auto_over_best']:.2f}" if row["auto_over_best"] is not None else "-"
        lines.append(f"| {row['bytes']} | " + " | ".join(cells) + f" | {gloo} | {row['best']} | {ratio} |")
    for path, why in summary["failed"].items():
        lines.append(f"\n{path}: not measured ({why})")
    if summary["threshold"] is not None:
        lines.append(f"\nHPCCOMM_CUDA_STAGED_MAX_BYTES={summary['threshold']}: the largest size measured at which "
                     f"the staged path beat UCC (default here: {summary['auto_staged_max_bytes']})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", action="store_true", help="run one job per path and compare them")
    parser.add_argument("--paths", default=",".join(PATHS), help="with --compare: which, comma-separated")
    parser.add_argument("-n", type=int, default=2, help="with --compare: ranks per job")
    parser.add_argument("--job-timeout", type=int, default=240, help="with --compare: seconds per job")
    parser.add_argument("--sizes", default=SIZES, help="bytes, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=0, help="calls per round (default: by size)")
    parser.add_argument("--gloo", action="store_true", help="time Gloo too")
    parser.add_argument("--json", help="write the results here (rank 0)")
    args = parser.parse_args()
    if args.compare:
        compare(args)
    else:
        one_job(args)


if __name__ == "__main__":
    main()
