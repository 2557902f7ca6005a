"""How soon a rank that left without doing its part is reported (fail-fast's planted-fault time, issue 41).

    python benchmarks/exit_lag.py [--ranks 2,4,8] [--jobs 10] [--modes collective,p2p] [--tree-from N]

Runs tests/ranks/exit_lag.py: rank 1 leaves with ``sys.exit(3)`` while the others wait on an all-reduce (or
rank 0 on a receive from it); each other rank reports the seconds from rank 1's exit to its
``PeerExitedError``. Prints, per size and mode, the median and largest lag over every rank of every job.
``--tree-from`` sets ``HPCCOMM_GOODBYE_TREE_FROM`` (goodbyes over a tree from that many ranks).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from launch import HPCCOMM_RUN, run_ranks  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,4,8")
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--modes", default="collective,p2p")
    parser.add_argument("--tree-from", type=int, default=None, help="HPCCOMM_GOODBYE_TREE_FROM for the jobs")
    args = parser.parse_args()
    env = {} if args.tree_from is None else {"HPCCOMM_GOODBYE_TREE_FROM": str(args.tree_from)}
    print("| ranks | mode | jobs | lags | median s | largest s | unexpected |")
    print("|---|---|---|---|---|---|---|")
    for n in (int(part) for part in args.ranks.split(",")):
        for mode in args.modes.split(","):
            lags, unexpected = [], 0
            for _ in range(args.jobs):
                run = run_ranks(n, "exit_lag.py", mode, launcher=HPCCOMM_RUN, limit_s=120, env=env)
                lags += [float(s) for s in re.findall(r"^LAG rank=\d+ s=([0-9.]+)$", run.output, re.MULTILINE)]
                unexpected += run.output.count("UNEXPECTED") + int(run.timed_out)
            print(f"| {n} | {mode} | {args.jobs} | {len(lags)} | {statistics.median(lags) if lags else 0:.3f} | "
                  f"{max(lags, default=0):.3f} | {unexpected} |", flush=True)


if __name__ == "__main__":
    main()
