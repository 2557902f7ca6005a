"""hpccomm: a torch.distributed backend for HPC clusters, on MPI.

Usage, under ``mpirun``, ``srun`` or ``hpccomm-run``::

    import hpccomm  # registers the "hpccomm" backend
    import torch.distributed as dist

    dist.init_process_group("hpccomm")  # rank and world size come from MPI

CPU tensors travel through mpi4py, and through shared memory between ranks
of one node. Importing starts nothing: MPI starts when first needed, with
settings chosen for the library mpi4py loads (see :mod:`hpccomm.world`).
:func:`topology` tells where the ranks of a group run; :func:`init_device_mesh`
builds the (node, local) mesh for HSDP. The exceptions name what ended an
operation: a timeout, a departed peer, a closed group, mismatched calls
(debug mode), a monitored barrier a rank missed, and, in fault-tolerant mode
(``hpccomm-run --ft``), ranks that died (:class:`PeerFailure`), whose places
spares can take (:func:`repair`, :class:`TrainingState`). The documentation
(``docs/``) has the feature table, configuration and limits.
"""

from __future__ import annotations

from .debug import CollectiveMismatchError
from .failure import PeerExitedError
from .fault_tolerance import PeerFailure, TrainingState, failed_ranks, is_replacement, repair
from .groups import monitored_barrier
from .monitor import MonitoredBarrierError
from .registration import register
from .topology import Topology, init_device_mesh, leaders_group, node_group, topology
from .work import CommTimeoutError, GroupClosedError
from .world import Identity, identity

__all__ = [
    "CollectiveMismatchError",
    "CommTimeoutError",
    "GroupClosedError",
    "Identity",
    "MonitoredBarrierError",
    "PeerExitedError",
    "PeerFailure",
    "Topology",
    "TrainingState",
    "failed_ranks",
    "identity",
    "init_device_mesh",
    "is_replacement",
    "leaders_group",
    "monitored_barrier",
    "node_group",
    "register",
    "repair",
    "topology",
    "__version__",
]
__version__ = "0.1.0"

register()
