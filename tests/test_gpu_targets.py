"""The GPU acceptance run's reading of its own numbers, on the CPU: benchmarks/cuda_allreduce.py's summary and
checks, and tests/gpu/targets.py's verdicts and its "What failed or hung" section.

No GPU runs here: the benchmark's compare.json is built by its own summary functions from invented timings
(so the JSON targets.py reads cannot drift from the JSON the benchmark writes), the ucc_perftest and pytest
logs are written in those programs' formats, and each test makes a verdict go one known way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch import JOB_HEADER
from scripts import REPO, load_script

MIB = 1 << 20
SIZES = [4, 65536, MIB, 2 * MIB, 4 * MIB, 16 * MIB, 64 * MIB]
ITEM = "tests/gpu/test_cuda.py::test_cuda_tensors_on_two_ranks[{}]"
INFO = "tests/gpu/test_cuda.py::test_info_names_the_route_for_cuda_tensors[{}]"


bench = load_script(REPO / "benchmarks" / "cuda_allreduce.py")
targets = load_script(REPO / "tests" / "gpu" / "targets.py")


# Invented timings (us per call) by message bytes: staged wins small, UCC large, Gloo far behind at 64 MiB.
def staged_us(b: int) -> float:
    return 300 + b / MIB * 200  # beats UCC up to 2 MiB


def ucc_us(b: int) -> float:
    return 700 + b / MIB * 2.2  # 735 us at 16 MiB, 841 at 64


def gloo_us(b: int) -> float:
    return 400 + b / MIB * 560  # 36,240 us at 64 MiB: 43x the ucc path


def timings(**overrides) -> dict[str, dict[str, dict[int, object]]]:
    """{path: {op: {bytes: cell}}}: auto takes the faster path everywhere; ``overrides`` replace (path, op)."""
    out: dict[str, dict[str, dict[int, object]]] = {}
    for path, fn in (("staged", staged_us), ("ucc", ucc_us), ("ucc-triggered", ucc_us),
                     ("auto", lambda b: min(staged_us(b), ucc_us(b))), ("gloo", gloo_us)):
        out[path] = {op: {bench.message_bytes(op, s, 2): fn(bench.message_bytes(op, s, 2)) for s in SIZES}
                     for op in bench.OPS}
    for key, cells in overrides.items():
        path, op = key.split("__")
        out[path.replace("_", "-")][op].update(cells)
    return out


def compare_json(times: dict, failed: dict[str, str] | None = None, partial: dict[str, int] | None = None) -> dict:
    """The summary the benchmark writes, from per-job records built by its own job_record (Gloo in staged's)."""
    results = {}
    for path in [p for p in times if p != "gloo"]:
        ops = {}
        for op, cells in times[path].items():
            rows = [{"bytes": b, "hpccomm": us, "iters": {"hpccomm": 2}} for b, us in cells.items()]
            if path == "staged":
                for row in rows:
                    row["gloo"] = times["gloo"][op][row["bytes"]]
            ops[op] = rows[:(partial or {}).get(path, len(rows))]
        meta = {"torch": "2.11", "ranks": 2, "gpu": "H100", "rounds": 3, "route": "ucc",
                "staged_max_bytes": 2 * MIB if path == "auto" else 0}
        results[path] = bench.job_record(meta, ops, complete=path not in (partial or {}))
    return bench.summarise(results, failed or {})


PERFTEST_HEAD = """Collective:             Allreduce
Memory type:            cuda
Datatype:               float32

       Count        Size                Time, us                           Bandwidth, GB/s
                                 avg         min         max         avg         max         min
"""


def write_run(out: Path, compare: dict | None = None, perftest: dict[int, float] | None = None,
              logs: dict[str, str] | None = None, floor: tuple[float, float] | None = (33.0, 45.0),
              uncached: dict[int, float] | None = None) -> None:
    """Write what tests/gpu/acceptance.sh leaves in its work directory."""
    if compare is not None:
        (out / "compare.json").write_text(json.dumps(compare))
    for name, times in (("perftest-oop.txt", perftest), ("perftest-oop-nocache.txt", uncached)):
        if times is not None:
            rows = [f"{b // 4:>12}{b:>12}{t:>12.2f}{t * 0.9:>12.2f}{t * 1.1:>12.2f}{1.0:>12.2f}{1.0:>12.2f}{1.0:>12.2f}"
                    for b, t in sorted(times.items())]
            (out / name).write_text(PERFTEST_HEAD + "\n".join(rows) + "\n")
    if floor is not None:
        (out / "floor-1.json").write_text(json.dumps({"ranks": 1, "bytes": 4, "per_rank": [list(floor)],
                                                      "cases": ["staged, set_stream, join", "hpccomm all_reduce"]}))
    for name, text in (logs or {}).items():
        (out / name).write_text(text)


def pytest_log(outcomes: dict[str, str], failures: dict[str, list[str]] | None = None, tail: str = "") -> str:
    """A ``pytest -v`` log: one line per item (an outcome of "" leaves it unfinished), the failure texts, summary."""
    lines = ["=" * 29 + " test session starts " + "=" * 30, "collecting ... collected 6 items", ""]
    for item, outcome in outcomes.items():
        pad = " " * max(1, 72 - len(item) - len(outcome))
        lines.append(f"{item} {outcome}{pad}[ 50%]" if outcome else f"{item} ")
    if failures:
        lines += ["", "=" * 35 + " FAILURES " + "=" * 35]
        for name, text in failures.items():
            lines += [f"{'_' * 20} {name} {'_' * 20}", "", "    def test_cuda_tensors_on_two_ranks(path):", *text,
                      "", "tests/launch.py:281: AssertionError"]
    failed = [item for item, outcome in outcomes.items() if outcome == "FAILED"]
    if failed or outcomes:
        lines.append("=" * 28 + " short test summary info " + "=" * 28)
        lines += [f"FAILED {item} - AssertionError: ranks failed (exit 1):" for item in failed]
    return "\n".join(lines) + "\n" + tail


def all_passed() -> str:
    return pytest_log({ITEM.format(p): "PASSED" for p in ("staged", "ucc", "ucc-triggered")}
                      | {INFO.format(p): "PASSED" for p in ("staged", "ucc", "ucc-triggered")}
                      | {ITEM.format("mpi"): "SKIPPED (HPCCOMM_GPU_PATHS does not list mpi)"})


def verdicts(out: str) -> dict[str, str]:
    """{target: verdict} from the table."""
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and "| target |" not in line]
    return {cells[0][2:]: cells[-1].rstrip(" |") for cells in rows}


