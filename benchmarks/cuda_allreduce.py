"""CUDA collectives: each hpccomm path against Gloo on the same CUDA tensors, values checked; the staged limit.

    python benchmarks/cuda_allreduce.py --compare [-n 2] [--ops ...] [--json FILE]   # every path, one job each
    hpccomm-run -n 2 python benchmarks/cuda_allreduce.py [--gloo] [--ops ...]        # the path the environment picks

(The name is historical: it timed all_reduce alone; tests/gpu/acceptance.sh,
the docs and hpccomm.config name it.) ``--ops`` (comma-separated, default all
five): ``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``,
``broadcast`` and ``all_to_all_single``, float32, the blocking calls FSDP2
and DDP make. A row's ``bytes`` is the natural message size of its op: the
tensor for ``all_reduce`` (SUM, in place) and ``broadcast`` (from rank 0);
the OUTPUT for ``all_gather_into_tensor`` (each rank gives bytes/world); the
INPUT for ``reduce_scatter_tensor`` (SUM; each rank gets bytes/world); the
tensor for ``all_to_all_single`` (bytes/world to each peer). The last three
need bytes divisible by 4 x world: other sizes are rounded up to that (at two
ranks 4 B becomes 8 B there), and the row says the size measured.

``--compare`` (no launcher: it starts the jobs) runs one job per path, each
with the environment that selects it, and prints one table per op: per size,
the median us per blocking call of every path, Gloo's, which path is fastest,
and ``auto``'s time against the fastest; then the threshold to set
(``HPCCOMM_CUDA_STAGED_MAX_BYTES``: the largest size the staged path beat UCC
at all_reduce, below every size UCC won). The paths:

* ``staged``: through pinned host memory and the CPU transport;
* ``ucc``: UCC on device memory, in-place reductions through the group's scratch
  (``HPCCOMM_UCC_IN_PLACE=scratch``, the default); ``ucc-native`` and
  ``ucc-tuned``: UCC's in-place flag, as it is and with its pipelining off
  (all_reduce only: the other ops are not in place);
  ``ucc-triggered``: the scratch, posted on an execution engine
  (``HPCCOMM_UCC_TRIGGERED=1``);
* ``auto``: the default routing (staged up to the threshold, then UCC);
* Gloo, timed in the first job that runs every op (``--gloo``).

Every value is checked: after an (op, size)'s timing, each backend makes one
more call on rank-dependent values, compared exactly with what the op must
give; a wrong result makes that cell ``"wrong"`` (a call that raised,
``"error"``), never a number, so a wrong path cannot post a fast time.

Time is bounded per job: per size, each backend makes one warm-up call, one
timed call to calibrate, then ``--rounds`` rounds of ``--iters`` calls (by
default as many as move about :data:`BYTES_PER_ROUND`, at most
:data:`MAX_ITERS`, and no more than fit ``--round-s`` at the calibrated
speed), then the checked call; a row is the median over rounds of the
slowest rank's time per call (ended by ``torch.cuda.synchronize()``, after a
barrier). Each rank prints ``timing <op> <bytes> rank=<r>`` as it starts a
cell, so a job killed past ``--job-timeout`` says where it was; the job's
JSON is rewritten after every cell, so the cells done before count, and so
do the other paths'. ``--budget-s`` bounds the whole comparison (each job
gets at most what is left), and the summary is written after every job.
``--json FILE`` with ``--compare``: the summary (:func:`summarise`): ``paths``,
``failed`` {path: why}, ``machine``, ``auto_staged_max_bytes``, ``ops`` {op:
{``rows``, ``threshold``}} and, as before, all_reduce's ``rows`` and
``threshold`` at the top; a row is ``bytes``, ``us`` {path: us or "wrong" or
"error"}, ``gloo``, ``best``, ``auto_over_best`` (and ``errors`` where a call
raised). Beside it, per path, the job's own JSON and output
(``FILE-<path>.json``, ``FILE-<path>.log``, FILE without its suffix). Run by
tests/gpu/acceptance.sh, whose targets table (tests/gpu/targets.py) reads the
summary; ``--device cpu`` uses CPU tensors, to try this script where no GPU is.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Each path's environment, on top of the caller's.
PATHS: dict[str, dict[str, str]] = {
    "staged": {"HPCCOMM_TRANSPORT": "cuda:staged"},
    "ucc": {"HPCCOMM_TRANSPORT": "cuda:ucc", "HPCCOMM_CUDA_STAGED_MAX_BYTES": "0", "HPCCOMM_UCC_IN_PLACE": "scratch"},
    "ucc-native": {"HPCCOMM_TRANSPORT": "cuda:ucc", "HPCCOMM_CUDA_STAGED_MAX_BYTES": "0",
                   "HPCCOMM_UCC_IN_PLACE": "native"},
    "ucc-tuned": {"HPCCOMM_TRANSPORT": "cuda:ucc", "HPCCOMM_CUDA_STAGED_MAX_BYTES": "0",
                  "HPCCOMM_UCC_IN_PLACE": "tuned"},
    "ucc-triggered": {"HPCCOMM_TRANSPORT": "cuda:ucc", "HPCCOMM_CUDA_STAGED_MAX_BYTES": "0",
                      "HPCCOMM_UCC_TRIGGERED": "1"},
    "auto": {},
}
#: The in-place variants differ from ``ucc`` only in how an in-place reduction is done: all_reduce alone.
ALL_REDUCE_ONLY = frozenset({"ucc-native", "ucc-tuned"})
OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "all_to_all_single")
#: Ops whose tensors are split in world parts: their bytes must divide by 4 x world.
SPLIT_OPS = frozenset({"all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"})
SIZES = "4,65536,1048576,2097152,4194304,16777216,67108864"
#: A cell whose check failed, or whose call raised: never a time.
WRONG, ERROR = "wrong", "error"
#: Default calls per round: about this many bytes (2 at 64 MiB, 8 at 16 MiB), between 1 and MAX_ITERS, and
#: no more than fit ``--round-s`` at the calibrated time per call. With 3 rounds a cell then costs at most about
#: 0.3 s per backend plus three calls, so five ops at seven sizes stay near 10 s a backend even on a path with a
#: flat 14 ms per call (an H100, 2026-11-27), and the staged job with Gloo (64 MiB: 20-40 ms staged, up to
#: 100 ms for Gloo's all_gather) near 20 s plus start-up, within the acceptance run's 45 s per job.
BYTES_PER_ROUND = 128 << 20
MAX_ITERS = 100
ROUND_S = 0.1
PROGRESS = re.compile(r"^(timing|checking) (\S+) (\d+) rank=(\d+)", re.MULTILINE)


def message_bytes(op: str, size: int, world: int) -> int:
    """The bytes measured for ``op`` at ``size``: whole float32 elements, divisible by 4 x world where it splits."""
    unit = 4 * world if op in SPLIT_OPS else 4
    return max(unit, -(-size // unit) * unit)


def default_iters(size: int, call_s: float, round_s: float = ROUND_S) -> int:
    """Calls per round at ``size`` bytes for a call that took ``call_s``: :data:`BYTES_PER_ROUND`'s worth, bounded."""
    by_bytes = min(MAX_ITERS, max(1, BYTES_PER_ROUND // max(size, 1)))
    by_time = int(round_s / call_s) if call_s > 0 else by_bytes
    return max(1, min(by_bytes, by_time))


def number(cell: Any) -> bool:
    """Whether a cell is a time (not ``"wrong"``, ``"error"`` or missing)."""
    return isinstance(cell, (int, float)) and not isinstance(cell, bool)


# ---------------------------------------------------------------------------------------------- one job (ranks)

class Case:
    """One op at one size on one rank: its tensors, one call, the check's input and the result it must give."""

    def __init__(self, op: str, nbytes: int, rank: int, world: int, device: Any) -> None:
        import torch
        import torch.distributed as dist

        self.nbytes, self.rank = nbytes, rank
        n = nbytes // 4
        m = n // world
        # Small integers (< 2^24 after every sum here) are exact in float32: the check compares exactly.
        base = torch.arange(n, device=device, dtype=torch.int32).remainder_(251).float()
        self.fill: Callable[[], None]
        if op == "all_reduce":
            self.result = self.source = torch.zeros(n, device=device)
            self.call = lambda group: dist.all_reduce(self.result, group=group)
            self.fill = lambda: self.result.copy_(base + rank)
            self.expected = base * world + world * (world - 1) / 2
        elif op == "broadcast":
            self.result = self.source = torch.zeros(n, device=device)
            self.call = lambda group: dist.broadcast(self.result, 0, group=group)
            self.fill = lambda: self.result.copy_(base + rank)
            self.expected = base
        elif op == "all_gather_into_tensor":
            source, self.result = torch.zeros(m, device=device), torch.zeros(n, device=device)
            self.source = source
            self.call = lambda group: dist.all_gather_into_tensor(self.result, source, group=group)
            self.fill = lambda: (source.copy_(base[:m] + 1000 * rank), self.result.fill_(-1))
            self.expected = torch.cat([base[:m] + 1000 * peer for peer in range(world)])
        elif op == "reduce_scatter_tensor":
            source, self.result = torch.zeros(n, device=device), torch.zeros(m, device=device)
            self.source = source
            self.call = lambda group: dist.reduce_scatter_tensor(self.result, source, group=group)
            self.fill = lambda: (source.copy_(base + rank), self.result.fill_(-1))
            self.expected = base[rank * m:(rank + 1) * m] * world + world * (world - 1) / 2
        elif op == "all_to_all_single":
            source, self.result = torch.zeros(n, device=device), torch.zeros(n, device=device)
            self.source = source
            self.call = lambda group: dist.all_to_all_single(self.result, source, group=group)
            self.fill = lambda: (source.copy_(base + 1000 * rank), self.result.fill_(-1))
            # Rank r's part j is what rank j sent to r: its own part r.
            self.expected = torch.cat([base[rank * m:(rank + 1) * m] + 1000 * peer for peer in range(world)])
        else:
            raise ValueError(f"unknown op {op!r}: one of {', '.join(OPS)}")

    def mismatch(self) -> str | None:
        """After :attr:`fill` and one call: None if the result is right, else the first wrong element."""
        import torch

        if torch.equal(self.result, self.expected):
            return None
        index = int((self.result != self.expected).nonzero()[0])
        return f"element {index} is {float(self.result[index])}, should be {float(self.expected[index])}"


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(call: Callable[[], Any], iters: int, device: Any) -> float:
    """The slowest rank's time per call (us) over ``iters`` blocking calls, every byte landed."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        call()
    _sync(device)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters * 1e6])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # host tensor: hpccomm's CPU path; every rank gets the same
    return float(elapsed)


def agree(code: int) -> int:
    """The largest of every rank's ``code`` (0 right, 1 wrong, 2 raised): a cell is wrong if any rank saw it so."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([float(code)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag)


def measure(case: Case, groups: dict[str, Any], args: argparse.Namespace, device: Any, label: str) -> dict:
    """One row: each backend's median us per call (or WRONG/ERROR), its calls per round, the errors seen."""
    rank = case.rank
    iters: dict[str, int] = {}
    samples: dict[str, list[float]] = {name: [] for name in groups}
    errors: dict[str, str] = {}

    def raised(name: str, exc: Exception) -> None:
        errors[name] = f"{type(exc).__name__}: {exc}"[:300]
        print(f"ERROR rank={rank} {label} {name}: {errors[name]}", flush=True)

    for name, group in groups.items():  # warm up, then calibrate: every rank gets the same slowest time
        try:
            case.call(group)
            iters[name] = args.iters or default_iters(case.nbytes, timed(lambda: case.call(group), 1, device) / 1e6,
                                                      args.round_s)
        except Exception as exc:  # reported in the row; the job goes on to the next backend
            raised(name, exc)
    for _ in range(args.rounds):
        for name, group in groups.items():  # alternated, so that drift on the machine touches every backend alike
            if name in errors:
                continue
            try:
                samples[name].append(timed(lambda: case.call(group), iters[name], device))
            except Exception as exc:
                raised(name, exc)
    print(f"checking {label} rank={rank}", flush=True)
    row: dict[str, Any] = {"bytes": case.nbytes}
    for name, group in groups.items():
        code = 2 if name in errors else 0
        if not code:
            try:
                case.fill()
                case.call(group)
                _sync(device)
                wrong = case.mismatch()
                if wrong:
                    print(f"WRONG rank={rank} {label} {name}: {wrong}", flush=True)
                    code = 1
            except Exception as exc:
                raised(name, exc)
                code = 2
        code = agree(code)
        row[name] = (statistics.median(samples[name]) if samples[name] else ERROR) if code == 0 else (
            WRONG if code == 1 else ERROR)
    row["iters"] = iters
    if errors:
        row["errors"] = errors
    return row


def job_record(meta: dict, ops: dict[str, list[dict]], complete: bool) -> dict:
    """A job's JSON: ``meta``, ``ops`` {op: {"rows": [...]}}, all_reduce's rows at the top level too, ``complete``."""
    return {**meta, "complete": complete, "rows": ops.get("all_reduce", []),
            "ops": {op: {"rows": rows} for op, rows in ops.items()}}


def one_job(args: argparse.Namespace) -> None:
    """Time the path this job's environment selects (and Gloo with ``--gloo``); rank 0 reports."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a job past its limit prints its stacks first
    import hpccomm  # noqa: F401
    import torch
    import torch.distributed as dist
    from hpccomm.config import cuda_staged_limits
    from hpccomm.transports import device_routes

    dist.init_process_group("hpccomm")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    groups = {"hpccomm": dist.group.WORLD}
    if args.gloo:
        groups["gloo"] = dist.new_group(list(range(world)), backend="gloo")
    meta = {"torch": torch.__version__, "ranks": world, "rounds": args.rounds,
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "route": device_routes.describe("cuda"), "staged_max_bytes": cuda_staged_limits()["all_reduce"],
            "staged_limits": cuda_staged_limits()}
    done: dict[str, list[dict]] = {}
    for op in args.ops.split(","):
        done[op] = []
        for nbytes in dict.fromkeys(message_bytes(op, int(s), world) for s in args.sizes.split(",")):
            label = f"{op} {nbytes}"
            print(f"timing {label} rank={rank}", flush=True)
            case = Case(op, nbytes, rank, world, device)
            done[op].append(measure(case, groups, args, device, label))
            del case
            if rank == 0 and args.json:  # after every cell: a job killed later keeps what it measured
                _write_json(Path(args.json), job_record(meta, done, complete=False))
    if rank == 0:
        print(f"# torch {meta['torch']}, {world} ranks, {meta['gpu']}; CUDA route: {meta['route']}; "
              f"median of {args.rounds} rounds, slowest rank, us per call")
        for op, rows in done.items():
            print(f"\n## {op}\n| bytes | " + " | ".join(f"{name} us" for name in groups) + " | calls per round |\n"
                  + "|---" * (len(groups) + 2) + "|")
            for row in rows:
                print(f"| {row['bytes']} | " + " | ".join(_cell(row.get(name)) for name in groups)
                      + f" | {', '.join(f'{k} {v}' for k, v in row['iters'].items())} |")
        if args.json:
            _write_json(Path(args.json), job_record(meta, done, complete=True))
    dist.destroy_process_group()


def _write_json(path: Path, record: dict) -> None:
    """Write whole or not at all (a job killed mid-write leaves the previous file)."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(record))
    os.replace(part, path)


# ---------------------------------------------------------------------------------------------- --compare

def where(output: str) -> str | None:
    """Where a job was, from its ranks' last progress lines: ``in <op> <bytes>`` (per rank where they differ)."""
    last: dict[str, str] = {}
    for match in PROGRESS.finditer(output):
        last[match[4]] = f"{match[2]} {match[3]}" + (" (checking values)" if match[1] == "checking" else "")
    if not last:
        return None
    if len(set(last.values())) == 1:
        return f"in {next(iter(last.values()))}"
    return "; ".join(f"rank {rank} in {cell}" for rank, cell in sorted(last.items()))


def last_line(output: str) -> str:
    """A job's last line of output, at most 200 characters: its failure's summary where it names no error."""
    lines = [line.strip() for line in output.splitlines() if line.strip(" -")]
    return lines[-1][-200:] if lines else "no output"


def _tests_on_path() -> None:
    """Put this checkout's tests/ on sys.path: --compare's helpers (launch.py, ended.py) live there."""
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


def run_job(command: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, str, bool]:
    """Run one job in a session of its own; past ``timeout_s``: its ranks' stacks (SIGUSR1), then killed, all of it.

    Through tests/launch.py (which finds ranks that left the session too); without it (it needs pytest), the
    session alone. Returns the exit status, the output and whether it timed out.
    """
    _tests_on_path()
    try:
        from launch import run_launcher
    except ImportError:
        run_launcher = None
    if run_launcher is not None:
        launcher, python, script, rest = command[:3], command[3], command[4], command[5:]
        run = run_launcher(launcher, script, *rest, env=env, limit_s=timeout_s, python=python,
                           stacks_on_timeout=True)
        return run.returncode, run.output, run.timed_out
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, output, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGUSR1)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return proc.returncode, output, True


def compare(args: argparse.Namespace) -> None:
    """One job per path; per op, the combined table, the fastest path per size; the threshold to set."""
    # The acceptance run sends SIGUSR1 to all it started before it kills a part past its limit: print, not die.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    _tests_on_path()
    from ended import error_that_ended  # the error a failed job's output names, not MPI's abort notice after it
    started = time.monotonic()
    results: dict[str, dict] = {}
    failed: dict[str, str] = {}
    paths = args.paths.split(",")
    ops = args.ops.split(",")
    # Gloo once, in the first job that runs every op: it does not depend on hpccomm's path.
    gloo_path = next((p for p in paths if p not in ALL_REDUCE_ONLY), paths[0])
    stem = Path(args.json).with_suffix("") if args.json else None
    for path in paths:
        job_ops = [op for op in ops if op == "all_reduce" or path not in ALL_REDUCE_ONLY]
        left = args.budget_s - (time.monotonic() - started) if args.budget_s else float("inf")
        if not job_ops:
            continue
        if left < 15:  # a job needs about 10 s to start and measure anything
            failed[path] = f"not run: {args.budget_s} s budget spent"
            print(f"# {path}: {failed[path]}", file=sys.stderr, flush=True)
            continue
        out = Path(f"{stem}-{path}.json") if stem else Path(tempfile.gettempdir()) / f"cuda-{os.getpid()}-{path}.json"
        out.unlink(missing_ok=True)
        command = ["hpccomm-run", "-n", str(args.n), sys.executable, str(Path(__file__).resolve()),
                   "--sizes", args.sizes, "--ops", ",".join(job_ops), "--rounds", str(args.rounds),
                   "--iters", str(args.iters), "--round-s", str(args.round_s), "--device", args.device,
                   "--json", str(out)] + (["--gloo"] if path == gloo_path else [])
        timeout_s = min(args.job_timeout, left - 5)  # 5 s to end it and write the summary
        began = time.monotonic()
        rc, output, timed_out = run_job(command, PATHS[path], timeout_s)
        if stem:
            Path(f"{stem}-{path}.log").write_text(output)
        record = _read_json(out)
        if not stem:
            out.unlink(missing_ok=True)
        if record and record.get("ops"):
            results[path] = record  # a job that failed later keeps the cells it finished
        if timed_out or rc != 0 or not record or not record.get("complete"):
            complete = bool(record and record.get("complete"))
            at = "after its last cell" if complete else where(output) or "before its first cell"
            failed[path] = (f"over its {timeout_s:.0f} s limit {at}" if timed_out else
                            f"exit {rc} {at}: {error_that_ended(output) or last_line(output)}")
        print(f"# {path}: {'ok' if path not in failed else failed[path]} ({time.monotonic() - began:.0f} s)",
              file=sys.stderr, flush=True)
        if path in failed:
            print("\n".join(output.splitlines()[-40:]), file=sys.stderr, flush=True)
        if args.json:  # after every job: a comparison killed from outside keeps the jobs that finished
            _write_json(Path(args.json), summarise(results, failed))
    summary = summarise(results, failed)
    print(report(summary))
    if args.json:
        _write_json(Path(args.json), summary)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _job_ops(job: dict) -> dict[str, list[dict]]:
    """A job's rows per op (a job record without ``ops``, as this script wrote before, is all_reduce)."""
    if job.get("ops"):
        return {op: entry["rows"] for op, entry in job["ops"].items()}
    return {"all_reduce": job.get("rows", [])}


def summarise_op(results: dict[str, dict], op: str) -> dict:
    """One op: per size, every path's cell and Gloo's, the fastest path, ``auto`` against it; the threshold."""
    paths = [path for path in PATHS if path in results]
    by_path = {path: {row["bytes"]: row for row in _job_ops(results[path]).get(op, [])} for path in paths}
    rows = []
    for size in sorted({size for cells in by_path.values() for size in cells}):
        times = {path: cells[size]["hpccomm"] for path, cells in by_path.items() if size in cells}
        gloo = next((cells[size]["gloo"] for cells in by_path.values() if size in cells and "gloo" in cells[size]),
                    None)
        candidates = {path: us for path, us in times.items() if path != "auto" and number(us)}
        best = min(candidates, key=candidates.__getitem__) if candidates else None
        errors = {("gloo" if name == "gloo" else path): why for path, cells in by_path.items() if size in cells
                  for name, why in cells[size].get("errors", {}).items()}
        rows.append({"bytes": size, "us": times, "gloo": gloo, "best": best,
                     "auto_over_best": times["auto"] / candidates[best]
                     if best and number(times.get("auto")) else None, **({"errors": errors} if errors else {})})
    return {"rows": rows, "threshold": threshold(rows)}


def summarise(results: dict[str, dict], failed: dict[str, str]) -> dict:
    """Every op's table (``ops``), all_reduce's also at the top level (``rows``, ``threshold``), the failures."""
    ops = [op for op in OPS if any(op in _job_ops(job) for job in results.values())]
    per_op = {op: summarise_op(results, op) for op in ops}
    first = next(iter(results.values()), {})
    return {"paths": [path for path in PATHS if path in results], "failed": failed,
            "rows": per_op.get("all_reduce", {}).get("rows", []),
            "threshold": per_op.get("all_reduce", {}).get("threshold"),
            "machine": {key: first[key] for key in ("torch", "ranks", "gpu") if key in first},
            "auto_staged_max_bytes": results["auto"].get("staged_max_bytes") if "auto" in results else None,
            "ops": per_op}


def threshold(rows: list[dict]) -> int | None:
    """The largest size at which the staged path beat UCC (scratch): 0 if it never did; None if unknown."""
    measured = [row for row in rows if number(row["us"].get("staged")) and number(row["us"].get("ucc"))]
    if not measured:
        return None
    limit = 0
    for row in measured:
        if row["us"]["staged"] <= row["us"]["ucc"]:
            limit = row["bytes"]
    return limit


def _cell(value: Any) -> str:
    return f"{value:.1f}" if number(value) else "-" if value is None else str(value)


def report(summary: dict) -> str:
    """One Markdown table per op, the jobs that failed, the threshold line per op."""
    paths = summary["paths"]
    machine = summary["machine"]
    lines = []
    for op, entry in summary.get("ops", {}).items():
        lines.append(f"# CUDA {op} per path: {machine.get('ranks')} ranks, {machine.get('gpu')}, torch "
                     f"{machine.get('torch')}; us per blocking call (median, slowest rank)")
        lines.append("| bytes | " + " | ".join(paths) + " | gloo | fastest | auto / fastest |")
        lines.append("|---" * (len(paths) + 4) + "|")
        for row in entry["rows"]:
            cells = [_cell(row["us"].get(path)) for path in paths]
            ratio = f"{row['auto_over_best']:.2f}" if row["auto_over_best"] is not None else "-"
            lines.append(f"| {row['bytes']} | " + " | ".join(cells)
                         + f" | {_cell(row['gloo'])} | {row['best'] or '-'} | {ratio} |")
        for row in entry["rows"]:
            lines += [f"{op} {row['bytes']} B, {name}: {why}" for name, why in row.get("errors", {}).items()]
        if entry["threshold"] is not None:
            lines.append(f"\n{op}: the staged path beat UCC up to {entry['threshold']} B" if entry["threshold"]
                         else f"\n{op}: the staged path never beat UCC")
        lines.append("")
    for path, why in summary["failed"].items():
        lines.append(f"{path}: not (fully) measured: {why}")
    if summary["threshold"] is not None:
        lines.append(f"\nHPCCOMM_CUDA_STAGED_MAX_BYTES={summary['threshold']}: the largest size measured at which "
                     f"the staged path beat UCC at all_reduce (default here: {summary['auto_staged_max_bytes']})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", action="store_true", help="run one job per path and compare them")
    parser.add_argument("--paths", default=",".join(PATHS), help="with --compare: which, comma-separated")
    parser.add_argument("-n", type=int, default=2, help="with --compare: ranks per job")
    parser.add_argument("--job-timeout", type=int, default=240, help="with --compare: seconds per job")
    parser.add_argument("--budget-s", type=int, default=0, help="with --compare: seconds for every job together")
    parser.add_argument("--ops", default=",".join(OPS), help="collectives, comma-separated")
    parser.add_argument("--sizes", default=SIZES, help="bytes per call (see the docstring), comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=0, help="calls per round (default: by size and speed)")
    parser.add_argument("--round-s", type=float, default=ROUND_S, help="default --iters: at most this long a round")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: try this script without a GPU")
    parser.add_argument("--gloo", action="store_true", help="time Gloo too")
    parser.add_argument("--json", help="write the results here (rank 0)")
    args = parser.parse_args()
    unknown = set(args.ops.split(",")) - set(OPS) or set(args.paths.split(",")) - set(PATHS)
    if unknown:
        parser.error(f"unknown: {', '.join(sorted(unknown))} (ops: {', '.join(OPS)}; paths: {', '.join(PATHS)})")
    if args.compare:
        compare(args)
    else:
        one_job(args)


if __name__ == "__main__":
    main()
