"""What fault-tolerant mode's agreement costs in stops, told to every rank or over the tree (issue 41).

    python benchmarks/stop_cost.py [--ranks 8,16,32] [--jobs 3] [--tree-from 0,2] [--victims 1] [--limit-s 600]

Runs tests/ranks/fault_tolerance.py ``between`` under ``hpccomm-run --ft``: the victims SIGKILL themselves between
two all_reduces, and every survivor meets the failure, says where it stopped
(:mod:`hpccomm.fault_tolerance.stop_points`), agrees, shrinks and goes on. Each survivor prints the messages of
stops it sent and received. ``--tree-from`` values are ``HPCCOMM_GOODBYE_TREE_FROM`` for the jobs: ``0``, each
survivor tells every other rank; ``2``, the stops travel a tree of the group's ranks at every size (hpccomm's
default is 64). Prints, per size and mode, the most messages a survivor sent and received, the messages a job's
survivors sent (median over jobs), and the seconds from the death to each survivor's PeerFailure (median and
largest), with the jobs that were not ok. Not a CI test: a 32-rank job takes a minute or more on 2 cores; a
64-rank job about 5 minutes, and more memory than 24 GiB holds (about 373 MiB a rank with torch 2.15.0: it ran
with a swap file added; docs/scale.md).
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
    parser.add_argument("--ranks", default="8,16,32")
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--tree-from", default="0,2", help="HPCCOMM_GOODBYE_TREE_FROM values, one row each")
    parser.add_argument("--victims", default="1")
    parser.add_argument("--limit-s", type=float, default=600.0, help="a job's wall-clock limit")
    args = parser.parse_args()
    print("| ranks | stops | jobs | not ok | most sent a survivor | most received | sent a job (median) "
          "| death to PeerFailure s, median / largest |")
    print("|---|---|---|---|---|---|---|---|")
    for n in (int(part) for part in args.ranks.split(",")):
        for tree_from in args.tree_from.split(","):
            env = {"HPCCOMM_GOODBYE_TREE_FROM": tree_from, "HPCCOMM_ALGO": "flat"}
            sent, received, totals, lags, bad = [], [], [], [], 0
            for _ in range(args.jobs):
                run = run_ranks(n, "fault_tolerance.py", "between", args.victims, env=env,
                                launcher=[*HPCCOMM_RUN, "--ft"], limit_s=args.limit_s, stacks_on_timeout=True)
                stops = re.findall(r"^STOPS rank=\d+ tree=\d sent=(\d+) received=(\d+) relayed=\d+$", run.output,
                                   re.MULTILINE)
                died = [float(at) for at in re.findall(r"DIED rank=\d+ at=([\d.]+)", run.output)]
                caught = [float(at) for at in re.findall(r"FAILED rank=\d+ took=\S+ at=([\d.]+)", run.output)]
                if run.timed_out or run.returncode != 0 or not died or len(stops) != len(caught):
                    bad += 1
                    print(run.output[-3000:], file=sys.stderr)
                    continue
                sent += [int(s) for s, _ in stops]
                received += [int(r) for _, r in stops]
                totals.append(sum(int(s) for s, _ in stops))
                lags += [at - max(died) for at in caught]
                print(f"job: {n} ranks, tree from {tree_from}: sent {[int(s) for s, _ in stops]}", file=sys.stderr,
                      flush=True)
            mode = "every rank told" if tree_from == "0" else f"tree from {tree_from}"
            print(f"| {n} | {mode} | {args.jobs} | {bad} | {max(sent, default=0)} | {max(received, default=0)} | "
                  f"{statistics.median(totals) if totals else 0:.0f} | "
                  f"{statistics.median(lags) if lags else 0:.3f} / {max(lags, default=0):.3f} |", flush=True)


if __name__ == "__main__":
    main()
