"""``python -m hpccomm bench`` (``hpccomm-bench``): collective sweeps against Gloo and raw MPI.

Run under a launcher::

    hpccomm-run -n 2 python -m hpccomm bench                      # every collective, 4 B - 64 MiB
    hpccomm-run -n 2 python -m hpccomm bench all_reduce -b 4 -e 1G -f 2 --compare gloo,mpi4py
    hpccomm-run -n 2 python -m hpccomm bench --compare gloo,mpi4py --json r.json --plot r.png
    hpccomm-run -n 2 python -m hpccomm bench --model ddp          # training steps (hpccomm/cli/model.py)

Flags follow nccl-tests: ``-b/-e/-f`` size sweep, ``-d`` dtype, ``-o`` reduce
op, ``-r`` root, ``-w/-n`` warm-up and timed calls, ``-c`` check. A row's time
is the median over calls of the slowest rank's time; algbw and busbw use
nccl-tests' sizes and factors (:mod:`hpccomm.cli.collectives`). ``--compare``
times Gloo and raw mpi4py on the same tensors in the same process,
interleaved with hpccomm (:mod:`hpccomm.cli.sweep`), and adds each one's time
and its ratio to hpccomm's (``vs gloo`` = Gloo's time / hpccomm's time, equal
to hpccomm's busbw / Gloo's: above 1, hpccomm is faster).

Exit status: 0; 1 when any result had a wrong element; 130 when stopped by
Ctrl-C (rows measured so far are printed and saved).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from .collectives import ALIASES, COLLECTIVES, DTYPES, REDUCE_OPS, Case, Collective, bandwidths, element_count
from .console import Console, StopSignal
from .contenders import COMPARABLE, GLOO, HPCCOMM, MPI4PY, Contender, MPIContender, TorchContender, Unsupported
from .sweep import Measurement, Variant, measure
from .table import Column, Table, fmt_bandwidth, fmt_bytes, fmt_ratio, fmt_time_us

_SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from '4', '64K', '1M', '1G' (1024-based, as nccl-tests reads them).

    Args:
        text: the size as typed.
    """
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = _SUFFIXES.get(value[-1:], 1)
    number = value[:-1] if scale != 1 else value
    try:
        size = int(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use bytes, or K/M/G)") from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"size must be at least 1 byte, got {text!r}")
    return size


def sweep_sizes(minbytes: int, maxbytes: int, factor: float) -> list[int]:
    """The sizes from ``minbytes`` to ``maxbytes``, each ``factor`` times the last.

    Args:
        minbytes: first size.
        maxbytes: largest size.
        factor: step factor, above 1 (or any value when the two sizes are equal).
    """
    if maxbytes < minbytes:
        raise ValueError(f"-e {maxbytes} is below -b {minbytes}")
    if factor <= 1 and maxbytes > minbytes:
        raise ValueError(f"-f must be above 1 to sweep from {minbytes} to {maxbytes} bytes")
    sizes, size = [], float(minbytes)
    while size <= maxbytes:
        sizes.append(int(size))
        size *= factor
        if factor <= 1:
            break
    return sizes


