"""The GPU acceptance run's targets table: PASS or SHORT per target, every ratio from that run's own numbers.

    python tests/gpu/targets.py OUT_DIR > OUT_DIR/targets.md

Reads what tests/gpu/acceptance.sh wrote into OUT_DIR: ``compare.json``
(benchmarks/cuda_allreduce.py --compare: five collectives on every hpccomm
path and Gloo, values checked), ``perftest-oop.txt`` (UCC's own
ucc_perftest all-reduce on CUDA memory, out of place; ``perftest-oop-nocache.txt``
the same with UCX's memory-type cache off, shown beside it), ``floor-1.json``
(benchmarks/cuda_staging_floor.py at one rank), ``pytest-1.txt`` and
``pytest-2.txt`` (``pytest -v tests/gpu``, twice, with their rank jobs' own
logs in ``ranks-1/`` and ``ranks-2/``) and any ``diag-*.txt`` (rank programs
run alone). A target whose numbers are missing (the part did not run, or
failed) says "not measured", never PASS; a wrong value is SHORT.

Then "What failed or hung": per test pass and pytest item, the checks the
rank programs reported (tests/ranks/rankcheck.py: ``FAIL rank=<r> <check>:
<detail>``, ``HUNG rank=<r> <check> after <s> s; top frame: <where>``),
tests/launch.py's ``still running at the <n> s limit`` and the acceptance
run's own limit on a whole part (for an item the pass was ended in, or whose
failure text pytest never printed, what its rank jobs' own logs say); the same
for each ``diag-*.txt``; every other
part that failed, hung or had no time left (``ucc_perftest``, the stages, the
floors, the traces: any log with the run's ``acceptance: exit status`` note; and
each step of the set-up in ``set-up.txt``, the probes and the UCX wheel's
unzip, one past its limit with its stacks); and
the benchmark's jobs that failed or gave wrong values. A part that ended badly
without a rank naming a check is named by the error its output gives, or by the
top frame of its main thread's stack (tests/ended.py; where no process printed
a Python stack, as ucc_perftest's ranks, the top C frames gdb read). Runs
anywhere (no torch): without a GPU run every target says "not measured".
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for ended.py (this file runs as a script)
from ended import error_that_ended, native_top, one_line, printed_a_python_stack, stack_top  # noqa: E402

MIB = 1 << 20
#: The benchmark's collectives (benchmarks/cuda_allreduce.py OPS; tests/test_gpu_targets.py keeps them equal).
OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "all_to_all_single")
#: The CUDA paths tests/gpu must pass on, twice.
TESTED_PATHS = ("staged", "ucc", "ucc-triggered")
#: A ucc_perftest result line: count, size (bytes), then avg, min and max time (us).
PERFTEST_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
#: pytest -v: an item as it starts (its id, then, once it ends, its outcome on the same line).
ITEM_LINE = re.compile(r"^(\S+::\S+)(?:\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b)?")
#: pytest's short summary: ``FAILED tests/...::name[param] - message``.
SUMMARY_LINE = re.compile(r"^(FAILED|ERROR) (\S+::\S+)")
#: A failure's header in pytest's report: ``____ test_name[param] ____`` (or ``ERROR at setup of ...``).
HEADER_LINE = re.compile(r"^_{3,} (.+?) _{3,}$")
#: Ends the failure text: pytest's ``=== short test summary info ===`` and the like.
RULE_LINE = re.compile(r"^={3,}")
#: The rank programs' markers (tests/ranks/rankcheck.py), anywhere in a line (pytest prefixes them with ``E``;
#: in a repr they follow an escaped newline).
FAIL_MARK = re.compile(r"(?:(?<![A-Za-z_])|(?<=\\n))FAIL rank=(\d+) (\S+?): (.*)")
HUNG_MARK = re.compile(r"(?:(?<![A-Za-z_])|(?<=\\n))HUNG rank=(\d+) (\S+) after ([\d.]+) s; top frame: (.*)")
#: tests/launch.py's note on a job past its limit, and acceptance.sh's on a part past its own.
LIMIT_NOTE = re.compile(r"still running at the (\d+) s limit")
PART_LIMIT_NOTE = re.compile(r"acceptance: HUNG: still running at its (\d+) s limit")
#: limits.sh's bounded, refusing a step (a part, a set-up step) that the budget left no time for.
PART_SKIPPED = re.compile(r"^acceptance: out of time \(budget \S+ s\), not started: ", re.MULTILINE)
#: limits.sh's within, in the log of a part whose limit the budget cut: ended at that limit, it is not known to hang.
PART_CUT = re.compile(r"^acceptance: its limit cut by the budget from (\d+) s$", re.MULTILINE)
#: acceptance.sh's trap, in the log of the part under way when the run got SIGTERM (the device tool's limit).
RUN_ENDED = re.compile(r"^acceptance: ended by SIGTERM, the run with it", re.MULTILINE)
#: acceptance.sh's last line in every part's log (in set-up.txt, in a step's that did not exit 0).
EXIT_NOTE = re.compile(r"acceptance: exit status (\d+) after")
#: The set-up's Python steps' log, and the line that starts each step's part of it (limits.sh's setup_step).
SETUP_LOG = "set-up.txt"
SETUP_STEP = re.compile(r"^acceptance: set-up: (.*)(?:\n|\Z)", re.MULTILINE)
#: tests/launch.py's first line of a rank job's own log (ranks-1/, ranks-2/: RANK_JOB_LOGS): the pytest item.
JOB_HEADER = re.compile(r"^rank job of (\S+) \(")
#: What may precede a marker that starts its line: pytest's ``E``, a launcher's tag, spaces.
LINE_START = re.compile(r"(E\b)?\s*(\[[^\]]*\]<\w+>:)?\s*")


def load_json(path: Path) -> Any:
    """The file's JSON, or None where it is missing or not JSON."""
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