def section(out: str) -> str:
    return out.split("## What failed or hung", 1)[1]


# ---------------------------------------------------------------------------------------------- the benchmark

def test_the_two_files_name_the_same_collectives():
    assert targets.OPS == bench.OPS


def test_message_bytes_split_evenly_over_the_ranks():
    assert bench.message_bytes("all_reduce", 4, 2) == 4
    assert bench.message_bytes("broadcast", 6, 2) == 8  # whole float32 elements
    assert bench.message_bytes("all_gather_into_tensor", 4, 2) == 8
    assert bench.message_bytes("all_to_all_single", 65536, 3) == 65544
    for op in bench.SPLIT_OPS:
        for size in SIZES:
            assert bench.message_bytes(op, size, 3) % 12 == 0 and bench.message_bytes(op, size, 3) >= size


def test_iterations_scale_down_with_size_and_a_job_stays_within_its_time():
    assert [bench.default_iters(s, 1e-5) for s in (64 * MIB, 16 * MIB, 4 * MIB)] == [2, 8, 32]
    assert bench.default_iters(4, 1e-5) == bench.MAX_ITERS
    assert bench.default_iters(4, 0.014) == 7  # a path with a flat 14 ms per call: capped by the round's time
    assert bench.default_iters(64 * MIB, 5.0) == 1

    def job_s(per_call_s, rounds: int = 3) -> float:
        # Per (op, size): a warm-up call, a calibration call, the rounds and the checked call; five ops.
        return 5 * sum(per_call_s(s) * (3 + rounds * bench.default_iters(s, per_call_s(s))) for s in SIZES)

    staged = job_s(lambda s: 3e-4 + s / MIB * 6e-4)  # 40 ms at 64 MiB on an H100 shared by two ranks
    gloo = job_s(lambda s: 4.5e-4 + s / MIB * 1.5e-3)  # up to 100 ms (Gloo's all_gather)
    flat = job_s(lambda s: 0.014)
    assert staged + gloo < 25 and flat < 15, (staged, gloo, flat)


try:
    import torch
except ImportError:  # the checks need torch; everything else here does not
    torch = None


def _emulate(op: str, cases: list, swap: bool = False) -> None:
    """Do on the CPU what ``op`` does across ranks, from each rank's checked input (``swap``: ranks mixed up)."""
    world = len(cases)
    for case in cases:
        case.fill()
    sources = [case.source.clone() for case in cases]
    if swap:
        sources.reverse()
    m = cases[0].nbytes // 4 // world
    for rank in range(world):
        whole = {"all_reduce": lambda: sum(sources), "broadcast": lambda: sources[0],
                 "all_gather_into_tensor": lambda: torch.cat(sources),
                 "reduce_scatter_tensor": lambda: sum(sources)[rank * m:(rank + 1) * m],
                 "all_to_all_single": lambda: torch.cat([s[rank * m:(rank + 1) * m] for s in sources])}[op]()
        # Mixed up: every rank's input taken in reverse order, and each result given to the mirror rank.
        cases[world - 1 - rank if swap else rank].result.copy_(whole)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("op", list(bench.OPS))
def test_the_check_accepts_what_each_op_gives_and_nothing_else(op, world):
    cases = [bench.Case(op, bench.message_bytes(op, 1000, world), rank, world, torch.device("cpu"))
             for rank in range(world)]
    _emulate(op, cases)
    assert [case.mismatch() for case in cases] == [None] * world
    cases[-1].result[-1] += 1
    assert "should be" in cases[-1].mismatch()
    if op != "all_reduce":  # a sum does not depend on the ranks' order
        _emulate(op, cases, swap=True)
        assert any(case.mismatch() for case in cases)


