"""The GPU acceptance run's targets table: PASS or SHORT per target, every ratio from that run's own numbers.

    python tests/gpu/targets.py OUT_DIR > OUT_DIR/targets.md

Reads what tests/gpu/acceptance.sh wrote into OUT_DIR: ``compare.json``
(benchmarks/cuda_allreduce.py --compare: every hpccomm path and Gloo),
``perftest-oop.txt`` and ``perftest-inplace.txt`` (UCC's own ucc_perftest
all-reduce on CUDA memory), ``floor-1.json`` (benchmarks/cuda_staging_floor.py
at one rank) and ``pytest-1.txt``/``pytest-2.txt`` (tests/gpu, twice). A
target whose numbers are missing (the part did not run, or failed) says "not
measured", never PASS. Runs anywhere: without a GPU every row says so.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

MIB = 1 << 20
#: A ucc_perftest result line: count, size (bytes), then avg, min and max time (us).
PERFTEST_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")


def load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def perftest_us(path: Path) -> dict[int, float]:
    """Average time (us) per message size (bytes) from a ucc_perftest log; empty if none."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    return {int(m[2]): float(m[3]) for m in map(PERFTEST_ROW.match, lines) if m}


def path_us(compare: Any, path: str, size: int) -> float | None:
    """One hpccomm path's time at ``size`` from the compare summary (``gloo`` for Gloo's)."""
    for row in (compare or {}).get("rows", []):
        if row["bytes"] == size:
            return row["gloo"] if path == "gloo" else row["us"].get(path)
    return None


def passed_twice(out: Path, test: str) -> bool | None:
    """Whether ``test`` passed in both tests/gpu passes; None if neither log names it."""
    seen = []
    for n in (1, 2):
        try:
            text = (out / f"pytest-{n}.txt").read_text()
        except OSError:
            return None
        if test not in text:
            return None
        seen.append(f"{test} PASSED" in text)
    return all(seen)


def row(target: str, value: str, ratio: float | None, goal: float, at_least: bool) -> str:
    """One table row: PASS where the ratio meets the goal, SHORT where it does not, 'not measured' without it."""
    if ratio is None:
        return f"| {target} | {value} | - | {'>=' if at_least else '<='} {goal} | not measured |"
    verdict = "PASS" if (ratio >= goal if at_least else ratio <= goal) else "SHORT"
    return f"| {target} | {value} | {ratio:.2f} | {'>=' if at_least else '<='} {goal} | {verdict} |"


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


def table(out: Path) -> str:
    compare = load_json(out / "compare.json")
    oop = perftest_us(out / "perftest-oop.txt")
    floor = load_json(out / "floor-1.json")
    lines = ["| target | numbers (us per call, this run) | ratio | goal | verdict |", "|---|---|---|---|---|"]
    for size in (16 * MIB, 64 * MIB):
        ours, theirs = path_us(compare, "auto", size), oop.get(size)
        lines.append(row(f"all_reduce {size // MIB} MiB at least 0.9x ucc_perftest out of place (speed)",
                         f"hpccomm auto {_us(ours)}, ucc_perftest {_us(theirs)}", ratio(theirs, ours), 0.9, True))
    gloo, ours = path_us(compare, "gloo", 64 * MIB), path_us(compare, "auto", 64 * MIB)
    lines.append(row("all_reduce 64 MiB at least 10x Gloo (speed)", f"hpccomm auto {_us(ours)}, Gloo {_us(gloo)}",
                     ratio(gloo, ours), 10.0, True))
    worst = None
    if compare and compare.get("rows") and all(r["auto_over_best"] is not None for r in compare["rows"]):
        worst = max(compare["rows"], key=lambda r: r["auto_over_best"])
    lines.append(row("auto within 1.1x of the fastest path at every size (time)",
                     f"worst at {worst['bytes']} B: auto {_us(worst['us']['auto'])}, {worst['best']} "
                     f"{_us(worst['us'][worst['best']])}" if worst else "-",
                     worst["auto_over_best"] if worst else None, 1.1, False))
    staged, bare = None, None
    if floor and floor.get("ranks") == 1:
        cases, mine = floor["cases"], floor["per_rank"][0]
        staged, bare = mine[cases.index("hpccomm all_reduce")], mine[cases.index("staged, set_stream, join")]
    lines.append(row("staged 4 B all_reduce at one rank within 1.5x of the staging floor (time)",
                     f"hpccomm {_us(staged)}, floor {_us(bare)}", ratio(staged, bare), 1.5, False))
    triggered = passed_twice(out, "test_cuda_tensors_on_two_ranks[ucc-triggered]")
    trig_us, gated_us = path_us(compare, "ucc-triggered", 64 * MIB), path_us(compare, "ucc", 64 * MIB)
    verdict = "not measured" if triggered is None else "PASS" if triggered else "SHORT"
    lines.append(f"| triggered posts pass tests/gpu twice | 64 MiB: triggered {_us(trig_us)}, host-gated "
                 f"{_us(gated_us)} | - | both passes | {verdict} |")
    if compare and compare.get("threshold") is not None:
        lines.append(f"\nMeasured crossover: HPCCOMM_CUDA_STAGED_MAX_BYTES={compare['threshold']} "
                     f"(default {compare.get('auto_staged_max_bytes')}); {compare.get('machine')}")
    return "\n".join(lines)


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
