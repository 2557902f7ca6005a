"""The scale soak (issue 41, item 4): many jobs of 8-64 ranks, uneven exits, 0 false failures and 0 hangs.

    python benchmarks/scale_soak.py [--ranks 8,16,32,48,64] [--layouts one,two] [--load off,on]
                                    [--jobs 10] [--limit-s 600] [--dumps DIR] [--tree-from N] [--poll-idle]

Each job runs tests/ranks/scale_soak.py: every collective on the world, on half the ranks and on each node's
ranks, each result checked; destroy and init again; then a gather and a broadcast that some ranks join up to
1.5 s late while the others leave as soon as they have done their part. ``one`` node (``hpccomm-run -n N``)
or ``two`` fake nodes (tests/nodes.py, half the ranks on each); ``--load on`` runs a CPU-bound process beside
the job. A job counts as ok when every rank printed SOAK_OK and the launcher exited 0; as a false failure
when a rank raised PeerExitedError (a departed rank was taken for a failed one); as a hang when it passed
``--limit-s`` (stacks are taken, and the output kept under ``--dumps``); as wrong otherwise. ``--tree-from``
sets ``HPCCOMM_GOODBYE_TREE_FROM`` for the job (goodbyes over a tree from that many ranks; unset, hpccomm's
default). On two fake nodes Open MPI's waits yield the CPU (``mpi_yield_when_idle``, tests/mpi_library.py
openmpi_env): ``mpirun`` takes each fake node's ranks as its slots and would poll; ``--poll-idle`` turns that off,
as the soak ran before 2026-12-02 (a 16-rank job on two fake nodes: 183 s polling, 27 s yielding). The table:
per size, layout and load, the jobs, each outcome, the median and slowest job's wall time, the most messages a rank
sent and received for departures (goodbyes, and over the tree the batches of news it passed on), the messages all
ranks of a job sent (median over jobs), and the largest goodbye of a rank's own in bytes; each job's verdict and
time also go to stderr as it ends. Not a CI test: a 64-rank job on two fake nodes takes minutes on 2 cores. A job
needs the machine to itself: each rank holds about 330 MiB (torch), so 48-64 ranks take 16-21 GiB, and anything
large beside them (another job) sends the page cache thrashing, which shows as a hang at exit.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from launch import HPCCOMM_RUN, run_ranks  # noqa: E402
from nodes import run_on_nodes  # noqa: E402


def one_job(n: int, layout: str, seed: int, limit_s: float, env: dict[str, str]):
    """(verdict, wall seconds, (most sent, most received, sent by every rank), bytes, output)."""
    start = time.monotonic()
    if layout == "one":
        run = run_ranks(n, "scale_soak.py", str(seed), launcher=HPCCOMM_RUN, limit_s=limit_s, stacks_on_timeout=True,
                        env=env)
    else:
        run = run_on_nodes((n - n // 2, n // 2), "scale_soak.py", str(seed), limit_s=limit_s, stacks_on_timeout=True,
                           env=env)
    wall = time.monotonic() - start
    oks = re.findall(r"^SOAK_OK rank=\d+ bytes=(\d+)$", run.output, re.MULTILINE)
    exits = re.findall(r"^SOAK_EXIT rank=\d+ sent=(\d+) received=(\d+)$", run.output, re.MULTILINE)
    if run.timed_out:
        verdict = "hang"
    elif "PeerExitedError" in run.output:
        verdict = "false-failure"
    elif run.returncode == 0 and len(oks) == n:
        verdict = "ok"
    else:
        verdict = "wrong"
    messages = (max((int(s) for s, _ in exits), default=0), max((int(r) for _, r in exits), default=0),
                sum(int(s) for s, _ in exits))
    size = max((int(b) for b in oks), default=0)
    return verdict, wall, messages, size, run.output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="8,16,32,48,64")
    parser.add_argument("--layouts", default="one,two")
    parser.add_argument("--load", default="off,on")
    parser.add_argument("--jobs", type=int, default=10, help="jobs per size, layout and load")
    parser.add_argument("--limit-s", type=float, default=600.0)
    parser.add_argument("--dumps", default=None, help="keep the output of every job that was not ok here")
    parser.add_argument("--tree-from", type=int, default=None, help="HPCCOMM_GOODBYE_TREE_FROM for the jobs")
    parser.add_argument("--poll-idle", action="store_true", help="Open MPI's waits poll on two fake nodes (no yield)")
    args = parser.parse_args()
    env = {} if args.tree_from is None else {"HPCCOMM_GOODBYE_TREE_FROM": str(args.tree_from)}
    dumps = Path(args.dumps) if args.dumps else None
    if dumps:
        dumps.mkdir(parents=True, exist_ok=True)
    print("| ranks | layout | load | jobs | ok | false failures | hangs | wrong | median s | slowest s "
          "| goodbye messages a rank sent / received, most | goodbye messages a job, median | largest goodbye, bytes |")
    print("|---" * 13 + "|", flush=True)
    totals: dict[str, int] = {}
    for layout in args.layouts.split(","):
        job_env = {**env, "OMPI_MCA_mpi_yield_when_idle": "0"} if args.poll_idle and layout == "two" else env
        for n in (int(part) for part in args.ranks.split(",")):
            for load in (part == "on" for part in args.load.split(",")):
                hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load else None
                outcomes = []
                try:
                    for seed in range(args.jobs):
                        outcomes.append(one_job(n, layout, seed, args.limit_s, job_env))
                        # Each job as it ends, on stderr: a soak stopped midway keeps what it ran.
                        print(f"job ranks={n} layout={layout} load={'on' if load else 'off'} seed={seed} "
                              f"verdict={outcomes[-1][0]} wall_s={outcomes[-1][1]:.1f}", file=sys.stderr, flush=True)
                finally:
                    if hog is not None:
                        hog.kill()
                        hog.wait()
                counts = {verdict: sum(1 for o in outcomes if o[0] == verdict)
                          for verdict in ("ok", "false-failure", "hang", "wrong")}
                for verdict, count in counts.items():
                    totals[verdict] = totals.get(verdict, 0) + count
                for seed, (verdict, _wall, _s, _b, output) in enumerate(outcomes):
                    if verdict != "ok" and dumps:
                        (dumps / f"{verdict}-{layout}-{n}-load{int(load)}-seed{seed}.txt").write_text(output)
                walls = [o[1] for o in outcomes]
                print(f"| {n} | {layout} | {'on' if load else 'off'} | {len(outcomes)} | {counts['ok']} | "
                      f"{counts['false-failure']} | {counts['hang']} | {counts['wrong']} | "
                      f"{statistics.median(walls):.1f} | {max(walls):.1f} | {max(o[2][0] for o in outcomes)} / "
                      f"{max(o[2][1] for o in outcomes)} | {statistics.median(o[2][2] for o in outcomes):.0f} | "
                      f"{max(o[3] for o in outcomes)} |", flush=True)
    print("\ntotal: " + ", ".join(f"{verdict} {count}" for verdict, count in totals.items()), flush=True)


if __name__ == "__main__":
    main()