def test_a_wrong_cell_is_no_time_and_never_the_fastest():
    times = timings(ucc__all_gather_into_tensor={64 * MIB: "wrong"}, auto__broadcast={4: "error"})
    summary = compare_json(times)
    row = next(r for r in summary["ops"]["all_gather_into_tensor"]["rows"] if r["bytes"] == 64 * MIB)
    assert row["us"]["ucc"] == "wrong" and row["best"] == "ucc-triggered", row
    assert summary["ops"]["broadcast"]["rows"][0]["auto_over_best"] is None
    text = bench.report(summary)
    assert "| 67108864 | 13100.0 | wrong | 840.8 | 840.8 | 36240.0 | ucc-triggered | 1.00 |" in text, text
    for op in bench.OPS:
        assert f"# CUDA {op} per path: 2 ranks, H100" in text
    # all_reduce's rows and threshold stay at the top level, for readers of the older JSON.
    assert summary["rows"] == summary["ops"]["all_reduce"]["rows"] and summary["threshold"] == 2 * MIB
    assert set(summary) == {"paths", "failed", "rows", "threshold", "machine", "auto_staged_max_bytes", "ops"}


def test_a_job_killed_midway_keeps_its_cells_and_says_where_it_was():
    output = ("timing all_reduce 4 rank=0\ntiming all_reduce 4 rank=1\nchecking all_reduce 4 rank=0\n"
              "timing all_gather_into_tensor 16777216 rank=1\ntiming all_gather_into_tensor 16777216 rank=0\n"
              "still running at the 45 s limit:\n")
    assert bench.where(output) == "in all_gather_into_tensor 16777216"
    assert bench.where("timing broadcast 8 rank=0\nchecking broadcast 8 rank=1\n") == \
        "rank 0 in broadcast 8; rank 1 in broadcast 8 (checking values)"
    assert bench.where("MPI_Init failed\n") is None
    times = timings()
    summary = compare_json(times, failed={"auto": "over its 45 s limit in all_gather_into_tensor 16777216"},
                           partial={"auto": 3})
    rows = summary["ops"]["all_gather_into_tensor"]["rows"]
    assert [("auto" in r["us"]) for r in rows] == [True] * 3 + [False] * 4
    assert "auto: not (fully) measured: over its 45 s limit" in bench.report(summary)


# ---------------------------------------------------------------------------------------------- the targets

def test_a_run_that_meets_every_target_passes_every_row(tmp_path):
    write_run(tmp_path, compare_json(timings()), {16 * MIB: 707.0, 64 * MIB: 852.0},
              {"pytest-1.txt": all_passed(), "pytest-2.txt": all_passed()})
    out = targets.table(tmp_path)
    got = verdicts(out)
    assert len(got) == 12 and set(got.values()) == {"PASS"}, out
    assert "worst at" in got_row(out, "all_gather_into_tensor") and "per size 8 B 1.00" in out
    assert "Measured crossover: HPCCOMM_CUDA_STAGED_MAX_BYTES=2097152" in out
    failed = section(out)
    assert "- pass 1 (pytest-1.txt): nothing failed or hung" in failed
    assert "- pass 2 (pytest-2.txt): nothing failed or hung" in failed
    assert "benchmark" not in failed, failed


def got_row(out: str, fragment: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("| ") and fragment in line)


def test_without_a_gpu_run_every_row_says_not_measured(tmp_path):
    out = targets.table(tmp_path)
    assert set(verdicts(out).values()) == {"not measured"} and len(verdicts(out)) == 12, out
    assert "PASS" not in out and "SHORT" not in out
    failed = section(out)
    assert "- pass 1: no log (did not run)" in failed and "- pass 2: no log (did not run)" in failed
    assert "benchmark (compare.json): no results" in failed


def test_slow_paths_are_short_with_their_ratios(tmp_path):
    mib16 = 16 * MIB
    times = timings(auto__all_gather_into_tensor={mib16: ucc_us(mib16) * 1.3},
                    ucc__all_reduce={64 * MIB: 27300.0})
    write_run(tmp_path, compare_json(times), {mib16: 707.0, 64 * MIB: 852.0}, uncached={mib16: 1100.0})
    out = targets.table(tmp_path)
    got = verdicts(out)
    # 16 MiB: 707/735 = 0.96; 64 MiB: 852/27300 = 0.03; Gloo 36240/27300 = 1.3x; all_gather's auto 1.3x at 16 MiB.
    assert got["UCC path all_reduce 16 MiB at least 0.9x ucc_perftest out of place (speed)"] == "PASS", out
    # Beside it, perftest as hpccomm runs UCX (memory-type cache off): shown, not judged; none ran at 64 MiB.
    assert "cache off, as hpccomm runs UCX: 1100.0 (1.50x) | 0.96 |" in got_row(out, "16 MiB at least 0.9x"), out
    assert "cache off" not in got_row(out, "64 MiB at least 0.9x"), out
    assert got_row(out, "all_reduce 64 MiB at least 0.9x").endswith("| 0.03 | >= 0.9 | SHORT |"), out
    gloo = got_row(out, "10x Gloo")
    assert gloo.endswith("| 1.33 | >= 10 | SHORT |") and "ucc path (UCC serves it) 27300.0" in gloo, gloo
    assert "its route at 64 MiB: UCC, staged up to 2097152 B" in gloo, gloo
    gather = got_row(out, "every size: all_gather_into_tensor")
    assert gather.endswith("| 1.30 | <= 1.1 | SHORT |") and "worst at 16 MiB: auto 955.8, ucc 735.2" in gather, gather
    assert got["auto within 1.1x of the fastest path at every size: broadcast (time)"] == "PASS"
    # The tests/gpu rows: no logs.
    assert got["tests/gpu passes twice on ucc"] == "not measured"


