"""What hpccomm costs a rank as the job grows: counts, CPU and memory at 2-64 ranks, and a linear fit (issue 41).

    python benchmarks/scale_cost.py [--ranks 2,4,8,16,32,64] [--layouts one,two] [--backends hpccomm,gloo]
                                    [--ft] [--json FILE]

Runs tests/ranks/scale_cost.py once per size and layout: ``one`` node
(``hpccomm-run -n N``) or ``two`` fake nodes (tests/nodes.py: root, unshare;
half the ranks on each). Per job: the slowest rank's MPI start, init and
``new_group`` (wall seconds: this machine is oversubscribed past 2 ranks, so
these grow with the load as much as with N), and per rank, read off each
rank (max over ranks): the store operations of init and of a group, the
fail-fast receives posted and goodbyes to send (and the largest's size), the CPU time of one fail-fast
check (median over ranks), the memory added (median over ranks). Then, for the
quantities that grow, a least-squares line ``a + b N`` over the sizes run
and its value at 1,024, 4,096 and 16,384 ranks. ``gloo``: the same job makes
torch's Gloo group through a TCPStore on rank 0 (rank and size from MPI), for
its times, memory, file descriptors and threads beside hpccomm's. ``--ft``: hpccomm's jobs in fault-tolerant
mode (``hpccomm-run --ft``, one node only), with the group's stop points: the receives they keep posted and the
CPU time of one look.
docs/scale.md reads these tables into its model.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import statistics
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from launch import HPCCOMM_RUN, run_ranks  # noqa: E402
from nodes import run_on_nodes  # noqa: E402

PREDICT_AT = (1024, 4096, 16384)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def job(n: int, layout: str, backend: str, ft: bool = False) -> list[dict[str, float]]:
    """Each rank's COST fields, or [] (the failure printed) where the job failed."""
    args = ("gloo", str(free_port())) if backend == "gloo" else ("hpccomm",)
    if layout == "one":
        launcher = [*HPCCOMM_RUN, "--ft"] if ft else HPCCOMM_RUN
        run = run_ranks(n, "scale_cost.py", *args, launcher=launcher, limit_s=900)
    else:
        run = run_on_nodes((n - n // 2, n // 2), "scale_cost.py", *args, limit_s=900)
    lines = re.findall(r"^COST (.*)$", run.output, re.MULTILINE)
    if run.returncode != 0 or run.timed_out or len(lines) != n:
        print(f"{backend} {layout} n={n}: the job failed:\n{run.output[-1500:]}", file=sys.stderr, flush=True)
        return []
    return [{key: float(value) for key, value in (pair.split("=") for pair in line.split())} for line in lines]


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``a + b N`` through ``(N, value)`` points."""
    ns, values = [n for n, _ in points], [v for _, v in points]
    n_mean, v_mean = statistics.fmean(ns), statistics.fmean(values)
    spread = sum((n - n_mean) ** 2 for n in ns)
    slope = sum((n - n_mean) * (v - v_mean) for n, v in zip(ns, values)) / spread if spread else 0.0
    return v_mean - slope * n_mean, slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,4,8,16,32,64")
    parser.add_argument("--layouts", default="one,two")
    parser.add_argument("--backends", default="hpccomm,gloo")
    parser.add_argument("--ft", action="store_true", help="hpccomm in fault-tolerant mode (one node)")
    parser.add_argument("--json", default=None, help="also write every rank's fields here")
    args = parser.parse_args()
    if args.ft and args.layouts != "one":
        parser.error("--ft runs on one node only: give --layouts one")
    sizes = [int(part) for part in args.ranks.split(",")]
    everything: dict[str, dict[int, list[dict[str, float]]]] = {}
    columns = ("mpi start s", "init s", "new_group s", "store ops init/group", "served", "goodbye recvs/sends",
               "goodbye bytes", "check us", "raw probe us", "rss MiB", "fds", "threads")
    if args.ft:
        columns += ("stop recvs", "stop look us")
    for layout in args.layouts.split(","):
        for backend in args.backends.split(","):
            key = f"{backend}{' ft' if args.ft and backend == 'hpccomm' else ''} {layout}"
            everything[key] = {}
            print(f"\n{backend}, {layout} node{'s' if layout == 'two' else ''}")
            print("| ranks | " + " | ".join(columns) + " |")
            print("|---" * (len(columns) + 1) + "|")
            for n in sizes:
                ranks = job(n, layout, backend, args.ft and backend == "hpccomm")
                if not ranks:
                    continue
                everything[key][n] = ranks
                most = {name: max(r[name] for r in ranks) for name in ranks[0] if name != "served"}
                served = next(r["served"] for r in ranks if "served" in r)
                median = {name: statistics.median(r.get(name, 0.0) for r in ranks)
                          for name in ("departed_us", "probe_us", "rss_mib", "stop_look_us")}
                stops = (f" {most.get('stop_receives', 0):.0f} | {median['stop_look_us']:.2f} |"
                         if args.ft else "")
                print(f"| {n} | {most['mpi_start_s']:.2f} | {most['init_s']:.3f} | {most['group_s']:.3f} | "
                      f"{most['init_store_ops']:.0f}/{most['group_store_ops']:.0f} | {served:.0f} | "
                      f"{most['goodbye_receives']:.0f}/{most['goodbye_sends']:.0f} | "
                      f"{most.get('goodbye_bytes', 0):.0f} | {median['departed_us']:.2f} | {median['probe_us']:.2f} | "
                      f"{median['rss_mib']:.1f} | {most['fds']:.0f} | {most['threads']:.0f} |{stops}", flush=True)
    print("\nfits a + b N over the sizes run, and their value at " + ", ".join(map(str, PREDICT_AT)) + " ranks")
    print("| layout | quantity | a | b | " + " | ".join(f"N={n}" for n in PREDICT_AT) + " |")
    print("|---" * (4 + len(PREDICT_AT)) + "|")
    for layout, by_n in everything.items():
        quantities = [("rss_mib", "memory added, MiB", statistics.median), ("fds", "file descriptors", max)]
        if layout.startswith("hpccomm"):
            quantities += [("departed_us", "fail-fast check, CPU us", statistics.median),
                           ("probe_us", "raw MPI probe, CPU us", statistics.median),
                           ("goodbye_receives", "pending receives", max)]
        if args.ft and layout.startswith("hpccomm"):
            quantities += [("stop_receives", "stop receives posted", max),
                           ("stop_look_us", "look for stops, CPU us", statistics.median)]
        for key, name, pick in quantities:
            points = [(n, pick(r[key] for r in ranks)) for n, ranks in by_n.items()]
            if len(points) < 2:
                continue
            a, b = fit(points)
            print(f"| {layout} | {name} | {a:.3g} | {b:.3g} | " + " | ".join(f"{a + b * n:.4g}" for n in PREDICT_AT)
                  + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1))


if __name__ == "__main__":
    main()
