"""What fault-tolerant mode and its spares cost: all_reduce under ``hpccomm-run --ft`` against the default mode, same run.

    python benchmarks/ft_cost.py [-n 4] [--rounds 3] [-b 4] [-e 64M] [-f 16] [--modes default,ft]

Runs ``hpccomm-bench all_reduce`` as separate jobs, one per mode in turn,
``rounds`` times each (the mode is chosen at launch, so two cannot share a
job); prints, per size, the median over rounds of each mode's time and bus
bandwidth, and each mode's time against the first mode's. The modes:

* ``default``: ``hpccomm-run``;
* ``ft``: ``hpccomm-run --ft``;
* ``spare``: ``hpccomm-run --ft --spares 1``, a job that never loses a rank,
  with one spare waiting beside it;
* ``idle``: ``hpccomm-run --ft`` with a process beside the job that is no
  part of it and wakes as often as a waiting spare does, the control for
  ``spare`` where the job's ranks share the machine's cores with it.
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

MODES = {"default": [], "ft": ["--ft"], "spare": ["--ft", "--spares", "1"], "idle": ["--ft"]}
#: The control beside an ``idle`` job: wakes every 20 ms, as a waiting spare tests its receive
#: (hpccomm/fault_tolerance/spares.py).
IDLE = "import time\nwhile True:\n    time.sleep(0.02)\n"


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
    parser.add_argument("--modes", default="default,ft", help=f"of {', '.join(MODES)}; the first is the base")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if unknown := [mode for mode in modes if mode not in MODES]:
        parser.error(f"--modes: unknown {', '.join(unknown)}; known: {', '.join(MODES)}")

    sizes = ["-b", args.minbytes, "-e", args.maxbytes, "-f", args.stepfactor]
    runs: dict[str, list[dict[int, tuple[float, float]]]] = {mode: [] for mode in modes}
    for _ in range(args.rounds):
        for mode in modes:
            beside = subprocess.Popen([sys.executable, "-c", IDLE]) if mode == "idle" else None
            try:
                runs[mode].append(sweep(args.nprocs, MODES[mode], sizes))
            finally:
                if beside is not None:
                    beside.kill()
                    beside.wait()

    def median(mode: str, size: int, field: int) -> float:
        return statistics.median(run[size][field] for run in runs[mode])

    base = modes[0]
    print(f"all_reduce, {args.nprocs} ranks, median of {args.rounds} jobs per mode, modes in turn (hpccomm-bench: "
          "median over calls of the slowest rank)\n")
    print("| size (B) | " + " | ".join(f"{mode} time (us), median (jobs' range)" for mode in modes) + " | "
          + " | ".join(f"{mode} / {base}" for mode in modes[1:]) + " | "
          + " | ".join(f"{mode} busbw (GB/s)" for mode in modes) + " |")
    print("|---:" * (3 * len(modes)) + "|")
    for size in sorted(runs[base][0]):
        times = [median(mode, size, 0) for mode in modes]
        spans = [(min(run[size][0] for run in runs[mode]), max(run[size][0] for run in runs[mode])) for mode in modes]
        print(f"| {size} | " + " | ".join(f"{time:.1f} ({low:.1f}-{high:.1f})" for time, (low, high) in zip(times, spans))
              + " | "
              + " | ".join(f"{time / times[0]:.2f}" for time in times[1:]) + " | "
              + " | ".join(f"{median(mode, size, 1):.2f}" for mode in modes) + " |")


if __name__ == "__main__":
    main()
