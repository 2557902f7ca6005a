"""Register hpccomm when torch starts, in processes an MPI launcher started.

``init_process_group("hpccomm")`` reads rank and world size in its
rendezvous, before torch loads a backend's ``torch.distributed.backends``
entry point: without ``import hpccomm`` the rendezvous would be torch's plain
``env://`` ("RANK expected"). torch runs the ``torch.backends`` entry points
at the end of every ``import torch`` (its hook for out-of-tree extensions;
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns it off): this module's
:func:`autoload` is one. It imports hpccomm only where a launcher's
variables say MPI started the process, so other torch programs pay nothing,
and it never raises, since an error here would fail ``import torch``.

A top-level module, like the launcher, so that loading it imports nothing.
"""

from __future__ import annotations

import os
import warnings

#: Set in each rank by Open MPI (mpirun, hpccomm-run), MPICH's Hydra and PMIx (srun --mpi=pmix).
LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


def autoload() -> None:
    """Register the hpccomm backend if an MPI launcher started this process."""
    if not any(os.environ.get(name) for name in LAUNCHER_VARIABLES):
        return
    try:
        import hpccomm  # noqa: F401  (registers the backend and MPI's rendezvous)
    except Exception as exc:  # never fail torch's import
        warnings.warn(f"hpccomm: not registered at torch start-up ({type(exc).__name__}: {exc}); "
                      "add `import hpccomm` to see the error", stacklevel=1)