def test_a_wrong_value_is_short_and_named(tmp_path):
    times = timings(ucc__all_reduce={64 * MIB: "wrong"}, auto__reduce_scatter_tensor={65536: "wrong"})
    write_run(tmp_path, compare_json(times), {16 * MIB: 707.0, 64 * MIB: 852.0})
    out = targets.table(tmp_path)
    assert got_row(out, "all_reduce 64 MiB at least 0.9x").endswith("| - | >= 0.9 | SHORT |"), out
    assert got_row(out, "10x Gloo").endswith("| SHORT |"), out
    assert "auto wrong at 64 KiB" in got_row(out, "every size: reduce_scatter_tensor")
    assert got_row(out, "every size: reduce_scatter_tensor").endswith("| SHORT |")
    failed = section(out)
    assert "- benchmark, all_reduce: ucc wrong at 64 MiB" in failed, failed
    assert "- benchmark, reduce_scatter_tensor: auto wrong at 64 KiB" in failed, failed


def test_a_path_whose_job_stopped_early_is_not_measured_where_it_had_no_numbers(tmp_path):
    failed = {"auto": "over its 45 s limit in all_gather_into_tensor 16777216"}
    write_run(tmp_path, compare_json(timings(), failed=failed, partial={"auto": 5}))
    out = targets.table(tmp_path)
    row = got_row(out, "every size: all_gather_into_tensor")
    assert row.endswith("| not measured |") and "no auto or no other path at 16 MiB, 64 MiB" in row, row
    assert "- benchmark, auto path: over its 45 s limit in all_gather_into_tensor 16777216" in section(out)


def test_tests_gpu_rows_and_what_failed_or_hung(tmp_path):
    long = "x" * 500
    ucc_failure = [
        # pytest lists a frame's arguments first, shortened: a quoted marker, kept only where nothing better says it.
        "run = RankRun(returncode=1, output='FAIL rank=0 in_place_reductions_are_freed: Assert...\\nOK rank=1', "
        "timed_out=False)",
        "E       AssertionError: ranks failed (exit 1):",
        "E         OK rank=1 checks=20",
        f"E         FAIL rank=0 in_place_reductions_are_freed: AssertionError: 16 MiB of scratch held {long}",
        "E         HUNG rank=1 a_missing_peer_times_out after 60 s; top frame: /w/hpccomm/ucc/request.py:46 in post",
        "E         FAILED rank=0 failures=1 of 20",
        "E       assert 1 == 0",
        "E        +  where 1 = RankRun(returncode=1, output='FAIL rank=0 in_place_reductions_are_freed: Assert...\\nOK"
        " rank=1').returncode",
    ]
    triggered_failure = ["E       AssertionError: ranks timed out:", "E         OK rank=0 checks=20",
                         "E         still running at the 180 s limit:", "E           pid 7 state S in futex_wait"]
    first = pytest_log({ITEM.format("staged"): "PASSED", ITEM.format("ucc"): "FAILED",
                        ITEM.format("ucc-triggered"): "FAILED", INFO.format("ucc"): "PASSED"},
                       {"test_cuda_tensors_on_two_ranks[ucc]": ucc_failure,
                        "test_cuda_tensors_on_two_ranks[ucc-triggered]": triggered_failure})
    # The second pass hung in ucc-triggered and was ended by the acceptance run (no outcome, no summary).
    second = (f"{ITEM.format('staged')} PASSED [ 12%]\n{ITEM.format('ucc')} PASSED [ 25%]\n"
              f"{ITEM.format('ucc-triggered')} acceptance: HUNG: still running at its 200 s limit (stacks above)\n"
              "acceptance: exit status 124 after 460 s\n")
    diag = ("OK rank=1 checks=1\nFAIL rank=0 the_compute_stream_runs: AssertionError: the host waited\n"
            "FAILED rank=0 failures=1 of 1\n")
    write_run(tmp_path, logs={"pytest-1.txt": first, "pytest-2.txt": second, "diag-stream.txt": diag,
                              "diag-nccl-alone.txt": "OK rank=0 checks=1\nOK rank=1 checks=1\n",
                              "diag-late.txt": "acceptance: out of time (budget 380 s), not started: hpccomm-run\n"
                                               "acceptance: exit status 124 after 380 s\n"})
    out = targets.table(tmp_path)
    got = verdicts(out)
    assert got["tests/gpu passes twice on staged"] == "PASS", out
    assert got["tests/gpu passes twice on ucc"] == "SHORT" and "pass 1: 1 passed, 1 failed; pass 2: 1 passed" in out
    assert got["tests/gpu passes twice on ucc-triggered"] == "SHORT" and "pass 2: 1 unfinished" in out
    failed = section(out)
    ucc = failed.index(f"  - {ITEM.format('ucc')}: FAILED")
    assert failed.index("    - FAIL rank=0 in_place_reductions_are_freed: AssertionError: 16 MiB") > ucc
    assert "Assert...'" not in failed and long not in failed  # the repr's copy left out, the detail cut
    fail_line = next(line for line in failed.splitlines() if "FAIL rank=0 in_place" in line)
    assert len(fail_line) < 260 and fail_line.endswith("..."), fail_line  # the detail: 200 characters
    assert "    - HUNG rank=1 a_missing_peer_times_out after 60 s; top frame: /w/hpccomm/ucc/request.py:46 in post" \
        in failed
    assert f"  - {ITEM.format('ucc-triggered')}: FAILED\n    - the ranks were still running at the 180 s limit" \
        in failed
    assert f"- pass 2 (pytest-2.txt):\n  - {ITEM.format('ucc-triggered')}: never finished (the pass was ended at " \
           "its 200 s limit while it ran)" in failed, failed
    assert "- diag-stream.txt:\n  - the rank program:\n    - FAIL rank=0 the_compute_stream_runs: AssertionError: " \
           "the host waited" in failed, failed
    assert "- diag-nccl-alone.txt: nothing failed or hung" in failed
    assert "- diag-late.txt: did not run (no time left)" in failed
    assert f"{ITEM.format('staged')}:" not in failed


