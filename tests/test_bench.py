"""``python -m hpccomm bench``: the tool's arithmetic, tables, JSON, plot, #wrong and clean stop (never its speed)."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from launch import RANKS_DIR, run_ranks

from hpccomm.cli.bench import parse_size, sweep_sizes
from hpccomm.cli.collectives import COLLECTIVES, IN_PLACE, OUT_OF_PLACE, Case, bus_factor, element_count

# A tiny sweep: 4 B (MPI), 512 B and 64 KiB (all_reduce through shared memory); few calls.
TINY = ["-b", "4", "-e", "64K", "-f", "128", "-n", "4", "-w", "1", "--block", "2", "--no-progress"]
COMPARE = ["--compare", "gloo,mpi4py"]

# Its result is the same under every torch release and MPI: CI runs it in its first step only (.ci/run).
pytestmark = pytest.mark.one_environment


@pytest.mark.parametrize(
    "name, nranks, factor",
    [
        ("all_reduce", 2, 1.0),
        ("all_reduce", 4, 1.5),  # 2 (n-1) / n
        ("all_gather", 4, 0.75),  # (n-1) / n
        ("reduce_scatter", 8, 0.875),
        ("all_to_all", 2, 0.5),
        ("broadcast", 4, 1.0),
        ("reduce", 3, 1.0),
        ("sendrecv", 2, 1.0),
    ],
)
def test_bus_factors_are_nccl_tests(name, nranks, factor):
    assert bus_factor(name, nranks) == pytest.approx(factor)


def test_sizes_follow_nccl_tests_flags():
    assert parse_size("4") == 4 and parse_size("64K") == 65536 and parse_size("1M") == 1 << 20
    assert parse_size("1G") == 1 << 30 and parse_size("2MiB") == 2 << 20
    assert sweep_sizes(4, 64, 2) == [4, 8, 16, 32, 64]
    assert sweep_sizes(1 << 20, 1 << 20, 2) == [1 << 20]
    with pytest.raises(ValueError):
        sweep_sizes(64, 4, 2)
    # all_gather splits the array evenly: at least one float per rank.
    assert element_count(COLLECTIVES["all_gather"], 4, 4, 3) == 3
    assert element_count(COLLECTIVES["all_gather"], 1000, 4, 3) == 249
    assert element_count(COLLECTIVES["all_reduce"], 1000, 4, 3) == 250


def test_expected_results_by_hand():
    # Rank 0 contributes 0,1,2,3,0,..., rank 1 3,0,1,2,... (period 4).
    def case(name, rank, op="sum", placement=IN_PLACE, count=4):
        ops = {"sum": torch.distributed.ReduceOp.SUM, "max": torch.distributed.ReduceOp.MAX}
        return Case(COLLECTIVES[name], count, torch.float32, ops[op], 0, placement, rank, 2)

    assert case("all_reduce", 0).expected.tolist() == [3, 1, 3, 5]
    assert case("all_reduce", 1, "max").expected.tolist() == [3, 1, 2, 3]
    assert case("reduce_scatter", 1, placement=OUT_OF_PLACE).expected.tolist() == [3, 5]
    assert case("all_gather", 0, placement=OUT_OF_PLACE).expected.tolist() == [0, 1, 1, 2]
    assert case("all_to_all", 1, placement=OUT_OF_PLACE).expected.tolist() == [2, 3, 1, 2]
    assert case("broadcast", 1).expected.tolist() == [0, 1, 2, 3]
    assert case("reduce", 1).expected is None  # only the root's result is defined
    one = case("all_reduce", 0)
    one.reset()
    one.output.copy_(one.expected)
    one.output[2] = 0
    assert one.wrong() == 1


def _table(output: str, collective: str) -> tuple[list[str], list[list[str]]]:
    """The header lines and the rows of one collective's text table."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"# {collective},"))
    header, rows = lines[start + 1 : start + 4], []
    for line in lines[start + 4 :]:
        if line.startswith("#") or not line.strip():
            break
        rows.append(line.split())
    return header, rows


