"""What the tools report about the installation and the job: versions, MPI, active paths, knobs, layout.

Shared by ``python -m hpccomm info``, which prints it, and ``python -m hpccomm
bench --json``, which stores it with the results. Every function gathers one
concern and returns plain data (str, numbers, lists, dicts), so each can be
printed, stored as JSON or extended on its own; :func:`layout` is collective
(every rank calls it), the others are local.
"""

from __future__ import annotations

import os
import platform
import shlex
import socket
from dataclasses import fields
from typing import Any

import torch

from .. import __version__, world
from ..config import Config, cuda_staged_limits, settings

#: CPU flags (as /proc/cpuinfo names them) each 16-bit kernel path relies on.
HALF_PATH_FEATURES = {
    "torch": (),
    "avx2": ("avx2", "f16c"),
    "avx512": ("avx512f",),
    "avx512bf16": ("avx512f", "avx512bw", "avx512dq", "avx512_bf16"),
}
#: HPCCOMM_* variables read outside hpccomm/config.py, and by what (slurm/*.sbatch: the job templates).
OTHER_KNOBS = {
    "HPCCOMM_SRUN_MPI": "read by hpccomm-run and the srun templates",
    "HPCCOMM_VENV": "read by the Slurm templates",
    "HPCCOMM_SCRIPT": "read by the Slurm templates",
    "HPCCOMM_SCRIPT_ARGS": "read by the Slurm templates",
    "HPCCOMM_MPIRUN": "read by slurm/mpirun.sbatch",
    "HPCCOMM_MPIRUN_ARGS": "read by slurm/mpirun.sbatch",
    "HPCCOMM_GPUS_PER_TASK": "read by slurm/multi_node_gpu.sbatch",
}
_THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")


def versions() -> dict[str, str]:
    """Versions of hpccomm and the libraries it runs on."""
    import mpi4py
    import numpy

    return {
        "hpccomm": __version__,
        "torch": torch.__version__,
        "mpi4py": mpi4py.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def mpi_library() -> dict[str, Any]:
    """The MPI library mpi4py loaded (MPI must be started) and the thread level it granted."""
    MPI = world.mpi()
    ident = world.identity()
    major, minor = MPI.Get_version()
    provided = ident.thread_level
    return {
        # Open MPI 5 ends the text with its C string's NUL, which made `info | grep` see a binary file.
        "library": MPI.Get_library_version().replace("\0", "").strip().splitlines()[0],
        "standard": f"{major}.{minor}",
        "thread_level": _THREAD_LEVELS[provided] if 0 <= provided < len(_THREAD_LEVELS) else str(provided),
        "thread_level_requested": "multiple",
    }


def cpu() -> dict[str, Any]:
    """This node's CPU: model, logical CPUs, those this process may run on, and its vector flags."""
    model, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    wanted = sorted({flag for needed in HALF_PATH_FEATURES.values() for flag in needed})
    return {
        "model": model,
        "logical_cpus": os.cpu_count() or 0,
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0,
        "vector_flags": [flag for flag in wanted if flag in flags],
    }


def shared_memory() -> dict[str, Any]:
    """The node-local shared-memory all-reduce engine: built, and the settings that enable it."""
    from ..transports import shm

    built = shm._engine is not None
    enabled = built and settings.shm_slot_bytes > 0 and settings.algo != "flat"
    if not built:
        why = "not built (no C compiler at install time)"
    elif settings.shm_slot_bytes <= 0:
        why = "turned off (HPCCOMM_SHM_SLOT_BYTES=0)"
    elif not enabled:
        why = "not used (HPCCOMM_ALGO=flat)"
    else:
        why = "collectives of groups whose ranks share a node; node-local stages across nodes"
    cache_bytes, cpus_sharing = shm.last_level_cache()
    return {
        "built": built,
        "enabled": enabled,
        "detail": why,
        "min_bytes": settings.shm_min_bytes,
        "slot_bytes": settings.shm_slot_bytes,
        "last_level_cache_bytes": cache_bytes,
        "cpus_sharing_cache": cpus_sharing,
        "stream_min_bytes": settings.shm_stream_min_bytes,
    }


def half_kernels() -> dict[str, Any]:
    """What reduces bfloat16 and float16 inside MPI here, and the CPU features that path uses."""
    from ..transports import half_reduce

    paths = {}
    for dtype in half_reduce.HALF_DTYPES:
        chosen = half_reduce.path(dtype)
        paths[str(dtype).removeprefix("torch.")] = {
            "path": chosen,
            "cpu_features": list(HALF_PATH_FEATURES[chosen]),
            "available": list(half_reduce.available_paths(dtype)),
        }
    return {
        "compiled": half_reduce.compiled_available(),
        "native_mpi_op": half_reduce.native_ops_available(),
        "setting": settings.half_kernels,
        "dtypes": paths,
    }


def ucc() -> dict[str, Any]:
    """The UCC binding: its version and library, or why it is absent (:func:`hpccomm.ucc.status`)."""
    from .. import ucc as ucc_package

    found = ucc_package.status()
    if not found.available:
        return {"available": False, "detail": found.reason, "version": None}
    return {"available": True, "detail": f"{found.library} (UCX: {found.ucx})", "version": found.version}


def transports() -> dict[str, Any]:
    """Which transport ``HPCCOMM_TRANSPORT`` asks for per device, and the topology-aware setting."""
    return {"requested": dict(settings.transports), "algo": settings.algo}


def cuda() -> dict[str, Any]:
    """Whether torch sees CUDA devices, and the transport hpccomm routes CUDA tensors to."""
    if torch.version.cuda is None:
        return {"available": False, "detail": "torch built without CUDA", "devices": [], "route": None}
    if not torch.cuda.is_available():
        return {"available": False, "detail": f"CUDA {torch.version.cuda} build, no device visible", "devices": [],
                "route": None}
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"available": True, "detail": f"CUDA {torch.version.cuda}", "devices": names, "route": _cuda_route()}


