"""Fault-tolerant mode under stress: ranks die at every moment, on every path, run after run (issues 32, 40).

    python benchmarks/ft_stress.py [--rounds 1] [--modes shrink,repair] [--moments before,mid,...]
                                   [--paths shm,flat,hier] [--load off,on] [--dumps DIR] [--json FILE]

Each round runs tests/ranks/ft_training.py once per scenario, under
``hpccomm-run --ft`` (Open MPI 5 with ULFM, torch >= 2.14): a training loop
of 30 steps whose victims SIGKILL themselves at step 5, at one moment
(``before`` an all_reduce, ``between`` two, in the ``mid``dle of one, in DDP's
``backward``, while the survivors agree on a first death (``agreement``),
while they build the shrunk group (``shrink``), as they learn the new world,
its first step (``join``)), or SIGSTOP themselves
(``stop``, with ULFM's heartbeat detector turned on for that run: it must
find them; not in the default list, see docs/fault-tolerance.md); on one path (the node's
shared-memory engine ``shm``, ``flat`` MPI, ``hier``archical over two fake
nodes, tests/nodes.py: root, unshare); at 3 and 4 ranks, one victim or two;
without and with a CPU-bound process beside the job (``--load``). The
survivors shrink, redo the step and train 25 steps more, then check their
ranks and values.

Mode ``repair`` starts the job with spares (``hpccomm-run --ft --spares K``):
the survivors call ``hpccomm.repair`` and every rank resumes with
``hpccomm.TrainingState``; a spare takes each dead rank's place, and the job
ends at its full size (one and two deaths, one and two spares, and a death
as the survivors start the repair, ``repair``); with fewer spares than
deaths it shrinks, and the spare left leaves at the end. Each replacement's
``REPLACED`` line gives the time from the last death to the first step at
full size (``back``).

A run is a hang when it outlives 120 s: the ranks are sent SIGUSR1 (their
Python stacks, every thread) and killed, and the output kept under
``--dumps``. It is wrong when it exits non-zero, a survivor reports a wrong
value or rank, or no OK comes from a survivor. Each PeerFailure is timed
from the last death before it (the ``DIED``/``FAILED`` lines' clock).
Prints a table, one row a scenario, then the totals; exits 1 unless every
run recovered, with every PeerFailure within 5 s of its death (a stopped
rank: the detector's 4 s timeout more).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from hpccomm_run import FT_DETECTOR_SETTINGS, FT_DETECTOR_TIMEOUT_S, fault_tolerance_settings  # noqa: E402
from launch import HIER_EVERYWHERE, HPCCOMM_RUN, RankRun, run_ranks  # noqa: E402
from nodes import run_on_nodes  # noqa: E402

LIMIT_S = 120
DETECTED_WITHIN_S = 5.0
PATHS = {"shm": {"HPCCOMM_SHM_MIN_BYTES": "1"}, "flat": {"HPCCOMM_ALGO": "flat"}, "hier": HIER_EVERYWHERE}
#: (moment, ranks, victims): one victim at 3 and 4 ranks, two at 4.
CASES = [
    *[(moment, n, "1" if n == 3 else "2") for moment in ("before", "between", "mid", "backward") for n in (3, 4)],
    ("before", 4, "1,2"), ("mid", 4, "1,2"), ("agreement", 4, "1,2"), ("shrink", 4, "1,2"), ("join", 4, "1,2"),
    ("stop", 4, "2"),
]
#: (moment, ranks, victims, spares) with spares: one death and one spare at 3 and 4 ranks, two deaths and two spares
#: (at the same step, during the agreement, as the survivors start the repair, while they and the replacement build
#: the repaired group: ``shrink``, as they learn the new world, which a replacement does as it joins: ``join``), two
#: deaths and one spare (too few:
#: a shrink), one death and two spares (one left waiting until the end).
REPAIR_CASES = [
    *[(moment, n, "1" if n == 3 else "2", 1) for moment in ("before", "between", "mid", "backward") for n in (3, 4)],
    ("before", 4, "1,2", 2), ("mid", 4, "1,2", 2), ("agreement", 4, "1,2", 2), ("repair", 4, "1,2", 2),
    ("shrink", 4, "1,2", 2), ("join", 4, "1,2", 2),
    ("before", 4, "1,2", 1), ("between", 4, "2", 2),
]
#: A stopped rank is found by ULFM's heartbeat detector: its timeout, then the usual bound.
STOPPED_WITHIN_S = FT_DETECTOR_TIMEOUT_S + DETECTED_WITHIN_S


@dataclass
class Outcome:
    """One run of one scenario."""

    path: str
    moment: str
    ranks: int
    victims: str
    load: bool
    spares: int
    wall_s: float
    verdict: str  # "ok", "hang", "wrong", "late"
    lags: list[float] = field(default_factory=list)
    uneven: int = 0
    in_shrink: int = 0
    back: list[float] = field(default_factory=list)
    diff: float = 0.0  # the largest difference from the expected values a rank reported (DDP: the replay's)
    why: str = ""


def run_once(path: str, moment: str, ranks: int, victims: str, load: bool, seed: int,
             spares: int = 0) -> tuple[Outcome, RankRun]:
    args = (moment, victims, "--seed", str(seed), "--spares", str(spares))
    # hpccomm-run --ft's environment (on fake nodes mpirun starts the ranks); a stopped rank needs ULFM's detector.
    env = {**PATHS[path], **{setting.name: setting.value for setting in fault_tolerance_settings(spares)},
           **(FT_DETECTOR_SETTINGS if moment == "stop" else {})}
    start = time.monotonic()
    if path == "hier":
        per_node = [2, ranks - 2 + spares]  # the spares are the job's last processes
        run = run_on_nodes(per_node, "ft_training.py", *args, env=env, launcher_options=["--with-ft", "ulfm"],
                           limit_s=LIMIT_S, stacks_on_timeout=True)
    else:
        run = run_ranks(ranks, "ft_training.py", *args, env=env, launcher=[*HPCCOMM_RUN, "--ft", "--spares", str(spares)],
                        limit_s=LIMIT_S, stacks_on_timeout=True)
    outcome = Outcome(path, moment, ranks, victims, load, spares, round(time.monotonic() - start, 2), "ok")
    judge(outcome, run, ranks, victims, spares)
    return outcome, run


def judge(outcome: Outcome, run: RankRun, ranks: int, victims: str, spares: int = 0) -> None:
    """Fill in the verdict, the lags and the counts from the run's output."""
    dead = victims.split(",")
    survivors = {str(rank) for rank in range(ranks) if str(rank) not in dead}
    if spares >= len(dead):
        survivors = {str(rank) for rank in range(ranks)}  # replaced: every rank ends, at its number
    deaths = sorted(float(at) for at in re.findall(r"^DIED rank=\d+ at=([\d.]+)", run.output, re.MULTILINE))
    for at in re.findall(r"^REPLACED rank=\d+ step=\d+ at=([\d.]+)", run.output, re.MULTILINE):
        before = [death for death in deaths if death <= float(at)]
        if before:
            outcome.back.append(round(float(at) - before[-1], 4))
    for at, where, uneven in re.findall(r"^FAILED rank=\d+ step=\d+ at=([\d.]+) in=(\w+) uneven=(.*)$",
                                        run.output, re.MULTILINE):
        before = [death for death in deaths if death <= float(at)]
        if before:
            outcome.lags.append(round(float(at) - before[-1], 4))
        outcome.uneven += uneven.strip() not in ("{}", "?")
        outcome.in_shrink += where == "shrink"
    oks = set(re.findall(r"^OK rank=(\d+)", run.output, re.MULTILINE))
    outcome.diff = max((float(d) for d in re.findall(r"^OK rank=\d+ diff=(\S+)", run.output, re.MULTILINE)),
                       default=0.0)
    if run.timed_out:
        outcome.verdict, outcome.why = "hang", run.output[-3000:]
    elif run.returncode != 0 or oks != survivors or "WRONG" in run.output:
        outcome.verdict, outcome.why = "wrong", run.output[-3000:]
    elif any(lag >= (STOPPED_WITHIN_S if outcome.moment == "stop" else DETECTED_WITHIN_S) for lag in outcome.lags):
        outcome.verdict = "late"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default="shrink,repair", help="without spares (shrink) and/or with (repair)")
    parser.add_argument("--moments", default="before,between,mid,backward,agreement,shrink,join,repair")
    parser.add_argument("--paths", default="shm,flat,hier")
    parser.add_argument("--load", default="off,on", help="without (off) and/or with (on) a CPU-bound process")
    parser.add_argument("--dumps", default="ft-stress-dumps", help="where the output of bad runs goes")
    parser.add_argument("--json", default=None, help="also write every run's outcome here")
    args = parser.parse_args()

    moments, paths = args.moments.split(","), args.paths.split(",")
    loads = [part == "on" for part in args.load.split(",")]
    dumps = Path(args.dumps)
    outcomes: list[Outcome] = []
    started = time.monotonic()
    for round_ in range(args.rounds):
        for load in loads:
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load else None
            try:
                cases = [(*case, 0) for case in CASES] if "shrink" in args.modes.split(",") else []
                cases += REPAIR_CASES if "repair" in args.modes.split(",") else []
                for path in paths:
                    for moment, ranks, victims, spares in cases:
                        if moment not in moments:
                            continue
                        outcome, run = run_once(path, moment, ranks, victims, load, seed=round_, spares=spares)
                        outcomes.append(outcome)
                        if outcome.verdict != "ok":
                            dumps.mkdir(parents=True, exist_ok=True)
                            name = (f"{outcome.verdict}-{path}-{moment}-{ranks}-{victims}-s{spares}-{int(load)}-"
                                    f"{round_}.txt")
                            (dumps / name).write_text(run.output)
                        print(f"{len(outcomes)}: {path} {moment} n={ranks} victims={victims} spares={spares} "
                              f"load={int(load)}: {outcome.verdict} {outcome.wall_s} s lags={outcome.lags} "
                              f"back={outcome.back} diff={outcome.diff:.2g}", flush=True)
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
    report(outcomes, time.monotonic() - started)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    sys.exit(0 if all(o.verdict == "ok" for o in outcomes) else 1)