def test_sweep_tables_json_and_plot(tmp_path):
    result, picture = tmp_path / "r.json", tmp_path / "r.png"
    run = run_ranks(2, "bench.py", *TINY, *COMPARE, "--json", str(result), "--plot", str(picture), limit_s=300)
    assert run.returncode == 0 and not run.timed_out, run.output[-6000:]
    for name, collective in COLLECTIVES.items():
        groups, titles, units = _table(run.output, name)[0]
        for placement in collective.placements:
            assert placement in groups, groups
        for title in ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "gloo", "vs gloo", "mpi4py", "vs mpi4py"):
            assert f" {title} " in titles + " ", (name, titles)
        assert "(us)" in units and "(GB/s)" in units
        rows = _table(run.output, name)[1]
        assert len(rows) == 3, (name, rows)
    assert "#wrong: 0 elements in total" in run.output

    record = json.loads(result.read_text())
    assert record["environment"]["world_size"] == 2 and record["environment"]["mpi"]["library"]
    assert record["environment"]["versions"]["torch"] == torch.__version__
    rows = record["rows"]
    keys = {(r["collective"], r["placement"], r["contender"]) for r in rows}
    for name, collective in COLLECTIVES.items():
        for placement in collective.placements:
            for contender in ("hpccomm", "gloo", "mpi4py"):
                assert (name, placement, contender) in keys
    for row in rows:
        assert row["wrong"] == 0, row
        if row["time_us"] is None:
            continue
        assert row["algbw_GBps"] == pytest.approx(row["bytes"] / (row["time_us"] * 1e-6) / 1e9)
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * bus_factor(row["collective"], 2))
    # The table prints what the JSON holds: the 64 KiB all_reduce's busbw.
    ours = next(r for r in rows if (r["collective"], r["contender"], r["bytes"]) == ("all_reduce", "hpccomm", 65536))
    table_row = next(r for r in _table(run.output, "all_reduce")[1] if r[0] == "65536")
    assert float(table_row[7]) == pytest.approx(ours["busbw_GBps"], abs=0.006)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_wrong_counts_a_corrupted_result(tmp_path):
    result = tmp_path / "r.json"
    run = run_ranks(2, "bench.py", "--corrupt-all-reduce", "all_reduce", *TINY, *COMPARE, "--json", str(result))
    assert not run.timed_out, run.output[-6000:]
    assert run.returncode == 1, f"a wrong result must fail the run\n{run.output[-6000:]}"
    assert "FAILED" in run.output
    rows = json.loads(result.read_text())["rows"]
    ours = [r for r in rows if r["contender"] == "hpccomm"]
    # One element wrong on rank 1 after each check: one per round (4 calls in blocks of 2).
    assert ours and all(r["wrong"] == 2 for r in ours), ours
    assert all(r["wrong"] == 0 for r in rows if r["contender"] != "hpccomm")
    first_row = _table(run.output, "all_reduce")[1][0]
    assert first_row[8] == "2", first_row


def test_ctrl_c_stops_with_what_was_measured(tmp_path):
    result = tmp_path / "r.json"
    launcher = os.path.join(os.path.dirname(sys.executable), "hpccomm-run")
    command = [launcher, "-n", "2", sys.executable, str(RANKS_DIR / "bench.py"), "all_reduce",
               "-b", "4", "-e", "4", "-n", "100000000", "--block", "50", "--no-progress", "--json", str(result)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        seen = ""
        while "# all_reduce," not in seen and time.monotonic() < deadline:
            seen += proc.stdout.readline()
        time.sleep(2)  # inside the endless timed loop
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends the launcher
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = seen + output
    # The ranks exit 130; what the launcher makes of that after its own Ctrl-C is its business:
    # MPICH 4.0.2's hydra once returned 0 (and non-zero in another run of the same test).
    assert proc.returncode != 0 or "# stopped by SIGINT" in output, output
    record = json.loads(result.read_text())  # written by rank 0 as the first signal arrived
    assert record["interrupted"] in ("SIGINT", "SIGTERM"), record["interrupted"]
    # Open MPI's mpirun turns Ctrl-C into SIGTERM and kills the ranks 0.25 s later, which can be
    # before they reach the end of the round; MPICH's forwards SIGINT and the ranks stop together.
    if "# stopped by" in output:
        rows = json.loads(result.read_text())["rows"]
        assert rows and all(r["iterations"] > 0 for r in rows if r["time_us"]), rows
        # A measured row (it starts with its size): Open MPI 4.1's mpirun once passed on the row
        # but not the column headings printed before it, so the rows are not found by position.
        measured = [line for line in output.splitlines() if line.split() and line.split()[0].isdigit()]
        assert measured, output[-4000:]


def test_bench_refuses_bad_arguments_before_communicating():
    run = run_ranks(2, "bench.py", "all_reduce", "-r", "5")
    assert run.returncode != 0 and "the root must be a rank" in run.output, run.output[-4000:]
    run = run_ranks(2, "bench.py", "allreduce")
    assert run.returncode != 0 and "unknown collective" in run.output, run.output[-4000:]


def test_console_script_and_module_entry():
    for command in (["hpccomm-bench", "--help"], [sys.executable, "-m", "hpccomm", "bench", "--help"]):
        if command[0] == "hpccomm-bench":
            command[0] = os.path.join(os.path.dirname(sys.executable), "hpccomm-bench")
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "--maxbytes" in proc.stdout and "--compare" in proc.stdout and "--model" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "hpccomm"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "bench" in proc.stderr and "info" in proc.stderr


def test_model_step_benchmark_reports_both_backends():
    run = run_ranks(2, "bench.py", "--model", "ddp", "--arch", "mlp", "--width", "32", "--batch", "4",
                    "--steps", "4", "--warmup-steps", "1", "--step-block", "2", limit_s=300)
    assert run.returncode == 0 and not run.timed_out, run.output[-6000:]
    rows = {line.split()[0]: line.split() for line in run.output.splitlines() if line.split()[:1] in (["compute"], ["hpccomm"], ["gloo"])}
    assert set(rows) == {"compute", "hpccomm", "gloo"}, run.output[-4000:]
    assert all(math.isfinite(float(row[1])) and float(row[1]) > 0 for row in rows.values())
    assert "step time hpccomm / gloo:" in run.output
    assert "replicas identical after training: hpccomm yes, gloo yes" in run.output