def number(value: Any) -> bool:
    """Whether a benchmark cell is a time (not ``"wrong"``, ``"error"`` or missing)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def op_rows(compare: Any, op: str) -> list[dict]:
    """One op's summary rows (a compare.json from before ``ops`` has all_reduce's alone, at the top)."""
    if not compare:
        return []
    if "ops" in compare:
        return compare["ops"].get(op, {}).get("rows", [])
    return compare.get("rows", []) if op == "all_reduce" else []


def path_us(compare: Any, op: str, path: str, size: int) -> Any:
    """One path's cell (us, ``"wrong"`` or ``"error"``) at ``size``; ``gloo`` for Gloo's; None if not measured."""
    for row in op_rows(compare, op):
        if row["bytes"] == size:
            return row.get("gloo") if path == "gloo" else row["us"].get(path)
    return None


def ratio(numerator: Any, denominator: Any) -> float | None:
    """numerator / denominator where both are times."""
    return numerator / denominator if number(numerator) and number(denominator) and denominator else None


def judge(value: float | None, goal: float, at_least: bool, wrong: bool = False) -> str:
    """PASS where the ratio meets the goal, SHORT where it does not or a value was wrong, else 'not measured'."""
    if wrong:
        return "SHORT"
    if value is None:
        return "not measured"
    return "PASS" if (value >= goal if at_least else value <= goal) else "SHORT"


def row(target: str, numbers: str, value: float | None, goal: str, verdict: str) -> str:
    """One table row."""
    return f"| {target} | {numbers} | {'-' if value is None else f'{value:.2f}'} | {goal} | {verdict} |"


def _us(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}" if number(value) else str(value)


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", MIB), ("KiB", 1024)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


# ---------------------------------------------------------------------------------------------- pytest logs

class Log:
    """What one log says: pytest items' outcomes, the failure text per item, and the part's fate.

    (A plain class: a dataclass needs its module in sys.modules, which not every loader of a file by its path sets.)
    """

    def __init__(self, name: str, skipped: bool) -> None:
        self.name = name
        self.skipped = skipped  # the acceptance run had no time left for it
        self.outcomes: dict[str, str] = {}  # item id -> PASSED, FAILED, ... or "unfinished"
        self.sections: dict[str, list[str]] = {}  # item id (or header) -> its failure text
        self.loose: list[str] = []  # lines outside any failure text (a diag log: all of it)
        self.part_limit: str | None = None  # the acceptance run ended the part at this many seconds
        self.cut_from: str | None = None  # the part's own limit, where the budget cut it (to part_limit, if ended)
        self.ended_early: str | None = None  # how it was ended before its own limit, where it was: no hang
        self.exit_status: int | None = None  # the part's, as the acceptance run noted it
        self.text = ""


def read_text(path: Path, nul: str = "") -> str | None:
    """A log's text, each NUL byte (Open MPI 5's prterun ends a notice with one) replaced by ``nul``; None if it
    is missing."""
    try:
        return path.read_text(errors="replace").replace("\0", nul)
    except OSError:
        return None


def read_log(path: Path) -> Log | None:
    """Parse one log (pytest -v or a rank program's); None if it is missing."""
    text = read_text(path)
    return None if text is None else parse_log(path.name, text)


def parse_log(name: str, text: str) -> Log:
    """Parse one log's text (pytest -v or a rank program's, or a set-up step's), ``name`` naming it."""
    log = Log(name, bool(PART_SKIPPED.search(text)))
    log.text = text
    if cut := PART_CUT.search(text):
        log.cut_from = cut[1]
    started: list[str] = []
    section: list[str] | None = None
    for line in text.splitlines():
        if note := PART_LIMIT_NOTE.search(line):
            log.part_limit = note[1]
        if note := EXIT_NOTE.search(line):
            log.exit_status = int(note[1])
        if header := HEADER_LINE.match(line):
            name = re.sub(r"^ERROR at \w+ of ", "", header[1])
            section = log.sections.setdefault(name, [])
            continue
        if RULE_LINE.match(line):
            section = None
        elif section is not None:
            section.append(line)
            continue
        if summary := SUMMARY_LINE.match(line):
            log.outcomes[summary[2]] = summary[1]
        elif item := ITEM_LINE.match(line):
            if item[2]:
                log.outcomes.setdefault(item[1], item[2])
            else:
                started.append(item[1])
        else:
            log.loose.append(line)
    if RUN_ENDED.search(text):
        log.ended_early = "ended with the run (SIGTERM: the device tool's limit)"
    elif log.part_limit and log.cut_from:
        log.ended_early = f"ended at the {log.part_limit} s the budget left it, its own limit {log.cut_from} s"
    for item in started:  # pytest -v names an item as it starts: one never given an outcome did not end
        log.outcomes.setdefault(item, "unfinished")
    # Failure headers name the test without its file: give each section its item's full id.
    for name in list(log.sections):
        full = next((item for item in log.outcomes if item.endswith("::" + name.replace(".", "::"))), None)
        if full:
            log.sections[full] = log.sections.pop(name)
    return log


def _clean(text: str) -> str:
    """A marker's tail as one line: cut where a repr's escaped newline starts (then ended.one_line)."""
    return one_line(text.split("\\n")[0].rstrip("'\" "))


def markers(lines: list[str]) -> list[str]:
    """The FAIL, HUNG and time-limit lines among ``lines``, once each, in order.

    pytest may quote a rank's output twice: in its ``E`` lines and inside a shortened repr (a traceback's
    ``run = RankRun(output='...')``); a marker that starts its line (after ``E`` or a launcher's
    ``[1,0]<stdout>:``) is the one kept.
    """
    found: dict[tuple, tuple[int, str]] = {}
    for line in lines:
        if hung := HUNG_MARK.search(line):
            key, match = ("HUNG", hung[1], hung[2]), hung
            text = f"HUNG rank={hung[1]} {hung[2]} after {hung[3]} s; top frame: {_clean(hung[4])}"
        elif fail := FAIL_MARK.search(line):
            key, match = ("FAIL", fail[1], fail[2]), fail
            text = f"FAIL rank={fail[1]} {fail[2]}: {_clean(fail[3])}"
        elif limit := LIMIT_NOTE.search(line):
            key, match = ("limit",), limit
            text = f"the ranks were still running at the {limit[1]} s limit (killed)"
        else:
            continue
        quoted = 0 if LINE_START.fullmatch(line[:match.start()]) else 1
        if key not in found or quoted < found[key][0]:
            found[key] = (quoted, text)  # dicts keep the first-seen order of their keys
    return [text for _, text in found.values()]


def first_error(lines: list[str]) -> str | None:
    """pytest's first ``E`` line in a failure text: what failed where no rank said."""
    return next((_clean(line[1:].strip()) for line in lines if line.startswith("E ") and line[1:].strip()), None)


def param(item: str) -> str | None:
    """The parameter id of ``test_x[param]``."""
    match = re.search(r"\[([^\]]*)\]$", item)
    return match[1] if match else None


def pass_on_path(log: Log | None, path: str) -> tuple[str, str]:
    """One tests/gpu pass on one path: ("passed" | "failed" | "not run", what it counted)."""
    if log is None or log.skipped:
        return "not run", "no log (did not run)"
    outcomes = [outcome for item, outcome in log.outcomes.items() if param(item) == path]
    if not outcomes:
        return "not run", ("ended before it ran" if log.part_limit or log.ended_early else "no test ran")
    counts = {word: outcomes.count(word) for word in ("PASSED", "XFAIL", "FAILED", "ERROR", "unfinished", "SKIPPED")}
    said = ", ".join(f"{n} {word.lower()}" for word, n in counts.items() if n)
    if counts["FAILED"] or counts["ERROR"]:
        return "failed", said
    if counts["unfinished"]:
        # Ended where the budget ran out or with the run, not at its own limit: not a hang.
        return ("not run", f"{said} ({log.ended_early})") if log.ended_early else ("failed", said)
    if counts["SKIPPED"]:
        return "not run", said
    return "passed", said


def tested_row(out: Path, path: str) -> str:
    """tests/gpu passes twice on ``path``: PASS if both passes passed every item, SHORT if anything failed."""
    states, said = [], []
    for n in (1, 2):
        state, counted = pass_on_path(read_log(out / f"pytest-{n}.txt"), path)
        states.append(state)
        said.append(f"pass {n}: {counted}")
    verdict = "SHORT" if "failed" in states else "PASS" if states == ["passed", "passed"] else "not measured"
    return row(f"tests/gpu passes twice on {path}", "; ".join(said), None, "both passes", verdict)


# ---------------------------------------------------------------------------------------------- the targets

def perftest_row(compare: Any, oop: dict[int, float], size: int, uncached: dict[int, float] | None = None) -> str:
    """The ucc path's all_reduce against ucc_perftest out of place: speed (their time / ours) at least 0.9.

    ``uncached``: ucc_perftest with UCX's memory-type cache off, as hpccomm runs
    UCX on CUDA memory, shown beside it where it ran (the target is UCC's default).
    """
    ours, theirs = path_us(compare, "all_reduce", "ucc", size), oop.get(size)
    value = ratio(theirs, ours)
    numbers = f"hpccomm ucc {_us(ours)}, ucc_perftest {_us(theirs)}"
    if (uncached or {}).get(size) is not None:
        alike = ratio(uncached[size], ours)
        numbers += (f"; ucc_perftest with UCX's memory-type cache off, as hpccomm runs UCX: {_us(uncached[size])}"
                    + (f" ({alike:.2f}x)" if alike is not None else ""))
    return row(f"UCC path all_reduce {size // MIB} MiB at least 0.9x ucc_perftest out of place (speed)",
               numbers, value, ">= 0.9", judge(value, 0.9, True, wrong=ours in ("wrong", "error")))


def auto_row(compare: Any, op: str) -> str:
    """auto against the fastest other path at every size of ``op``: at most 1.1x; the worst size named."""
    per_size, bad, missing = [], [], []
    for entry in op_rows(compare, op):
        auto, best = entry["us"].get("auto"), entry.get("best")
        if auto in ("wrong", "error"):
            bad.append(f"auto {auto} at {_size(entry['bytes'])}")
        elif number(auto) and best and number(entry["us"].get(best)):
            per_size.append((auto / entry["us"][best], entry, best))
        else:
            missing.append(_size(entry["bytes"]))
    worst = max(per_size, key=lambda item: item[0]) if per_size else None
    numbers = "; ".join(bad)
    if worst:
        value, entry, best = worst
        numbers = "; ".join(filter(None, [numbers, (
            f"worst at {_size(entry['bytes'])}: auto {_us(entry['us']['auto'])}, {best} {_us(entry['us'][best])}; "
            "per size " + ", ".join(f"{_size(e['bytes'])} {r:.2f}" for r, e, _ in per_size))]))
    if missing:
        numbers = "; ".join(filter(None, [numbers, f"no auto or no other path at {', '.join(missing)}"]))
    value = worst[0] if worst else None
    verdict = judge(value, 1.1, False, wrong=bool(bad))
    if verdict == "PASS" and missing:
        verdict = "not measured"  # every size or none: a size auto never reached may be where it falls short
    return row(f"auto within 1.1x of the fastest path at every size: {op} (time)", numbers or "-", value, "<= 1.1",
               verdict)


def gloo_row(compare: Any) -> str:
    """The ucc path's 64 MiB all_reduce (UCC serves it there) at least 10x faster than Gloo's."""
    ours, gloo = path_us(compare, "all_reduce", "ucc", 64 * MIB), path_us(compare, "all_reduce", "gloo", 64 * MIB)
    limit = (compare or {}).get("auto_staged_max_bytes")
    auto = path_us(compare, "all_reduce", "auto", 64 * MIB)
    served = (f"; auto {_us(auto)} (its route at 64 MiB: {'staged' if 64 * MIB <= limit else 'UCC'}, staged up to "
              f"{limit} B)" if number(limit) else f"; auto {_us(auto)}")
    value = ratio(gloo, ours)
    return row("all_reduce 64 MiB at least 10x Gloo where UCC serves it (speed)",
               f"ucc path (UCC serves it) {_us(ours)}, Gloo {_us(gloo)}{served}", value, ">= 10",
               judge(value, 10.0, True, wrong=ours in ("wrong", "error")))


def floor_row(floor: Any) -> str:
    """The staged path's 4 B all_reduce at one rank within 1.5x of the bare staging round trip."""
    staged, bare = None, None
    if floor and floor.get("ranks") == 1:
        cases, mine = floor["cases"], floor["per_rank"][0]
        staged, bare = mine[cases.index("hpccomm all_reduce")], mine[cases.index("staged, set_stream, join")]
    value = ratio(staged, bare)
    return row("staged 4 B all_reduce at one rank within 1.5x of the staging floor (time)",
               f"hpccomm {_us(staged)}, floor {_us(bare)}", value, "<= 1.5", judge(value, 1.5, False))


def table(out: Path) -> str:
    """The targets table, the measured crossovers and what failed or hung, as Markdown."""
    compare = load_json(out / "compare.json")
    oop = perftest_us(out / "perftest-oop.txt")
    lines = ["| target | numbers (us per call, this run) | ratio | goal | verdict |", "|---|---|---|---|---|"]
    lines += [tested_row(out, path) for path in TESTED_PATHS]
    uncached = perftest_us(out / "perftest-oop-nocache.txt")
    lines += [perftest_row(compare, oop, size, uncached) for size in (16 * MIB, 64 * MIB)]
    lines += [auto_row(compare, op) for op in OPS]
    lines.append(gloo_row(compare))
    lines.append(floor_row(load_json(out / "floor-1.json")))
    if compare and compare.get("threshold") is not None:
        lines.append(f"\nMeasured crossover: HPCCOMM_CUDA_STAGED_MAX_BYTES={compare['threshold']} "
                     f"(default {compare.get('auto_staged_max_bytes')}); {compare.get('machine')}")
        others = {op: entry.get("threshold") for op, entry in compare.get("ops", {}).items() if op != "all_reduce"}
        if others:
            lines.append("Staged beat UCC up to (bytes): " + ", ".join(f"{op} {limit}" for op, limit in others.items()))
    if (out / "mps-compare.json").exists() or (out / "mps-perftest-oop.txt").exists():
        lines.append("Every number above ran with MPS off; the same measured with MPS on is in report.md.")
    lines += ["", "## What failed or hung", "", *failures(out)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- what failed

def job_logs(folder: Path) -> dict[str, list[str]]:
    """A test pass's rank jobs' own logs (``ranks-N/``: tests/launch.py's RANK_JOB_LOGS, written as the ranks
    wrote), by the pytest item that ran each: every job's output, in the order run. Empty where there are none."""
    jobs: dict[str, list[str]] = {}
    for path in sorted(folder.glob("*.log")):
        header, _, body = (read_text(path) or "").partition("\n")
        if item := JOB_HEADER.match(header):
            jobs.setdefault(item[1], []).append(body)
    return jobs


def job_findings(outputs: list[str]) -> list[str]:
    """What an item's rank jobs' own logs say of it: their checks' markers; where they name none, the top frame
    of a stack a rank printed (its limit's SIGUSR1)."""
    found = [marker for output in outputs for marker in markers(output.splitlines())]
    if not found:
        found = [f"a rank's stack, top frame: {top}" for output in outputs if (top := stack_top(output))][:1]
    return [f"{marker} (its rank job's log)" for marker in dict.fromkeys(found)]


def log_failures(log: Log, jobs: dict[str, list[str]] | None = None) -> list[str]:
    """One log's failed or hung items and checks as nested Markdown bullets; empty if nothing failed or hung.

    ``jobs``: the pass's rank jobs' own logs (:func:`job_logs`), read for an item the pass was ended in, or
    whose failure text pytest never printed (ended before its report).
    """
    jobs = jobs or {}
    lines = []
    for item, outcome in log.outcomes.items():
        if outcome not in ("FAILED", "ERROR", "unfinished"):
            continue
        if outcome == "unfinished":
            ended = log.ended_early or "ended" + (f" at its {log.part_limit} s limit" if log.part_limit else "")
            lines.append(f"  - {item}: never finished (the pass was {ended} while it ran)")
            lines += [f"    - {finding}" for finding in job_findings(jobs.get(item, []))]
            continue
        text = log.sections.get(item, [])
        lines.append(f"  - {item}: {outcome}")
        found = markers(text) or job_findings(jobs.get(item, []))
        if not found:
            found = [f"no rank named a check; pytest: {first_error(text) or 'no failure text in the log'}"]
        lines += [f"    - {marker}" for marker in found]
    listed = {item for item, outcome in log.outcomes.items() if outcome in ("FAILED", "ERROR")}
    for name, text in log.sections.items():  # a failure text whose item the log never named
        if name not in listed and (found := markers(text)):
            lines.append(f"  - {name}")
            lines += [f"    - {marker}" for marker in found]
    loose = markers(log.loose)
    if loose:
        lines.append("  - outside any test's failure text:" if log.outcomes else "  - the rank program:")
        lines += [f"    - {marker}" for marker in loose]
    ended = (log.part_limit or log.ended_early) and not any("never finished" in line for line in lines)
    if (ended or not lines) and (fate := ended_badly(log)):
        lines.append(f"  - {fate}")
    return lines


def ended_badly(log: Log, what: str = "the part") -> str | None:
    """How a part (or ``what``) ended, where it ended badly: before its limit (where the budget ran out, or with the
    run), past its limit (with the top frame of its main
    thread's Python stack; where no Python stack was printed, the top C frames of a process's main thread), or
    with a non-zero exit status (with the error its output names); None where it exited 0."""
    if log.ended_early:
        return f"{what} was {log.ended_early}"
    if log.part_limit:
        fate = f"{what} was ended at its {log.part_limit} s limit"
        if top := stack_top(log.text):
            return f"{fate}; top frame: {top}"
        if printed_a_python_stack(log.text):  # interleaved dumps: no frame, rather than a wrong one
            return fate
        return fate + (f"; top C frames, {native}" if (native := native_top(log.text)) else "")
    if log.exit_status:
        return f"exit status {log.exit_status}: {error_that_ended(log.text) or 'its output names no error'}"
    return None


def setup_steps(text: str) -> list[tuple[str, Log]]:
    """set-up.txt by step: each step's command (``python3 -c ...``; "" for lines before the first step's) and
    its part of the log, parsed."""
    pieces = SETUP_STEP.split(text)  # what came before any step's line, then each step's command and its lines
    steps = [("", pieces[0])] if pieces[0].strip() else []
    steps += zip(pieces[1::2], pieces[2::2])
    return [(command, parse_log(SETUP_LOG, lines)) for command, lines in steps]


def setup_failures(path: Path) -> list[str]:
    """Every step of the set-up in set-up.txt (the probes, the UCX wheel's unzip) that was ended past its limit,
    exited non-zero or had no time left, each named by its command: where torch's CUDA set-up hangs, every probe
    that loads torch does."""
    lines = []
    for command, log in setup_steps(read_text(path, nul="\n") or ""):  # a NUL ends a line: a step's may follow
        name = command if len(command) <= 100 else command[:97] + "..."
        where = f"`{name.replace('`', chr(39))}`" if command else "before its first step"
        if log.skipped:  # before its exit status: a step given no time "exits" 124 too
            lines.append(f"- {SETUP_LOG}, {where}: did not run (no time left)")
        elif fate := ended_badly(log, "the step"):
            lines.append(f"- {SETUP_LOG}, {where}: {fate}")
    return lines


def other_parts(out: Path) -> list[str]:
    """Every other part (a log with the run's exit note: ucc_perftest, the stages, the floors, the traces, MPS;
    and each step in set-up.txt) that was ended past its limit, exited non-zero or had no time left (in that
    order: a part past its limit can spend the budget that a later one then lacks)."""
    lines = []
    for path in sorted(out.glob("*")):
        if path.suffix not in (".txt", ".md", ".log") or path.name.startswith(("pytest-", "diag-")):
            continue
        if path.name == SETUP_LOG:
            lines += setup_failures(path)
            continue
        log = read_log(path)
        if log is None:
            continue
        if log.skipped:
            lines.append(f"- {path.name}: did not run (no time left)")
        elif fate := ended_badly(log):
            lines.append(f"- {path.name}: {fate}")
    return lines


def benchmark_failures(compare: Any) -> list[str]:
    """The benchmark's jobs that failed or hung (and where), and its cells with wrong values or errors."""
    if not compare:
        return ["- benchmark (compare.json): no results (did not run, or ended before its first job)"]
    lines = [f"- benchmark, {path} path: {one_line(why)}" for path, why in compare.get("failed", {}).items()]
    for op in OPS:
        bad: dict[str, list[str]] = {}
        for entry in op_rows(compare, op):
            for path, value in [*entry["us"].items(), ("gloo", entry.get("gloo"))]:
                if value in ("wrong", "error"):
                    bad.setdefault(f"{path} {value}", []).append(_size(entry["bytes"]))
        lines += [f"- benchmark, {op}: {what} at {', '.join(sizes)}" for what, sizes in bad.items()]
    return lines


def failures(out: Path) -> list[str]:
    """The "What failed or hung" section: each tests/gpu pass, each diag-*.txt, every other part that ended
    badly, the benchmark."""
    lines = []
    logs = [(out / f"pytest-{n}.txt", f"pass {n}", "no log (did not run)") for n in (1, 2)]
    logs += [(path, path.name, "did not run") for path in sorted(out.glob("diag-*.txt"))]
    for path, what, missing in logs:
        log = read_log(path)
        if log is None or log.skipped:
            lines.append(f"- {what}: {missing if log is None else 'did not run (no time left)'}")
            continue
        jobs = job_logs(out / f"ranks-{what.split()[1]}") if what.startswith("pass") else None
        found = log_failures(log, jobs)
        where = f" ({log.name})" if what.startswith("pass") else ""
        lines.append(f"- {what}{where}: " + ("" if found else "nothing failed or hung"))
        lines += found
    lines += other_parts(out)
    lines += benchmark_failures(load_json(out / "compare.json"))
    return [line.rstrip() for line in lines]


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
