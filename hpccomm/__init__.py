"""hpccomm: a torch.distributed backend for HPC clusters, on MPI.

Usage, under ``mpirun``, ``srun`` or ``hpccomm-run``::

    import hpccomm  # registers the "hpccomm" backend
    import torch.distributed as dist

    dist.init_process_group("hpccomm")  # rank and world size come from MPI

CPU tensors travel through mpi4py, and through shared memory between ranks
of one node. :func:`topology` tells where the ranks of a group run;
:func:`init_device_mesh` builds the (node, local) mesh for HSDP. See the
README for the feature table, configuration and limits.
"""

from __future__ import annotations

from hpccomm_run import apply_mpi_library_defaults

from .registration import register
from .topology import Topology, init_device_mesh, leaders_group, node_group, topology
from .world import Identity, identity

__all__ = [
    "Identity",
    "Topology",
    "identity",
    "init_device_mesh",
    "leaders_group",
    "node_group",
    "register",
    "topology",
    "__version__",
]
__version__ = "0.1.0"

apply_mpi_library_defaults()
register()
