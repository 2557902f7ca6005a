"""The shared-memory files MPI libraries leave in /dev/shm when their ranks are killed, found and removed.

Open MPI's shared-memory transport (``sm_segment.<host>.<uid>.<job>.<rank>``,
``vader_segment.*`` before Open MPI 5) and MPICH's (``mpich_shm_*``) remove
their files at MPI_Finalize; a rank killed before then (SIGKILL, MPI_Abort,
a fault-tolerant job's victims) leaves them on tmpfs, that is, in memory,
for good (Open MPI's are 16 MiB each). Many tests kill ranks on purpose, so conftest.py removes,
after each test, the files of these names that appeared during it and that no
live process holds open or mapped (an MPI job of someone else's, started
meanwhile, keeps its own). hpccomm's own segments are not among them: its
tests assert that none is left (tests/ranks/segments.py).
"""

from __future__ import annotations

import os
import re

SHM_DIR = "/dev/shm"
#: File names of the MPI libraries' shared-memory transports.
MPI_SHM_NAME = re.compile(r"^(sm_segment\.|vader_segment\.|mpich_shm_)")


def mpi_files(directory: str = SHM_DIR) -> set[str]:
    """The names in ``directory`` that an MPI library's shared-memory transport makes."""
    try:
        return {name for name in os.listdir(directory) if MPI_SHM_NAME.match(name)}
    except OSError:
        return set()


def in_use(paths: set[str]) -> set[str]:
    """Those of ``paths`` some live process has open or mapped (from every readable /proc/PID/fd and maps)."""
    used: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target in paths:
                    used.add(target)
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    path = line.rstrip("\n").split(maxsplit=5)[-1]
                    if path.endswith(" (deleted)"):
                        continue
                    if path in paths:
                        used.add(path)
        except OSError:
            continue  # ended meanwhile, or not ours to read
    return used


def remove_left(before: set[str], directory: str = SHM_DIR) -> list[str]:
    """Remove the MPI files that appeared since ``before`` (a :func:`mpi_files`) and no process uses; their names."""
    new = {os.path.join(directory, name) for name in mpi_files(directory) - before}
    if not new:
        return []
    removed = []
    for path in sorted(new - in_use(new)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append(os.path.basename(path))
    return removed