def test_a_pass_ended_before_pytests_report_is_read_from_its_rank_jobs_own_logs(tmp_path):
    # The acceptance run ended pass 1 at its limit in ucc-triggered: pytest never printed its report, so the
    # failed ucc item has no failure text, and what the ranks wrote was in pytest's memory. Their jobs' own logs
    # (tests/launch.py, RANK_JOB_LOGS) have it: a check that failed, and the hung job's SIGUSR1 stacks.
    first = (f"{ITEM.format('staged')} PASSED [ 12%]\n{ITEM.format('ucc')} FAILED [ 25%]\n"
             f"{ITEM.format('ucc-triggered')} acceptance: HUNG: still running at its 200 s limit (stacks above)\n"
             "acceptance: exit status 124 after 200 s\n")
    jobs = tmp_path / "ranks-1"
    jobs.mkdir()
    command = "(hpccomm-run -n 2 python tests/gpu/ranks/cuda_ops.py)"
    (jobs / "001-cuda_ops.log").write_text(f"{JOB_HEADER}{ITEM.format('staged')} {command}\nOK rank=0 checks=20\n")
    (jobs / "002-cuda_ops.log").write_text(
        f"{JOB_HEADER}{ITEM.format('ucc')} {command}\nOK rank=1 checks=20\n"
        "FAIL rank=0 results_land_before_a_kernel: AssertionError: the copy back waited\n")
    (jobs / "003-cuda_ops.log").write_text(
        f"{JOB_HEADER}{ITEM.format('ucc-triggered')} {command}\n"
        "Current thread 0x00007f (most recent call first):\n"
        '  File "/w/hpccomm/ucc/request.py", line 46 in post\n'
        '  File "/w/tests/gpu/ranks/cuda_ops.py", line 57 in all_reduce_sizes_from_empty_to_64_mib\n')
    write_run(tmp_path, logs={"pytest-1.txt": first})
    failed = section(targets.table(tmp_path))
    assert (f"  - {ITEM.format('ucc')}: FAILED\n    - FAIL rank=0 results_land_before_a_kernel: AssertionError: "
            "the copy back waited (its rank job's log)") in failed, failed
    assert (f"  - {ITEM.format('ucc-triggered')}: never finished (the pass was ended at its 200 s limit while it "
            "ran)\n    - a rank's stack, top frame: /w/hpccomm/ucc/request.py:46 in post (its rank job's log)") \
        in failed, failed
    assert f"{ITEM.format('staged')}:" not in failed


def test_a_part_ended_where_the_budget_ran_out_is_not_measured_rather_than_hung(tmp_path):
    # limits.sh's within notes a limit the budget cut: a pass ended there is not known to hang, and until 2026-12-06
    # its unfinished item read as a failure (SHORT) whenever the budget ran out during the second pass.
    second = (f"{ITEM.format('staged')} PASSED [ 12%]\n{ITEM.format('ucc')} PASSED [ 25%]\n"
              f"{ITEM.format('ucc-triggered')} acceptance: HUNG: still running at its 41 s limit (stacks above)\n"
              "acceptance: its limit cut by the budget from 200 s\nacceptance: exit status 124 after 350 s\n")
    # A part the budget cut that ended within it is judged as any other; one ended at the cut limit says so.
    floor = ("rank 0: RuntimeError: no CUDA\nacceptance: its limit cut by the budget from 30 s\n"
             "acceptance: exit status 1 after 352 s\n")
    trace = ("acceptance: HUNG: still running at its 12 s limit (stacks above, where the program prints them)\n"
             "acceptance: its limit cut by the budget from 30 s\nacceptance: exit status 124 after 380 s\n")
    write_run(tmp_path, logs={"pytest-1.txt": all_passed(), "pytest-2.txt": second, "floor-2.md": floor,
                              "ucc-trace.txt": trace})
    out = targets.table(tmp_path)
    got = verdicts(out)
    assert got["tests/gpu passes twice on staged"] == "PASS", out
    assert got["tests/gpu passes twice on ucc-triggered"] == "not measured", out
    assert "pass 2: 1 unfinished (ended at the 41 s the budget left it, its own limit 200 s)" in out, out
    failed = section(out)
    assert (f"  - {ITEM.format('ucc-triggered')}: never finished (the pass was ended at the 41 s the budget left "
            "it, its own limit 200 s while it ran)") in failed, failed
    assert "- floor-2.md: exit status 1: rank 0: RuntimeError: no CUDA" in failed, failed
    assert "- ucc-trace.txt: the part was ended at the 12 s the budget left it, its own limit 30 s" in failed, failed
    # A failed item fails the pass whatever the budget did.
    second = second.replace(f"{ITEM.format('ucc')} PASSED", f"{ITEM.format('ucc')} FAILED")
    write_run(tmp_path, logs={"pytest-2.txt": second})
    assert verdicts(targets.table(tmp_path))["tests/gpu passes twice on ucc"] == "SHORT"


