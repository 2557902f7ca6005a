"""Rendezvous from MPI: ``init_process_group`` with no MASTER_ADDR or store.

torch's default ``env://`` rendezvous needs RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT, and its TCPStore server listens on every interface. Under an MPI
launcher all of that is already known, so hpccomm wraps the ``env://`` handler:

* If the user set MASTER_ADDR and MASTER_PORT, torch's own handler runs (the
  user's choice is honoured), with RANK and WORLD_SIZE taken from MPI.
* Otherwise rank and world size come from MPI and the store is private to the
  job and found without a host name: served over MPI by a thread of rank 0
  (:class:`hpccomm.store.MPIStore`), so nothing listens on the network and no
  node's name has to resolve. Where MPI lacks ``MPI_THREAD_MULTIPLE`` (or
  ``HPCCOMM_STORE`` says so) it is a :class:`~torch.distributed.FileStore` on
  a fresh 0600 file on one node, and a TCPStore on rank 0, on a port the
  kernel picks, across nodes.

The store lives as long as the process group that holds it; a rank that
aborts the job (:mod:`hpccomm.failure`) first removes the FileStore's file,
which no destructor would remove once the launcher ends the ranks. hpccomm's own
collectives never use it; it serves torch and any other backend (such as
gloo) created in the same job.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist
from torch.distributed.rendezvous import _rendezvous_handlers

from . import failure, world
from .config import settings
from .store import MPIStore

_installed = False


def install() -> None:
    """Wrap torch's ``env://`` rendezvous handler (idempotent)."""
    global _installed
    if _installed:
        return
    # register_rendezvous_handler refuses to replace a scheme, so the wrapper
    # goes into the handler table directly; it defers to the original handler
    # whenever the user configured a TCP rendezvous.
    _rendezvous_handlers["env"] = _wrap_env_handler(_rendezvous_handlers["env"])
    _installed = True


def _wrap_env_handler(original: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    def handler(url: str, timeout: timedelta = dist.default_pg_timeout, **kwargs: Any):
        ident = world.identity()
        query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
        check_user_identity(query.get("rank"), query.get("world_size"), ident)
        if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            return original(url, timeout=timeout, **kwargs)
        return _mpi_rendezvous(ident, timeout)

    return handler


def check_user_identity(rank: Any, world_size: Any, ident: world.Identity) -> None:
    """Raise ValueError if a user-supplied rank or world size disagrees with MPI.

    Args:
        rank: the rank the user passed, or None / -1 when not given.
        world_size: the world size the user passed, or None / -1.
        ident: what MPI reports.
    """
    if world_size is not None and int(world_size) not in (-1, ident.world_size):
        raise ValueError(
            f"hpccomm: world_size={int(world_size)} was passed but MPI reports a world "
            f"size of {ident.world_size}; drop the argument or launch "
            f"{int(world_size)} ranks"
        )
    if rank is not None and int(rank) not in (-1, ident.rank):
        raise ValueError(
            f"hpccomm: rank={int(rank)} was passed but MPI says this process is rank "
            f"{ident.rank}; drop the argument"
        )


def _mpi_rendezvous(ident: world.Identity, timeout: timedelta):
    store = _job_store(ident, timeout)
    yield (store, ident.rank, ident.world_size)
    raise RuntimeError("hpccomm: re-rendezvous is not supported; MPI fixes the job's membership")


def _job_store(ident: world.Identity, timeout: timedelta) -> dist.Store:
    kind = store_kind(ident)
    if kind == "mpi":
        return MPIStore(timeout)
    comm = world.members()
    if kind == "file":
        path = comm.bcast(_private_file() if ident.rank == 0 else None, root=0)
        # FileStore reopens its file on every operation, its destructor
        # included, and deletes it with the last user; so the file must stay
        # where it is until then (no directory to clean up after it). A rank
        # that aborts the job removes it: no rank's destructor runs after that.
        store = dist.FileStore(path, ident.world_size)
        store.set_timeout(timeout)
        failure.before_abort(functools.partial(Path(path).unlink, missing_ok=True))  # another rank may be first
        return store
    if ident.rank == 0:
        host = world.hostname()
        server = dist.TCPStore(host, 0, ident.world_size, True, timeout=timeout, wait_for_workers=False)
        address = (host, server.port)
    else:
        server, address = None, None
    host, port = comm.bcast(address, root=0)
    if server is not None:
        return server
    return dist.TCPStore(host, port, ident.world_size, False, timeout=timeout)


def store_kind(ident: world.Identity) -> str:
    """Which store the rendezvous makes: ``mpi``, ``file`` or ``tcp`` (``HPCCOMM_STORE``, else by the job).

    Raises:
        ValueError: the setting asks for what this job cannot have.
    """
    kind = settings.store
    if kind == "auto":
        if world.has_thread_multiple():
            return "mpi"
        return "file" if ident.single_node else "tcp"
    if kind == "mpi" and not world.has_thread_multiple():
        raise ValueError(
            "hpccomm: HPCCOMM_STORE=mpi needs MPI_THREAD_MULTIPLE, which this MPI does not provide; "
            "use HPCCOMM_STORE=tcp (or file, on one node)"
        )
    if kind == "file" and not ident.single_node:
        raise ValueError(f"hpccomm: HPCCOMM_STORE=file works on one node; this job spans {ident.num_nodes}")
    return kind


def _private_file() -> str:
    handle, path = tempfile.mkstemp(prefix="hpccomm-store-")  # mode 0600
    os.close(handle)
    return path

