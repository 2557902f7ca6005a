"""Recovery from a rank's death, run after run: examples/train_ft.py under ``hpccomm-run --ft``.

    python benchmarks/ft_recovery.py [--runs 10] [-n 4] [--steps 60] [--first-seed 1]

Each run kills one rank at a step both picked by its seed (seeds
``first-seed`` .. ``first-seed + runs - 1``). A run recovers when the job
exits 0 and the new rank 0's RESULT says the final parameters match the
one-process replay. Prints a table, one row a run, then the median and worst
of detection (the victim's SIGKILL to the last survivor's error), shrink
(``dist.shrink_group``, slowest survivor) and recovery (error to DDP rebuilt);
exits 1 unless every run recovered.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_ft.py"
LIMIT_S = 180


def run_once(nprocs: int, steps: int, seed: int) -> dict:
    """One run of the example; its RESULT, with ``detect_s`` and ``ok`` added."""
    hpccomm_run = os.path.join(os.path.dirname(sys.executable), "hpccomm-run")
    command = [hpccomm_run, "--ft", "-n", str(nprocs), sys.executable, str(EXAMPLE), "--steps", str(steps),
               "--seed", str(seed)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        return {"seed": seed, "ok": False, "why": f"still running after {LIMIT_S} s"}
    output = proc.stdout + proc.stderr
    found = re.search(r"^RESULT (.*)$", output, re.MULTILINE)
    killed = re.search(r"^KILL rank=\d+ at=([\d.]+)$", output, re.MULTILINE)
    if proc.returncode != 0 or not found or not killed:
        return {"seed": seed, "ok": False, "why": f"exit {proc.returncode}: {output[-1500:]}"}
    result = json.loads(found.group(1))
    result["detect_s"] = round(result["caught_at"] - float(killed.group(1)), 4)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("-n", "--nprocs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--first-seed", type=int, default=1)
    args = parser.parse_args()

    results = []
    print("| run | seed | victim | step | detect s | shrink s | recover s | max diff | recovered |")
    print("|---|---|---|---|---|---|---|---|---|")
    for index in range(args.runs):
        result = run_once(args.nprocs, args.steps, args.first_seed + index)
        results.append(result)
        if result["ok"]:
            print(f"| {index + 1} | {result['seed']} | {result['victim']} | {result['kill_at']} | "
                  f"{result['detect_s']:.3f} | {result['shrink_s']:.4f} | {result['recover_s']:.4f} | "
                  f"{result['max_diff']:.2g} | yes |", flush=True)
        else:
            print(f"| {index + 1} | {result['seed']} | | | | | | | NO: {result['why']!r} |", flush=True)
    good = [r for r in results if r["ok"]]
    print(f"\nrecovered in {len(good)} of {len(results)} runs ({args.nprocs} ranks, one killed)")
    for key in ("detect_s", "shrink_s", "recover_s"):
        values = [r[key] for r in good]
        if values:
            print(f"{key}: median {statistics.median(values):.4f}, worst {max(values):.4f}")
    sys.exit(0 if len(good) == len(results) else 1)


if __name__ == "__main__":
    main()