def test_a_marker_only_quoted_in_a_repr_is_cut_at_its_escaped_newline():
    lines = ["E        +  where 3 = RankRun(returncode=3, output='OK rank=1 checks=2\\nHUNG rank=0 waits after 5 s; "
             "top frame: /w/ranks/x.py:9 in waits\\nThread 0x1 (most recent call first):\\n').returncode"]
    assert targets.markers(lines) == ["HUNG rank=0 waits after 5 s; top frame: /w/ranks/x.py:9 in waits"]


def test_a_failure_without_a_rank_marker_shows_pytests_error(tmp_path):
    log = pytest_log({INFO.format("ucc"): "FAILED"},
                     {"test_info_names_the_route_for_cuda_tensors[ucc]":
                      ["E       AssertionError: route for CUDA tensors: staged", "E       assert 1 == 0"]})
    write_run(tmp_path, logs={"pytest-1.txt": log})
    failed = section(targets.table(tmp_path))
    assert "    - no rank named a check; pytest: AssertionError: route for CUDA tensors: staged" in failed, failed
    assert "- pass 2: no log (did not run)" in failed


def test_a_path_skipped_or_run_once_is_not_measured(tmp_path):
    skipped = pytest_log({ITEM.format("staged"): "PASSED",
                          ITEM.format("ucc"): "SKIPPED (HPCCOMM_GPU_PATHS does not list ucc)"})
    write_run(tmp_path, logs={"pytest-1.txt": skipped, "pytest-2.txt": skipped})
    got = verdicts(targets.table(tmp_path))
    assert got["tests/gpu passes twice on staged"] == "PASS"
    assert got["tests/gpu passes twice on ucc"] == "not measured"
    assert got["tests/gpu passes twice on ucc-triggered"] == "not measured"
    (tmp_path / "pytest-2.txt").unlink()
    assert verdicts(targets.table(tmp_path))["tests/gpu passes twice on staged"] == "not measured"


# What an MPI job prints when a rank raises outside any check (from a CPU rehearsal of the run: every rank
# program on a torch without CUDA), ending with Open MPI's abort notice, which says nothing of the cause.
CRASHED = """[rank0]: Traceback (most recent call last):
[rank0]:   File "/w/tests/gpu/ranks/cuda_ops.py", line 28, in <module>
[rank0]:     DEVICE = torch.device("cuda", torch.cuda.current_device())
[rank0]:     raise AssertionError("Torch not compiled with CUDA enabled")
[rank0]: AssertionError: Torch not compiled with CUDA enabled
hpccomm: rank 0: uncaught AssertionError: Torch not compiled with CUDA enabled; aborting the job
--------------------------------------------------------------------------
MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD
with errorcode 1.

NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.
--------------------------------------------------------------------------
[vm:17285] 1 more process has sent help message help-mpi-api.txt / mpi-abort
[vm:17285] Set MCA parameter "orte_base_help_aggregate" to 0 to see all help / error messages
acceptance: exit status 1 after 35 s
"""
PERFTEST_FAILED = """UCC perftest error: CUDA driver version is insufficient for CUDA runtime version in getDevice()
selected memory type Cuda is not available
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
  Process name: [[11810,1],1]
  Exit code:    1
--------------------------------------------------------------------------
acceptance: exit status 1 after 17 s
"""
STOPPED = """# staged: ok (12 s)
Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 355 in wait
Current thread 0x00007f0000000001 (most recent call first):
  File "/w/benchmarks/cuda_call_stages.py", line 88 in stage
  File "/w/benchmarks/cuda_call_stages.py", line 120 in main
acceptance: HUNG: still running at its 45 s limit (stacks above, where the program prints them)
acceptance: exit status 124 after 210 s
"""


