"""The MPI library under test and its launchers, asked without hpccomm_run (the code under test).

The library is whichever mpi4py loads in this environment: an MPI wheel, or a
system MPI mpi4py was built against. Launchers are told apart by their own
``--version`` text.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys

_LIBRARY_VERSION = (
    "import mpi4py; mpi4py.rc.initialize = False\n"
    "from mpi4py import MPI; print(MPI.Get_library_version())"
)


@functools.lru_cache(maxsize=1)
def library_version() -> str:
    """``MPI_Get_library_version`` of the library mpi4py loads (MPI not started)."""
    return subprocess.run(
        [sys.executable, "-c", _LIBRARY_VERSION], capture_output=True, text=True, timeout=60, check=True
    ).stdout


def family() -> str:
    """'openmpi' or 'mpich' (MPICH and its derivatives)."""
    text = library_version()
    if "Open MPI" in text:
        return "openmpi"
    if any(name in text for name in ("MPICH", "Intel(R) MPI", "MVAPICH")):
        return "mpich"
    raise AssertionError(f"unknown MPI library in {sys.prefix}: {text[:200]!r}")


def is_intel() -> bool:
    """Whether the library is Intel MPI (of the 'mpich' family here: its launcher is a build of MPICH's hydra)."""
    return "Intel(R) MPI" in library_version()


def release() -> str:
    """The library's version, e.g. '4.1.4' ('2021.18.1' for Intel MPI)."""
    pattern = r"(?:Open MPI v|Version:?\s*|Intel\(R\) MPI Library )(\d+\.\d+(?:\.\d+)?)"
    match = re.search(pattern, library_version())
    assert match, library_version()
    return match.group(1)


def launcher_runs_library(path: str) -> bool:
    """True when the launcher at ``path`` belongs to the library under test, by its ``--version``."""
    text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    if family() == "mpich":
        return "HYDRA" in text or "Intel(R) MPI" in text
    match = re.search(r"\((?:Open MPI|OpenRTE|PRRTE)\) (\d+)\.", text)
    return bool(match) and match.group(1) == release().split(".")[0]


def other_mpi_launcher() -> str | None:
    """A launcher on this machine that belongs to another MPI than the one under test, if any."""
    names = ("mpiexec", "mpiexec.openmpi", "mpiexec.mpich", "mpiexec.hydra")
    for path in filter(None, map(shutil.which, names)):
        if not launcher_runs_library(path):
            return path
    return None


def ompi_info() -> str:
    """Open MPI's ompi_info of the library under test (the wheel's, else the one on PATH)."""
    own = os.path.join(sys.prefix, "bin", "ompi_info")
    found = own if os.access(own, os.X_OK) else shutil.which("ompi_info")
    assert found, "Open MPI without ompi_info"
    return found


@functools.lru_cache(maxsize=None)
def ompi_info_lists(*args: str) -> str:
    """What ``ompi_info ARGS`` prints (asked once per ARGS)."""
    return subprocess.run([ompi_info(), *args], capture_output=True, text=True, timeout=60).stdout


def has_btl(name: str) -> bool:
    """Whether this Open MPI has the BTL (byte transfer layer) component ``name``."""
    return f"MCA btl: {name} " in ompi_info_lists()


def shared_memory_btl() -> str:
    """Open MPI's shared-memory BTL as this library names it: 'vader' (4.x) or 'sm' (5)."""
    names = [name for name in ("sm", "vader") if has_btl(name)]
    assert names, f"{ompi_info()} lists no shared-memory BTL"
    return names[0]


def openmpi_env() -> dict[str, str]:
    """What Open MPI needs to run across (fake or Slurm) nodes of this machine; empty for MPICH.

    Run as root (containers); TCP between nodes and shared memory within one,
    under the name this library lists ('vader' in 4.x, 'sm' in 5), which also
    skips Open MPI's slow probing of UCX and OFI (about 1 s per rank here).
    MPI's blocking waits yield the CPU (``mpi_yield_when_idle``): each fake or
    Slurm node offers its ranks as its slots, so Open MPI does not see that the
    ranks of all nodes share this machine's 2 cores, and its waits would poll
    without yielding, taking the cores from the ranks that are still importing
    torch or working (a 16-rank job on two fake nodes: 183 s polling, 27 s
    yielding; benchmarks/scale_soak.py, whose --poll-idle turns it off).
    """
    if family() != "openmpi":
        return {}
    return {
        "OMPI_MCA_btl": f"self,{shared_memory_btl()},tcp",
        "OMPI_MCA_pml": "ob1",
        "OMPI_MCA_mpi_yield_when_idle": "1",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
