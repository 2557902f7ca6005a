"""UCC (Unified Collective Communication) through cffi: library, context, team, requests.

The binding (``hpccomm._ucc``, built from ``cffi_build/`` where UCC was found
at install time) and a small object layer over it, usable without
torch.distributed::

    from mpi4py import MPI
    from hpccomm import ucc

    context = ucc.Context(MPI.COMM_WORLD, timeout_s=60)   # collective
    team = ucc.Team(context, MPI.COMM_WORLD, timeout_s=60)  # collective
    request = team.post(args)        # a filled ucc_coll_args_t (see ucc.binding.load().ffi)
    while not request.test():
        pass
    request.result()                 # raises UCCError on an error status
    team.destroy(); context.destroy(timeout_s=60); context.library.finalize()

Bootstrap goes through MPI (:mod:`hpccomm.ucc.oob`). :func:`status` says
whether UCC is available here and which one; hpccomm's UCC transport
(:mod:`hpccomm.transports.ucc`) is built on this package.
"""

from __future__ import annotations

from .binding import UCCStatus, UCCUnavailableError, load, status
from .context import Context
from .errors import UCCError
from .library import Library
from .request import Request
from .team import Team

__all__ = [
    "Context",
    "Library",
    "Request",
    "Team",
    "UCCError",
    "UCCStatus",
    "UCCUnavailableError",
    "load",
    "status",
]
