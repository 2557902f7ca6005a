"""Fault-tolerant mode under stress: ranks die at every moment, on every path, run after run (issues 32, 40).

    python benchmarks/ft_stress.py [--rounds 1] [--modes shrink,repair,checks] [--moments before,mid,...]
                                   [--paths shm,flat,hier] [--load off,on] [--dumps DIR] [--json FILE]

Each round runs tests/ranks/ft_training.py (modes ``shrink`` and ``repair``)
once per scenario, under ``hpccomm-run --ft`` (Open MPI 5 with ULFM, torch
>= 2.14): a training loop of 30 steps whose victims SIGKILL themselves at
step 5, at one moment (``before`` an all_reduce, ``between`` two, in the
``mid``dle of one, in DDP's ``backward``, while the survivors agree on a
first death (``agreement``), while they build the shrunk group (``shrink``),
as they learn the new world, its first step (``join``)), or SIGSTOP
themselves (``stop``, with ULFM's heartbeat detector turned on for that run:
it must find them; not in the default list, see docs/fault-tolerance.md); on
one path (the node's shared-memory engine ``shm``, ``flat`` MPI,
``hier``archical over two fake nodes, tests/nodes.py: root, unshare); at 3
and 4 ranks, one victim or two; without and with a CPU-bound process beside
the job (``--load``). The survivors shrink, redo the step and train 25 steps
more, then check their ranks and values.

Mode ``repair`` starts the job with spares (``hpccomm-run --ft --spares K``):
the survivors call ``hpccomm.repair`` and every rank resumes with
``hpccomm.TrainingState``; a spare takes each dead rank's place, and the job
ends at its full size (one and two deaths, one and two spares, and a death
as the survivors start the repair, ``repair``); with fewer spares than
deaths it shrinks, and the spare left leaves at the end. Each replacement's
``REPLACED`` line gives the time from the last death to the first step at
full size (``back``).

Mode ``checks`` runs the other deaths tests/test_fault_tolerance.py kills
ranks with (tests/ranks/fault_tolerance.py): ``between`` two all_reduces, in
the middle of an async 64 MiB one (``mid-async``), during the agreement on a
first death (``during-agreement``), survivors that ``exit`` instead of
shrinking, a neighbour that dies as the tree of stops relays the last one
(``relay-dies``), each on every path here rather than on the one its test
picks (``hier``: the ranks split evenly over the two fake nodes, so that at
3 ranks the failed collective is flat across them, hierarchical at 4 and 6;
each run's PATH lines must say which); and the ``store``'s error after rank
0, its server, died (tests/ranks/store.py ``rank0-dies``), whose lag is how
long the failed store operation took. The tests assert what the survivors
learnt and print these lags; this mode bounds them.

A run is a hang when it outlives 120 s: the ranks are sent SIGUSR1 (their
Python stacks, every thread) and killed, and the output kept under
``--dumps``. It is wrong when it exits non-zero, a survivor reports a wrong
value or rank, no OK comes from a survivor, or (mode ``checks``) a victim
printed no DIED, a survivor learnt of no death or learnt it on another path
than asked, or (``relay-dies``) the stops did not go over the tree with rank
0 relaying one. Each PeerFailure is timed from the last death before it (the
``DIED``/``FAILED`` lines' clock). Prints a table, one row a scenario, then
the totals; exits 1 unless every run recovered, with every PeerFailure
within 5 s of its death (a stopped rank: the detector's 4 s timeout more),
and every store error within 5 s of the store operation's call.
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
#: (moment, ranks, victims, environment) of mode ``checks``: tests/test_fault_tolerance.py's cases of
#: tests/ranks/fault_tolerance.py (``relay-dies`` with the stops over a tree from 2 ranks, as there), and the store's.
CHECK_CASES = [
    ("between", 3, "1", {}), ("between", 4, "1,2", {}), ("mid-async", 3, "1", {}), ("mid-async", 4, "2", {}),
    ("during-agreement", 4, "1,2", {}), ("exit", 3, "1", {}),
    ("relay-dies", 6, "1,2", {"HPCCOMM_GOODBYE_TREE_FROM": "2"}), ("store", 3, "0", {}),
]
#: A stopped rank is found by ULFM's heartbeat detector: its timeout, then the usual bound.
STOPPED_WITHIN_S = FT_DETECTOR_TIMEOUT_S + DETECTED_WITHIN_S


@dataclass
class Outcome:
    """One run of one scenario."""

    mode: str  # "shrink", "repair" (tests/ranks/ft_training.py) or "checks"
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


def run_once(path: str, moment: str, ranks: int, victims: str, load: bool, seed: int, spares: int = 0,
             mode: str = "shrink", env: dict[str, str] | None = None) -> tuple[Outcome, RankRun]:
    """One scenario's job, judged.

    Args:
        path: a key of :data:`PATHS` (``hier``: on two fake nodes, as :func:`nodes` says).
        moment: when the victims die (the module docstring).
        ranks: the job's ranks, spares not counted.
        victims: their ranks, comma-separated.
        load: whether a CPU-bound process runs beside the job (the caller starts it).
        seed: tests/ranks/ft_training.py's seed.
        spares: spare processes (mode ``repair``).
        mode: ``shrink`` or ``repair`` (tests/ranks/ft_training.py) or ``checks`` (:data:`CHECK_CASES`).
        env: more environment for the ranks (a check case's).
    """
    if mode != "checks":
        script, args = "ft_training.py", (moment, victims, "--seed", str(seed), "--spares", str(spares))
    elif moment == "store":
        script, args = "store.py", ("rank0-dies",)
    else:
        script, args = "fault_tolerance.py", (moment, victims)
    # hpccomm-run --ft's environment (on fake nodes mpirun starts the ranks); a stopped rank needs ULFM's detector.
    env = {**PATHS[path], **(env or {}),
           **{setting.name: setting.value for setting in fault_tolerance_settings(spares)},
           **(FT_DETECTOR_SETTINGS if moment == "stop" else {})}
    start = time.monotonic()
    if path == "hier":
        run = run_on_nodes(nodes(mode, ranks, spares), script, *args, env=env, launcher_options=["--with-ft", "ulfm"],
                           limit_s=LIMIT_S, stacks_on_timeout=True)
    else:
        run = run_ranks(ranks, script, *args, env=env, launcher=[*HPCCOMM_RUN, "--ft", "--spares", str(spares)],
                        limit_s=LIMIT_S, stacks_on_timeout=True)
    outcome = Outcome(mode, path, moment, ranks, victims, load, spares, round(time.monotonic() - start, 2), "ok")
    judge(outcome, run, ranks, victims, spares)
    return outcome, run


def nodes(mode: str, ranks: int, spares: int) -> list[int]:
    """The processes on each fake node of path ``hier``: the training loop's 2 on the first (the spares, the job's
    last processes, on the second); a check's split evenly (the first node one more where odd)."""
    return [2, ranks - 2 + spares] if mode != "checks" else [ranks - ranks // 2, ranks // 2]


def path_taken(path: str, per_node: list[int]) -> str:
    """What tests/ranks/fault_tolerance.py's PATH line says its failed collective took on ``path``: hierarchical
    only where every node has the same number of ranks, two or more (hpccomm/transports/topology_aware.py)."""
    if path == "hier":
        return "hier" if len(set(per_node)) == 1 and per_node[0] >= 2 else "flat"
    return {"shm": "node", "flat": "flat"}[path]


def after_the_last_death(at: float, deaths: list[float]) -> float | None:
    """Seconds from the last death before ``at`` (the same clock) to ``at``; None before any."""
    before = [death for death in deaths if death <= at]
    return round(at - before[-1], 4) if before else None


def judge(outcome: Outcome, run: RankRun, ranks: int, victims: str, spares: int = 0) -> None:
    """Fill in the verdict, the lags and the counts from the run's output."""
    dead = victims.split(",")
    survivors = {str(rank) for rank in range(ranks) if str(rank) not in dead}
    if spares >= len(dead):
        survivors = {str(rank) for rank in range(ranks)}  # replaced: every rank ends, at its number
    deaths = sorted(float(at) for at in re.findall(r"^DIED rank=\d+ at=([\d.]+)", run.output, re.MULTILINE))
    for at in re.findall(r"^REPLACED rank=\d+ step=\d+ at=([\d.]+)", run.output, re.MULTILINE):
        if (back := after_the_last_death(float(at), deaths)) is not None:
            outcome.back.append(back)
    # Each survivor's PeerFailure: tests/ranks/ft_training.py's line (step, in, uneven) or fault_tolerance.py's (took).
    caught = re.findall(r"^FAILED rank=(\d+) \S+ at=([\d.]+)(?: in=(\w+) uneven=(.*))?", run.output, re.MULTILINE)
    for _, at, where, uneven in caught:
        if (lag := after_the_last_death(float(at), deaths)) is not None:
            outcome.lags.append(lag)
        outcome.uneven += bool(where) and uneven.strip() not in ("{}", "?")
        outcome.in_shrink += where == "shrink"
    # The store's error after its server's death: how long the store operation took to fail (tests/ranks/store.py).
    errors = re.findall(r"^STORE-ERROR rank=(\d+) after=([\d.]+)", run.output, re.MULTILINE)
    outcome.lags += [float(after) for _, after in errors]
    oks = set(re.findall(r"^OK rank=(\d+)", run.output, re.MULTILINE))
    outcome.diff = max((float(d) for d in re.findall(r"^OK rank=\d+ diff=(\S+)", run.output, re.MULTILINE)),
                       default=0.0)
    checked = outcome.mode != "checks" or checked_as_the_test_checks(outcome, run.output, survivors, len(dead),
                                                                    len(deaths), len(caught))
    if run.timed_out:
        outcome.verdict, outcome.why = "hang", run.output[-3000:]
    elif run.returncode != 0 or oks != survivors or not checked or "WRONG" in run.output or "UNEXPECTED" in run.output:
        outcome.verdict, outcome.why = "wrong", run.output[-3000:]
    elif any(lag >= (STOPPED_WITHIN_S if outcome.moment == "stop" else DETECTED_WITHIN_S) for lag in outcome.lags):
        outcome.verdict = "late"


def checked_as_the_test_checks(outcome: Outcome, output: str, survivors: set[str], victims: int, deaths: int,
                               caught: int) -> bool:
    """Whether a ``checks`` run holds what tests/test_fault_tolerance.py asserts of it: every victim died (its DIED
    line; the store's server prints none), every survivor learnt of it (its PeerFailure, timed from a death, or
    the store's error), its failed collective on the path asked for; at ``relay-dies`` every survivor's stops
    over the tree, and rank 0 relaying one."""
    learnt = set(re.findall(r"^(?:FAILED|STORE-ERROR) rank=(\d+)", output, re.MULTILINE))
    paths = set(re.findall(r"^PATH rank=\d+ (\w+)", output, re.MULTILINE))
    taken = path_taken(outcome.path, nodes(outcome.mode, outcome.ranks, outcome.spares))
    if learnt != survivors or not paths <= {taken}:
        return False
    if outcome.moment != "store" and (deaths != victims or len(outcome.lags) != caught):
        return False
    if outcome.moment == "relay-dies":
        trees = re.findall(r"^STOPS rank=\d+ tree=(\d)", output, re.MULTILINE)
        relayed = re.search(r"^STOPS rank=0 .* relayed=[1-9]", output, re.MULTILINE)
        return trees == ["1"] * len(survivors) and relayed is not None
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default="shrink,repair,checks",
                        help="the training loop without spares (shrink) and/or with (repair); the tests' other deaths "
                             "(checks)")
    parser.add_argument("--moments", default="before,between,mid,backward,agreement,shrink,join,repair,"
                                             "mid-async,during-agreement,exit,relay-dies,store")
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
                modes = args.modes.split(",")
                cases = [("shrink", *case, 0, {}) for case in CASES] if "shrink" in modes else []
                cases += [("repair", *case, {}) for case in REPAIR_CASES] if "repair" in modes else []
                cases += [("checks", moment, n, victims, 0, env) for moment, n, victims, env in CHECK_CASES
                          ] if "checks" in modes else []
                for path in paths:
                    for mode, moment, ranks, victims, spares, env in cases:
                        if moment not in moments:
                            continue
                        outcome, run = run_once(path, moment, ranks, victims, load, seed=round_, spares=spares,
                                                mode=mode, env=env)
                        outcomes.append(outcome)
                        if outcome.verdict != "ok":
                            dumps.mkdir(parents=True, exist_ok=True)
                            name = (f"{outcome.verdict}-{mode}-{path}-{moment}-{ranks}-{victims}-s{spares}-"
                                    f"{int(load)}-{round_}.txt")
                            (dumps / name).write_text(run.output)
                        print(f"{len(outcomes)}: {mode} {path} {moment} n={ranks} victims={victims} spares={spares} "
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
        rows.setdefault((o.mode, o.path, o.moment, o.ranks, o.victims, o.spares, o.load), []).append(o)
    print("\n| mode | path | moment | ranks | victims | spares | load | runs | recovered | hangs | wrong | late "
          "| uneven | death in shrink | lag median s | lag max s | back at full size median s | worst s "
          "| wall median s | max diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (mode, path, moment, ranks, victims, spares, load), group in rows.items():
        print(f"| {mode} | {path} | {moment} | {ranks} | {victims} | {spares} | {'on' if load else 'off'} | "
              + summary(group))
    print("| **all** | | | | | | | " + summary(outcomes))
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
