"""``python -m hpccomm info``: what this installation runs on and which paths are active.

Runs with or without a launcher (alone it is a world of one)::

    python -m hpccomm info
    hpccomm-run -n 4 python -m hpccomm info      # adds a topology table per node

Rank 0 prints, section by section: versions; the MPI library and the thread
level it granted; the active paths (shared-memory all-reduce engine, 16-bit
kernels and the CPU features they use, UCC, CUDA); the launcher that started
this process and the one ``hpccomm-run`` would use; where every rank runs, per
node; and every ``HPCCOMM_*`` setting in effect. Each section is one function
returning its lines, from :mod:`hpccomm.cli.environment`'s data, so a new
path (UCC, a richer topology) adds one function to :data:`SECTIONS`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .. import flight_recorder
from . import environment as env
from .table import Column, Table


def versions_section(_ranks: list[dict[str, Any]]) -> list[str]:
    """hpccomm, torch, mpi4py, numpy, Python and the OS."""
    return [f"{name:10s} {version}" for name, version in env.versions().items()]


def mpi_section(_ranks: list[dict[str, Any]]) -> list[str]:
    """The MPI library and thread level."""
    mpi = env.mpi_library()
    level = mpi["thread_level"]
    consequence = (
        "async work driven by the progress thread"
        if level == "multiple"
        else "no progress thread: async work progresses while the rank waits"
    )
    return [
        f"library       {mpi['library']}",
        f"standard      MPI {mpi['standard']}",
        f"thread level  {level} (asked for {mpi['thread_level_requested']}): {consequence}",
    ]


def paths_section(_ranks: list[dict[str, Any]]) -> list[str]:
    """Which code paths are active: shared memory, 16-bit kernels, UCC, CUDA."""
    shm, half, ucc, cuda, cpu = env.shared_memory(), env.half_kernels(), env.ucc(), env.cuda(), env.cpu()
    lines = [
        f"shared memory             {'on' if shm['enabled'] else 'off'}: {shm['detail']}"
        + (f"; {shm['slot_bytes']} B per rank's slot, from " if shm["enabled"] else "")
        + (("every collective's measured threshold" if shm["min_bytes"] is None else f"{shm['min_bytes']} B")
           if shm["enabled"] else ""),
        f"{'last-level cache':25s} {shm['last_level_cache_bytes']} B, shared by {shm['cpus_sharing_cache']} CPUs: "
        + "each rank's share of it caps the chunks in flight (a quarter), and results of at least "
        + ("that share" if shm["stream_min_bytes"] is None else f"{shm['stream_min_bytes']} B")
        + " per rank are streamed (non-temporal stores)",
        f"{'topology-aware paths':25s} HPCCOMM_ALGO={env.transports()['algo']}",
    ]
    for dtype, info in half["dtypes"].items():
        features = ", ".join(info["cpu_features"]) or "none"
        lines.append(
            f"{dtype + ' reduction':25s} {info['path']} (CPU features: {features}; available here: "
            f"{', '.join(info['available'])}; HPCCOMM_HALF_KERNELS={half['setting']})"
        )
    if not half["compiled"]:
        lines.append("16-bit kernels            not built (no C compiler at install time): torch reduces them")
    elif not half["native_mpi_op"]:
        lines.append("16-bit kernels            built, but MPI_Op_create not found: called through Python")
    lines.append(f"{'CPU':25s} {cpu['model']}; vector flags: {', '.join(cpu['vector_flags']) or 'none'}")
    version = f" {ucc['version']}" if ucc.get("version") else ""
    lines.append(f"{'UCC' + version:25s} {'available' if ucc['available'] else 'absent'}: {ucc['detail']}")
    devices = f": {', '.join(cuda['devices'])}" if cuda["devices"] else ""
    requested = ", ".join(f"{device}: {name}" for device, name in env.transports()["requested"].items())
    lines.append(f"{'HPCCOMM_TRANSPORT':25s} {requested} (auto: CPU tensors on MPI, CUDA tensors as the next line "
                 "says; ucc: host tensors on UCC too)")
    route = f"; route for CUDA tensors: {cuda['route']}" if cuda["route"] else "; no route for CUDA tensors"
    lines.append(f"{'CUDA':25s} {cuda['detail']}{devices}{route}")
    lines.append(f"{'flight recorder':25s} {flight_recorder.describe()}")
    return lines


def launcher_section(_ranks: list[dict[str, Any]]) -> list[str]:
    """The launcher of this process, and what ``hpccomm-run`` would run."""
    launch = env.launch_command(2)
    lines = [f"this process   started by {env.launcher_in_use()}"]
    if launch["command"] is None:
        lines.append(f"hpccomm-run    unusable: {launch['detail']}")
    else:
        lines.append(f"hpccomm-run    -n 2 python train.py  ->  {launch['command']}")
        lines.append(f"               launcher: {launch['launcher']}")
        for key, value in sorted(launch["adds"].items()):
            lines.append(f"               with {key}={value}")
    lines += [f"               {warning}" for warning in launch["warnings"]]
    return lines


def topology_section(ranks: list[dict[str, Any]]) -> list[str]:
    """One table per node: its ranks, their local ranks, pids and usable CPUs."""
    grouped = env.nodes(ranks)
    lines = [f"{len(ranks)} rank(s) on {len(grouped)} node(s)"]
    for host, entries in grouped.items():
        table = Table([Column("rank", width=4), Column("local rank", width=10), Column("pid", width=8),
                       Column("CPUs", width=10)], markdown=True)
        lines += ["", f"node {host} ({len(entries)} rank(s))", *table.header()]
        for e in entries:
            lines.append(table.row([str(e["rank"]), f"{e['local_rank']}/{e['local_size']}", str(e["pid"]), e["cpus"]]))
    return lines


def settings_section(_ranks: list[dict[str, Any]]) -> list[str]:
    """Every HPCCOMM_* setting in effect, and where its value comes from."""
    return [f"{row['variable']:26s} {row['value']:10s} ({row['source']})" for row in env.knobs()]


#: Sections in print order: (title, function of the gathered rank layout).
SECTIONS: list[tuple[str, Callable[[list[dict[str, Any]]], list[str]]]] = [
    ("versions", versions_section),
    ("MPI", mpi_section),
    ("paths", paths_section),
    ("launcher", launcher_section),
    ("topology", topology_section),
    ("settings", settings_section),
]


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m hpccomm info``."""
    parser = argparse.ArgumentParser(prog="python -m hpccomm info", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON record instead of text")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    from .. import world

    world.identity()  # starts MPI: a world of one without a launcher
    comm = world.mpi().COMM_WORLD
    ranks = env.layout(comm)
    if comm.Get_rank() != 0:
        return
    if args.json:
        record = env.describe(ranks)
        record["hpccomm_run"] = env.launch_command(2)
        print(json.dumps(record, indent=1))
        return
    for title, section in SECTIONS:
        print(f"== {title}")
        for line in section(ranks):
            print(f"  {line}" if line else "")
        print()
    sys.stdout.flush()