def test_a_part_that_ended_badly_is_named_by_its_error_or_its_main_threads_top_frame(tmp_path):
    # Open MPI 5's prterun ends its abort notice with a NUL byte, which the run's exit note then follows.
    floor_2 = CRASHED.replace("rank 0", "rank 1").replace("acceptance: exit", "\0acceptance: exit")
    collection_error = ("==================================== ERRORS ====================================\n"
                        "E   ModuleNotFoundError: No module named 'hpccomm'\n"
                        "=========================== short test summary info ============================\n"
                        "ERROR tests/gpu/test_cuda.py\n!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!\n"
                        "acceptance: exit status 2 after 9 s\n")
    write_run(tmp_path, logs={"pytest-1.txt": collection_error, "pytest-2.txt": all_passed(),
                              "diag-stream.txt": CRASHED, "perftest-oop.txt": PERFTEST_FAILED,
                              "stages.txt": STOPPED, "floor-2.md": floor_2,
                              "mps-compare.log": "acceptance: out of time (budget 380 s), not started: python3\n"
                                                 "acceptance: exit status 124 after 371 s\n",
                              "ucc-trace.txt": "CL_BASIC TL_UCP\nacceptance: exit status 0 after 300 s\n",
                              "compare-staged.log": CRASHED.replace("acceptance: exit status 1 after 35 s\n", "")})
    out = targets.table(tmp_path)
    failed = section(out)
    assert "- pass 1 (pytest-1.txt):\n  - exit status 2: ModuleNotFoundError: No module named 'hpccomm'" in failed
    assert "- pass 2 (pytest-2.txt): nothing failed or hung" in failed
    assert ("- diag-stream.txt:\n  - exit status 1: rank 0: AssertionError: Torch not compiled with CUDA enabled"
            in failed), failed
    assert ("- perftest-oop.txt: exit status 1: UCC perftest error: CUDA driver version is insufficient for CUDA "
            "runtime version in getDevice()") in failed
    assert ("- stages.txt: the part was ended at its 45 s limit; top frame: "
            "/w/benchmarks/cuda_call_stages.py:88 in stage") in failed
    assert "- floor-2.md: exit status 1: rank 1: AssertionError: Torch not compiled" in failed
    assert "- mps-compare.log: did not run (no time left)" in failed
    assert "ucc-trace.txt" not in failed and "compare-staged.log" not in failed  # exit 0; no part of its own
    assert "MPI_ABORT" not in failed and "help message" not in failed
    # One bullet a line: a reason never spills over lines (a benchmark's from an older run kept its output's tail).
    write_run(tmp_path, compare_json(timings(), failed={"ucc": "exit 1 before its first cell: cesses\n---\nx"}))
    failed = section(targets.table(tmp_path)).splitlines()
    assert "- benchmark, ucc path: exit 1 before its first cell: cesses --- x" in failed


def test_every_set_up_step_that_hung_failed_or_had_no_time_is_named_by_its_command(tmp_path):
    # Where torch's CUDA set-up hangs, every probe that loads torch does: set-up.txt then holds several hangs, each
    # under its step's line (limits.sh's setup_step), and each is named with its own top frame, not the first's.
    def hung(code: str, line: int, where: str, limit: int) -> str:
        return (f"acceptance: set-up: python3 -c {code}\n"
                f"Current thread 0x00007f0000000001 (most recent call first):\n"
                f'  File "/venv/torch/cuda/__init__.py", line {line} in {where}\n  File "<string>", line 1 in <module>\n'
                f"acceptance: HUNG: still running at its {limit} s limit (stacks above, where the program prints them)\n"
                f"acceptance: exit status 124 after {limit + 20} s\n")
    # A step that ended well may leave a line without its end (here a NUL, as Open MPI 5's notices end): the next
    # step's line is still its own.
    setup = (hung("import torch; print(torch.cuda.device_count())", 1026, "device_count", 60)
             + "acceptance: set-up: python3 -m zipfile -e /b/ucx/libucx_cu13-1.20.0.whl /tmp/hpccomm-ucc/ucx\n"
             + "warning: a line on stderr from a step that ended well\0"
             + hung("from hpccomm.transports.mpi_cuda import cuda_aware; print(cuda_aware())", 372, "_lazy_init", 44)
             + "acceptance: set-up: python3 -c import torch; print(\"torch\", torch.__version__, \"cuda\", "
               "torch.version.cuda, \"gpus\", torch.cuda.device_count())\n"
             + "acceptance: out of time (budget 380 s), not started: python3 /b/with_stacks.py -c import torch\n"
             + "acceptance: exit status 124 after 371 s\n")
    write_run(tmp_path, logs={"set-up.txt": setup})
    assert targets.other_parts(tmp_path) == [
        "- set-up.txt, `python3 -c import torch; print(torch.cuda.device_count())`: the step was ended at its 60 s "
        "limit; top frame: /venv/torch/cuda/__init__.py:1026 in device_count",
        "- set-up.txt, `python3 -c from hpccomm.transports.mpi_cuda import cuda_aware; print(cuda_aware())`: the "
        "step was ended at its 44 s limit; top frame: /venv/torch/cuda/__init__.py:372 in _lazy_init",
        "- set-up.txt, `python3 -c import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, "
        "\"gpus\", to...`: did not run (no time left)"]
    assert "- set-up.txt, `python3 -c import torch; print(torch.cuda.device_count())`" in section(targets.table(tmp_path))
    # Lines before any step's (none of the run's writes them) are named as such.
    write_run(tmp_path, logs={"set-up.txt": "Traceback (most recent call last):\nOSError: disk full\n"
                                            "acceptance: exit status 1 after 3 s\nacceptance: set-up: python3 -c x\n"})
    assert targets.other_parts(tmp_path) == ["- set-up.txt, before its first step: exit status 1: OSError: disk full"]