def report(outcomes: list[Outcome], took_s: float) -> None:
    """The table: one row a scenario, then the totals."""
    rows: dict[tuple, list[Outcome]] = {}
    for o in outcomes:
        rows.setdefault((o.path, o.moment, o.ranks, o.victims, o.spares, o.load), []).append(o)
    print("\n| path | moment | ranks | victims | spares | load | runs | recovered | hangs | wrong | late | uneven "
          "| death in shrink | lag median s | lag max s | back at full size median s | worst s | wall median s "
          "| max diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (path, moment, ranks, victims, spares, load), group in rows.items():
        print(f"| {path} | {moment} | {ranks} | {victims} | {spares} | {'on' if load else 'off'} | " + summary(group))
    print("| **all** | | | | | | " + summary(outcomes))
    print(f"\n{len(outcomes)} runs in {took_s / 60:.1f} min")


def summary(group: list[Outcome]) -> str:
    lags = [lag for o in group for lag in o.lags]
    back = [seconds for o in group for seconds in o.back]
    count = {verdict: sum(o.verdict == verdict for o in group) for verdict in ("ok", "hang", "wrong", "late")}
    return (f"{len(group)} | {count['ok']} | {count['hang']} | {count['wrong']} | {count['late']} | "
            f"{sum(o.uneven > 0 for o in group)} | {sum(o.in_shrink > 0 for o in group)} | "
            f"{f'{statistics.median(lags):.3f}' if lags else '-'} | {f'{max(lags):.3f}' if lags else '-'} | "
            f"{f'{statistics.median(back):.3f}' if back else '-'} | {f'{max(back):.3f}' if back else '-'} | "
            f"{statistics.median(o.wall_s for o in group):.1f} | {max(o.diff for o in group):.2g} |")


if __name__ == "__main__":
    main()
