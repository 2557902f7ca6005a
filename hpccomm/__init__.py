"""hpccomm: a torch.distributed backend for HPC clusters, on MPI.

Usage, under ``mpirun``, ``srun`` or ``hpccomm-run``::

    import hpccomm  # registers the "hpccomm" backend
    import torch.distributed as dist

    dist.init_process_group("hpccomm")  # rank and world size come from MPI

CPU tensors travel through mpi4py. See the README for the feature table,
configuration and limits.
"""

from __future__ import annotations

from hpccomm_run import apply_mpi_library_defaults

from .monitor import MonitoredBarrierError, monitored_barrier
from .registration import register
from .world import Identity, identity

__all__ = ["Identity", "MonitoredBarrierError", "identity", "monitored_barrier", "register", "__version__"]
__version__ = "0.1.0"

apply_mpi_library_defaults()
register()