def _cuda_route() -> str:
    """The transport serving CUDA tensors in this process and how (the start-up log's words), or why none does."""
    from ..transports import device_routes

    try:
        route = device_routes.describe("cuda")
    except RuntimeError as exc:  # HPCCOMM_TRANSPORT names a transport this installation lacks
        return f"none: {exc}"
    return route or "none (HPCCOMM_TRANSPORT routes it nowhere)"


#: Config fields whose variable is not HPCCOMM_<FIELD>.
_VARIABLE_OF_FIELD = {"transports": "HPCCOMM_TRANSPORT"}


def knobs() -> list[dict[str, str]]:
    """Every hpccomm setting: each Config field with its value and whether the environment set it,
    then any other ``HPCCOMM_*`` variable present (flagged if hpccomm does not read it)."""
    rows = []
    known = set()
    for item in fields(Config):
        variable = _VARIABLE_OF_FIELD.get(item.name, f"HPCCOMM_{item.name.upper()}")
        known.add(variable)
        value = getattr(settings, item.name)
        if item.name == "transports":
            value = ",".join(f"{device}:{name}" for device, name in value)
        elif item.name == "cuda_staged_max_bytes" and value is None:
            value = "per collective: " + ",".join(
                f"{op}={'all' if limit is None else limit}" for op, limit in cuda_staged_limits().items()
            )
        source = "environment" if os.environ.get(variable, "") != "" else "default"
        rows.append({"variable": variable, "value": str(value), "source": source})
    for variable in sorted(os.environ):
        if variable.startswith("HPCCOMM_") and variable not in known:
            source = OTHER_KNOBS.get(variable, "not read by hpccomm (misspelt?)")
            rows.append({"variable": variable, "value": os.environ[variable], "source": source})
    return rows


def launcher_in_use() -> str:
    """The launcher that started this process, from the variables it sets."""
    env = os.environ
    if "OMPI_COMM_WORLD_SIZE" in env:
        return "Open MPI mpirun/prterun"
    # Intel MPI's mpiexec is a build of MPICH's hydra; it alone sets this (checked: 2021.18.1).
    if "I_MPI_HYDRA_UUID" in env and "PMI_RANK" in env:
        return "Intel MPI hydra mpiexec"
    if "HYDI_CONTROL_FD" in env or ("PMI_RANK" in env and "PMI_SIZE" in env and "SLURM_STEP_ID" not in env):
        return "MPICH hydra mpiexec"
    if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env:
        return f"srun (Slurm job {env.get('SLURM_JOB_ID', '?')}, step {env['SLURM_STEP_ID']})"
    if "PMIX_RANK" in env:
        return "a PMIx launcher"
    return "none (a world of one)"


def launch_command(nprocs: int = 2) -> dict[str, Any]:
    """What ``hpccomm-run -n NPROCS python train.py`` would run here, the variables it adds, and its warnings."""
    import hpccomm_run

    try:
        launch = hpccomm_run.build_launch(nprocs, ["python", "train.py"], dict(os.environ))
    except SystemExit as exc:  # no mpiexec found
        return {"command": None, "launcher": None, "detail": str(exc), "adds": {}, "warnings": []}
    return {
        "command": shlex.join(launch.command),
        "launcher": launch.launcher,
        "detail": "",
        "adds": {setting.name: setting.value for setting in launch.settings},
        "warnings": launch.warnings,
    }


def layout(comm: Any) -> list[dict[str, Any]]:
    """Where every rank runs, gathered to all ranks. Collective over ``comm``.

    Returns:
        one entry per rank: rank, host, local rank and size, pid and the CPUs it may use.
    """
    ident = world.identity()
    mine = {
        "rank": comm.Get_rank(),
        "host": socket.gethostname(),
        "local_rank": ident.local_rank,
        "local_size": ident.local_world_size,
        "pid": os.getpid(),
        "cpus": _cpu_list(),
    }
    return comm.allgather(mine)


def nodes(ranks: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """``layout()``'s entries grouped by host, in rank order."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for entry in sorted(ranks, key=lambda e: e["rank"]):
        grouped.setdefault(entry["host"], []).append(entry)
    return grouped


def _cpu_list() -> str:
    """The CPUs this process may run on, as ranges ('0-1')."""
    if not hasattr(os, "sched_getaffinity"):
        return "?"
    cpus = sorted(os.sched_getaffinity(0))
    spans, start = [], None
    for i, cpu_id in enumerate(cpus):
        if start is None:
            start = cpu_id
        if i + 1 == len(cpus) or cpus[i + 1] != cpu_id + 1:
            spans.append(f"{start}-{cpu_id}" if cpu_id != start else str(start))
            start = None
    return ",".join(spans)


def describe(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything above as one JSON-ready record, with :func:`layout`'s ``ranks`` (gathered by the caller)."""
    return {
        "versions": versions(),
        "mpi": mpi_library(),
        "cpu": cpu(),
        "shared_memory": shared_memory(),
        "half_kernels": half_kernels(),
        "ucc": ucc(),
        "transports": transports(),
        "cuda": cuda(),
        "knobs": knobs(),
        "launcher": launcher_in_use(),
        "world_size": len(ranks),
        "nodes": {host: [e["rank"] for e in entries] for host, entries in nodes(ranks).items()},
        "ranks": ranks,
    }
