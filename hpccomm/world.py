"""The MPI world this process belongs to: start-up, identity and topology.

MPI starts lazily, on the first call that needs it, so that ``import hpccomm``
(and torch's entry-point scan) stays cheap and side-effect free. From then on
MPI is the single source of truth for rank, world size, local rank and local
world size; they are exported as ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
``LOCAL_WORLD_SIZE`` for libraries that read the torchrun variables.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpi4py import MPI as _MPI


@dataclass(frozen=True)
class Identity:
    """Where this process sits in the job, as MPI reports it.

    Attributes:
        rank: rank in ``MPI_COMM_WORLD``.
        world_size: size of ``MPI_COMM_WORLD``.
        local_rank: rank among the processes on this node
            (``MPI_COMM_TYPE_SHARED``).
        local_world_size: number of processes on this node.
        num_nodes: number of nodes the job spans.
        thread_level: the MPI thread level actually provided.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    num_nodes: int
    thread_level: int

    @property
    def single_node(self) -> bool:
        """True when every rank runs on this node."""
        return self.num_nodes == 1


_lock = threading.Lock()
_identity: Identity | None = None


_MPI_MODULE: "_MPI | None" = None


def mpi() -> "_MPI":
    """Import and initialise mpi4py's MPI module (once) and return it."""
    if _MPI_MODULE is not None:
        return _MPI_MODULE
    return _import_mpi()


def _import_mpi() -> "_MPI":
    global _MPI_MODULE
    import sys

    _load_transports_first()

    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        # Async work is driven from a background thread while the caller's
        # thread may post more; that needs MPI_THREAD_MULTIPLE.
        mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI

    _MPI_MODULE = MPI
    return MPI


def _load_transports_first() -> None:
    """Load UCC, where a device is routed to it, before MPI loads its own UCX (see hpccomm.ucc.binding)."""
    from .transports import selection

    if selection.wants_ucc():
        from .transports import ucc
        from .ucc import UCCUnavailableError

        try:
            ucc.prepare()
        except UCCUnavailableError:
            pass  # building the first group says why, with the fix


def identity() -> Identity:
    """Start MPI if needed and return this process's :class:`Identity`."""
    global _identity
    if _identity is not None:
        return _identity
    with _lock:
        if _identity is None:
            _identity = _discover()
            _export_env(_identity)
            from . import failure

            failure.install(_identity.rank, _identity.world_size)
    return _identity


def _discover() -> Identity:
    MPI = mpi()
    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank)
    try:
        local_rank, local_size = node.rank, node.size
        leaders = world.allreduce(1 if local_rank == 0 else 0, op=MPI.SUM)
    finally:
        node.Free()
    return Identity(
        rank=world.rank,
        world_size=world.size,
        local_rank=local_rank,
        local_world_size=local_size,
        num_nodes=leaders,
        thread_level=MPI.Query_thread(),
    )


def _export_env(ident: Identity) -> None:
    os.environ["RANK"] = str(ident.rank)
    os.environ["WORLD_SIZE"] = str(ident.world_size)
    os.environ["LOCAL_RANK"] = str(ident.local_rank)
    os.environ["LOCAL_WORLD_SIZE"] = str(ident.local_world_size)


def has_thread_multiple() -> bool:
    """True when MPI lets several threads call it at once."""
    return identity().thread_level >= mpi().THREAD_MULTIPLE


def hostname() -> str:
    """This node's host name, as MPI peers would see it."""
    return socket.gethostname()