def auto_iterations(nbytes: int) -> int:
    """Timed calls per contender for ``-n auto``: 200 up to 1 MiB, then fewer, at least 20."""
    return max(20, min(200, (1 << 28) // max(nbytes, 1)))


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m hpccomm bench``."""
    parser = argparse.ArgumentParser(
        prog="python -m hpccomm bench",
        description="Time hpccomm's collectives (and Gloo's and raw MPI's) over a size sweep, nccl-tests style.",
    )
    names = ", ".join(COLLECTIVES)
    parser.add_argument("collectives", nargs="*", metavar="COLLECTIVE", help=f"which to run (default: all): {names}")
    parser.add_argument("-b", "--minbytes", type=parse_size, default=4, help="smallest size (default 4)")
    parser.add_argument("-e", "--maxbytes", type=parse_size, default=64 << 20, help="largest size (default 64M)")
    parser.add_argument("-f", "--stepfactor", type=float, default=4, help="size multiplier per step (default 4)")
    parser.add_argument("-d", "--datatype", default="float", choices=sorted(DTYPES), help="element type (default float)")
    parser.add_argument("-o", "--op", default="sum", choices=list(REDUCE_OPS), help="reduce op (default sum)")
    parser.add_argument("-r", "--root", type=int, default=0, help="root of broadcast and reduce (default 0)")
    parser.add_argument("-w", "--warmup_iters", type=int, default=5, help="untimed calls per size (default 5)")
    parser.add_argument(
        "-n", "--iters", type=int, default=0, help="timed calls per contender and size (default: 200 to 1 MiB, then fewer, >= 20)"
    )
    parser.add_argument("--block", type=int, default=8, help="calls in a row per contender and round (default 8)")
    parser.add_argument("-c", "--check", type=int, default=1, choices=(0, 1), help="count wrong elements (default 1)")
    parser.add_argument("--compare", default="", help=f"also time these, comma-separated: {', '.join(COMPARABLE)}")
    parser.add_argument("--json", metavar="FILE", help="write every row and the environment as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="draw latency and busbw against size (needs hpccomm[plot])")
    parser.add_argument("--format", choices=("text", "markdown"), default="text", help="table style (default text)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    from . import model  # the training-step benchmark shares the command line

    model.add_arguments(parser)
    return parser


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, nranks: int) -> None:
    """Reject bad arguments before any rank communicates (every rank reaches the same verdict)."""
    wanted = [ALIASES.get(name, name) for name in args.collectives] or list(COLLECTIVES)
    unknown = [name for name in wanted if name not in COLLECTIVES]
    if unknown:
        parser.error(f"unknown collective(s) {', '.join(unknown)}; choose from {', '.join(COLLECTIVES)}")
    args.collectives = list(dict.fromkeys(wanted))
    args.compare = [name.strip() for name in args.compare.split(",") if name.strip()]
    bad = [name for name in args.compare if name not in COMPARABLE]
    if bad:
        parser.error(f"--compare {','.join(bad)}: choose from {', '.join(COMPARABLE)}")
    if not 0 <= args.root < nranks:
        parser.error(f"-r {args.root}: the root must be a rank, 0 to {nranks - 1}")
    if args.iters < 0 or args.warmup_iters < 0 or args.block < 1:
        parser.error("-n and -w must not be negative, --block must be at least 1")
    try:
        args.sizes = sweep_sizes(args.minbytes, args.maxbytes, args.stepfactor)
    except ValueError as exc:
        parser.error(str(exc))
    if args.plot:
        from .plot import require

        require()


class Bench:
    """One sweep: every selected collective over every size, printed as it goes.

    Args:
        args: the parsed command line.
        contenders: hpccomm first, then those to compare with.
        comm: a communicator of the bench's own, for agreement and summaries.
        MPI: the mpi4py module.
        console: rank 0's output.
        stop: the stop request.
    """

    def __init__(
        self, args: argparse.Namespace, contenders: list[Contender], comm: Any, MPI: Any, console: Console, stop: StopSignal
    ) -> None:
        self.args = args
        self.contenders = contenders
        self.comm = comm
        self.MPI = MPI
        self.console = console
        self.stop = stop
        self.rank = comm.Get_rank()
        self.nranks = comm.Get_size()
        self.dtype = DTYPES[args.datatype]
        self.op = REDUCE_OPS[args.op]
        self.rows: list[dict[str, Any]] = []
        self.notes: dict[str, str] = {}

    def run(self) -> None:
        """Every collective in turn (stops early once the ranks agree to)."""
        for name in self.args.collectives:
            if self.stop.agreed:
                return
            self.run_collective(COLLECTIVES[name])

    def run_collective(self, collective: Collective) -> None:
        """Sweep one collective and print its table."""
        args, console = self.args, self.console
        if self.nranks < collective.min_ranks:
            console.line(f"# {collective.name}: skipped, needs at least {collective.min_ranks} ranks")
            console.advance(collective.name, len(args.sizes))
            return
        table = Table(self._columns(collective), markdown=args.format == "markdown")
        console.line()
        console.line(f"# {collective.name}, {self.nranks} ranks: time = median over calls of the slowest rank")
        for line in table.header():
            console.line(line)
        seen: set[int] = set()
        for size in args.sizes:
            count = element_count(collective, size, self.dtype.itemsize, self.nranks)
            nbytes = count * self.dtype.itemsize
            label = f"{collective.name} {fmt_bytes(nbytes)}"
            if count in seen:
                console.advance(label, 1)
                continue
            seen.add(count)
            console.advance(label)
            measurements = self._measure(collective, count, nbytes, label)
            console.advance(label, 1)
            self._record(collective, count, nbytes, measurements)
            console.line(table.row(self._cells(collective, count, nbytes, measurements)))
            if self.stop.agreed:
                return
        for contender, reason in sorted(self.notes.items()):
            console.line(f"# {contender} n/a: {reason}")
        self.notes.clear()

    def _measure(self, collective: Collective, count: int, nbytes: int, label: str) -> list[Measurement]:
        variants = []
        for placement in collective.placements:
            case = Case(collective, count, self.dtype, self.op, self.args.root, placement, self.rank, self.nranks)
            for contender in self.contenders:
                try:
                    call, result = contender.call(case)
                    variants.append(Variant(contender.name, case, call, result))
                except Unsupported as exc:
                    variants.append(Variant(contender.name, case, None, unsupported=str(exc)))
        iterations = self.args.iters or auto_iterations(nbytes)
        return measure(
            variants,
            iterations,
            self.args.warmup_iters,
            self.args.block,
            bool(self.args.check),
            self.comm,
            self.MPI,
            self.stop,
            on_round=lambda: self.console.advance(label),
        )

    def _columns(self, collective: Collective) -> list[Column]:
        columns = [
            Column("size", "B", width=12),
            Column("count", "elements", width=12),
            Column("type", width=8),
            Column("redop", width=5),
            Column("root", width=4),
        ]
        for placement in collective.placements:
            columns += [
                Column("time", "us", placement, 9),
                Column("algbw", "GB/s", placement, 7),
                Column("busbw", "GB/s", placement, 7),
                Column("#wrong", "", placement, 6),
            ]
            for other in self.contenders[1:]:
                columns += [Column(other.name, "us", placement, 9), Column(f"vs {other.name}", "x", placement, 6)]
        return columns

    def _cells(self, collective: Collective, count: int, nbytes: int, measurements: list[Measurement]) -> list[str]:
        cells = [
            str(nbytes),
            str(count),
            self.args.datatype,
            self.args.op if collective.reduces else "-",
            str(self.args.root) if collective.rooted else "-",
        ]
        by_key = {(m.placement, m.contender): m for m in measurements}
        for placement in collective.placements:
            ours = by_key[(placement, HPCCOMM)]
            algbw, busbw = bandwidths(collective.name, nbytes, ours.time_s, self.nranks)
            cells += [fmt_time_us(ours.time_s), fmt_bandwidth(algbw), fmt_bandwidth(busbw), str(ours.wrong)]
            for other in self.contenders[1:]:
                theirs = by_key[(placement, other.name)]
                ratio = theirs.time_s / ours.time_s if theirs.time_s and ours.time_s else None
                cells += [fmt_time_us(theirs.time_s), fmt_ratio(ratio)]
                if theirs.unsupported:
                    self.notes[other.name] = theirs.unsupported
                if theirs.wrong:
                    self.notes[f"{other.name} #wrong"] = f"{theirs.wrong} wrong elements at {nbytes} B {placement}"
        return cells

    def _record(self, collective: Collective, count: int, nbytes: int, measurements: list[Measurement]) -> None:
        for m in measurements:
            algbw, busbw = bandwidths(collective.name, nbytes, m.time_s, self.nranks)
            self.rows.append(
                {
                    "collective": collective.name,
                    "placement": m.placement,
                    "contender": m.contender,
                    "bytes": nbytes,
                    "count": count,
                    "dtype": self.args.datatype,
                    "op": self.args.op if collective.reduces else None,
                    "root": self.args.root if collective.rooted else None,
                    "ranks": self.nranks,
                    "iterations": m.iterations,
                    "time_us": m.time_s * 1e6 if m.time_s else None,
                    "algbw_GBps": algbw,
                    "busbw_GBps": busbw,
                    "wrong": m.wrong,
                    "unsupported": m.unsupported,
                }
            )

    def wrong_total(self) -> int:
        """Wrong elements over every row and contender."""
        return sum(row["wrong"] for row in self.rows)


def write_json(path: str, bench: Bench, environment: dict[str, Any], argv: Sequence[str]) -> None:
    """Save the rows, the command line and the environment.

    Args:
        path: the file to write.
        bench: the sweep (its rows so far).
        environment: :func:`hpccomm.cli.environment.describe`'s record.
        argv: the command line.
    """
    record = {
        "tool": "python -m hpccomm bench",
        "argv": list(argv),
        "arguments": {k: v for k, v in vars(bench.args).items() if isinstance(v, (str, int, float, list, type(None)))},
        "interrupted": bench.stop.requested,
        "wrong_total": bench.wrong_total(),
        "environment": environment,
        "rows": list(bench.rows),
    }
    with open(path, "w") as out:
        json.dump(record, out, indent=1)
        out.write("\n")


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m hpccomm bench`` and ``hpccomm-bench``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    from .. import world

    ident = world.identity()
    if args.model:
        from . import model

        sys.exit(model.main(args))
    check_arguments(parser, args, ident.world_size)
    sys.exit(run_sweep(args, argv))


def run_sweep(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Set up the groups and contenders, sweep, report; returns the exit status."""
    import torch.distributed as dist

    from .. import world
    from .environment import describe, layout

    MPI = world.mpi()
    dist.init_process_group("hpccomm")
    control = world.members().Dup()
    contenders: list[Contender] = [TorchContender(HPCCOMM, None)]
    for name in args.compare:
        if name == GLOO:
            contenders.append(TorchContender(GLOO, dist.new_group(backend="gloo")))
        elif name == MPI4PY:
            contenders.append(MPIContender(world.members().Dup(), MPI))
    rank = control.Get_rank()
    environment = describe(layout(control))
    console = Console(rank == 0, not args.no_progress, len(args.collectives) * len(args.sizes))
    stop = StopSignal()
    bench = Bench(args, contenders, control, MPI, console, stop)
    if rank == 0 and args.json:
        stop.on_first = lambda: write_json(args.json, bench, environment, argv)
    stop.install()
    try:
        _preamble(console, args, environment, contenders)
        bench.run()
    finally:
        stop.restore()
        console.close()
    status = _summary(console, bench, stop)
    if rank == 0:
        if args.json:
            write_json(args.json, bench, environment, argv)
            console.line(f"# wrote {args.json}")
        if args.plot:
            from .plot import plot_sweep

            plot_sweep(bench.rows, args.plot, _title(environment, args))
            console.line(f"# wrote {args.plot}")
    dist.destroy_process_group()
    return status


def _preamble(console: Console, args: argparse.Namespace, environment: dict[str, Any], contenders: list[Contender]) -> None:
    mpi, versions = environment["mpi"], environment["versions"]
    console.line(
        f"# hpccomm bench: hpccomm {versions['hpccomm']}, torch {versions['torch']}, mpi4py {versions['mpi4py']}, "
        f"{mpi['library']} (thread level {mpi['thread_level']})"
    )
    layout = ", ".join(f"{host}: ranks {ranks}" for host, ranks in environment["nodes"].items())
    console.line(f"# {environment['world_size']} ranks on {len(environment['nodes'])} node(s) ({layout}); CPU {environment['cpu']['model']}")
    iters = args.iters or "auto (200 to 1 MiB, then fewer, >= 20)"
    console.line(
        f"# dtype {args.datatype}, op {args.op}, root {args.root}, warm-up {args.warmup_iters}, iterations {iters}, "
        f"rounds of {args.block} calls per contender in shuffled order; check {'on' if args.check else 'off'}"
    )
    if len(contenders) > 1:
        console.line("# vs X: X's time / hpccomm's time (above 1: hpccomm is faster; equals the busbw ratio)")


def _summary(console: Console, bench: Bench, stop: StopSignal) -> int:
    wrong = bench.wrong_total()
    console.line()
    if stop.agreed:
        console.line(f"# stopped by {stop.requested or 'a signal on another rank'}: the rows above are complete, the rest was not run")
    console.line(f"# #wrong: {wrong} elements in total{': FAILED' if wrong else ''}")
    if stop.agreed:
        return 130
    return 1 if wrong else 0


def _title(environment: dict[str, Any], args: argparse.Namespace) -> str:
    return (
        f"hpccomm {environment['versions']['hpccomm']}, {environment['world_size']} ranks on "
        f"{len(environment['nodes'])} node(s), {args.datatype}, {environment['mpi']['library'].split(',')[0]}"
    )