def test_the_error_that_ended_a_program_comes_before_the_launchers_words_and_the_main_threads_frame_first():
    ended = load_script(REPO / "tests" / "ended.py")
    # Without hpccomm's line: the first exception a traceback ends with (a chained one prints its cause first).
    chained = ("Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n"
               "hpccomm.errors.CommTimeoutError: hpccomm all_reduce #5 timed out\n\nDuring handling of the above "
               "exception, another exception occurred:\n\nRuntimeError: cleanup failed\n"
               "[vm:1] [[1,0],0] ORTE_ERROR_LOG: Data unpack would read past end of buffer\n")
    assert ended.error_that_ended(chained) == "hpccomm.errors.CommTimeoutError: hpccomm all_reduce #5 timed out"
    assert ended.error_that_ended("[1,0]<stderr>:ValueError: bad size\n") == "ValueError: bad size"
    assert ended.error_that_ended("MPI_ABORT was invoked on rank 0\nwith errorcode 1.\n") is None
    assert ended.error_that_ended("x" * 10 + "\ncuda error: " + "y" * 400)[-3:] == "..."
    assert ended.stack_top("no stacks\n  File \"a.py\", line 1 in f\n") is None
    # No "Current thread" mark: the thread printed last, the oldest (faulthandler lists the newest first).
    threads = ("Thread 0x2 (most recent call first):\n  File \"t.py\", line 5 in wait\n\n"
               "Thread 0x1 (most recent call first):\n  File \"m.py\", line 9 in main\n"
               "  File \"m.py\", line 2 in <module>\n")
    assert ended.stack_top(threads) == "m.py:9 in main"


def test_where_no_python_stack_was_printed_the_first_processs_main_thread_names_its_top_c_frames():
    ended = load_script(REPO / "tests" / "ended.py")
    # As tests/gpu/limits.sh prints gdb's stacks: each thread's, the main one (thread 1) last; "??" is unnamed; a
    # C++ frame with its parameters, a clone's suffix.
    gdb = ("acceptance: native stack of pid 41 (/tmp/hpccomm-ucc/bin/ucc_perftest -c allreduce -m cuda)\n"
           "Thread 2 (Thread 0x7f2 (LWP 43) \"cuda-EvtHandlr\"):\n#0  0x00007f1 in poll () from /lib/libc.so.6\n"
           "Thread 1 (Thread 0x7f0 (LWP 41) \"ucc_perftest\"):\n#0  0x00007f9 in sched_yield () from /lib/libc.so.6\n"
           "#1  0x00007f8 in ?? () from /lib/libuct.so.0\n#2  0x00007f7 in ucp_worker_progress () from /lib/libucp.so\n"
           "#3  ucc_context_progress (context=0x1, n=<optimized out>) at core/ucc_context.c:1010\n"
           "#4  0x00007f6 in ucc_pt_coll_allreduce::run(ucc_pt_test_args&) [clone .cold] () from ucc_perftest\n"
           "#5  0x00007f5 in main ()\n"
           "acceptance: native stack of pid 42 (/tmp/hpccomm-ucc/bin/ucc_perftest -c allreduce -m cuda)\n"
           "Thread 1 (Thread 0x7e0 (LWP 42) \"ucc_perftest\"):\n#0  0x00007e9 in nanosleep () from /lib/libc.so.6\n")
    assert ended.native_top(gdb) == ("pid 41 (ucc_perftest): sched_yield < ucp_worker_progress < ucc_context_progress"
                                     " < ucc_pt_coll_allreduce::run(ucc_pt_test_args&)")
    assert ended.native_top("acceptance: no gdb here: no native stacks\n") is None
    hung = "acceptance: HUNG: still running at its 30 s limit (stacks above, where the program prints them)\n"
    log = targets.parse_log("perftest-oop.txt", gdb + hung)
    assert targets.ended_badly(log) == ("the part was ended at its 30 s limit; top C frames, pid 41 (ucc_perftest): "
                                        "sched_yield < ucp_worker_progress < ucc_context_progress < "
                                        "ucc_pt_coll_allreduce::run(ucc_pt_test_args&)")
    # Where a Python stack was printed, it names where the part stood, and a garbled one (two dumps interleaved)
    # names no frame rather than the C frames of whichever process gdb read first.
    python = "Current thread 0x1 (most recent call first):\n  File \"x.py\", line 3 in <module>\n"
    assert targets.ended_badly(targets.parse_log("p.txt", python + gdb + hung)).endswith("; top frame: x.py:3 in <module>")
    garbled = "Current thread 0x1 (most recent call first):\n  File \"x.pyThread 0x2 (most recent call first):\n"
    assert targets.ended_badly(targets.parse_log("p.txt", garbled + gdb + hung)) == \
        "the part was ended at its 30 s limit"
