"""What fault-tolerant mode costs: all_reduce under ``hpccomm-run --ft`` against the default mode, same run.

    python benchmarks/ft_cost.py [-n 4] [--rounds 3] [-b 4] [-e 64M] [-f 16]

Runs ``hpccomm-bench all_reduce`` as separate jobs, default mode and
fault-tolerant mode in turn, ``rounds`` times each (the mode is chosen at
launch, so the two cannot share a job); prints, per size, the median over
rounds of each mode's time and bus bandwidth and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = {"default": [], "ft": ["--ft"]}


def sweep(nprocs: int, launcher_options: list[str], sizes: list[str]) -> dict[int, tuple[float, float]]:
    """One job of hpccomm-bench: size -> (time in us, busbw in GB/s)."""
    bindir = os.path.dirname(sys.executable)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [os.path.join(bindir, "hpccomm-run"), *launcher_options, "-n", str(nprocs),
                   os.path.join(bindir, "hpccomm-bench"), "all_reduce", *sizes, "--no-progress", "--json", out.name]
        subprocess.run(command, check=True, capture_output=True, timeout=600)
        rows = json.loads(Path(out.name).read_text())["rows"]
    return {row["bytes"]: (row["time_us"], row["busbw_GBps"]) for row in rows if row["contender"] == "hpccomm"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--nprocs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-b", "--minbytes", default="4")
    parser.add_argument("-e", "--maxbytes", default="64M")
    parser.add_argument("-f", "--stepfactor", default="16")
    args = parser.parse_args()

    sizes = ["-b", args.minbytes, "-e", args.maxbytes, "-f", args.stepfactor]
    runs: dict[str, list[dict[int, tuple[float, float]]]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode, options in MODES.items():
            runs[mode].append(sweep(args.nprocs, options, sizes))

    def median(mode: str, size: int, field: int) -> float:
        return statistics.median(run[size][field] for run in runs[mode])

    print(f"all_reduce, {args.nprocs} ranks, median of {args.rounds} jobs per mode (hpccomm-bench: "
          "median over calls of the slowest rank)\n")
    print("| size (B) | default time (us) | --ft time (us) | --ft / default | default busbw (GB/s) | --ft busbw (GB/s) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for size in sorted(runs["default"][0]):
        base, ft = median("default", size, 0), median("ft", size, 0)
        print(f"| {size} | {base:.1f} | {ft:.1f} | {ft / base:.2f} | {median('default', size, 1):.2f} | "
              f"{median('ft', size, 1):.2f} |")


if __name__ == "__main__":
    main()
