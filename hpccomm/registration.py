"""Registration: make ``"hpccomm"`` a torch.distributed backend.

:func:`register` runs on ``import hpccomm`` and from the
``torch.distributed.backends`` entry point. It is cheap and starts nothing:
MPI starts when the first group is created.

Which shell a group takes is decided here, once, by what the installed torch
offers (:data:`BACKEND_SHAPE`): where Python can subclass torch's ``Backend``
(torch >= 2.14) a group is an :class:`~hpccomm.backend.HpccommBackend` that
torch's ProcessGroup wraps; elsewhere it is a
:class:`~hpccomm.process_group.ProcessGroupHpccomm`. Both run the same
:class:`~hpccomm.front.Front`.

Each group gets its own MPI communicator. The world group duplicates
``MPI_COMM_WORLD`` (so user MPI traffic never mixes with ours); a subgroup
is carved out of it with ``MPI_Comm_create_group``, which only the members
call, matching torch, which only calls the backend on members.
"""

from __future__ import annotations

import zlib
from datetime import timedelta
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from . import debug, progress, rendezvous, torch_gaps, world
from .config import cuda_staged_limits, settings
from .front import BACKEND_NAME, Front
from .monitor import Monitor
from .topology import group_cuda_device
from .transports import Transport, device_routes
from .transports.topology_aware import cpu_transport

_registered = False
_world_comm: Any = None


def _backend_is_subclassable() -> bool:
    """Whether Python may subclass torch's ``Backend`` (torch >= 2.14; 2.13 has no constructor for it)."""
    from torch._C._distributed_c10d import Backend

    class Probe(Backend):
        pass

    try:
        Probe(0, 1)
    except TypeError:
        return False
    return True


#: True: each group is a Backend that torch's ProcessGroup wraps; False: each group is a ProcessGroup.
BACKEND_SHAPE: bool = _backend_is_subclassable()


def register() -> None:
    """Register the hpccomm backend with torch.distributed (idempotent)."""
    global _registered
    if _registered:
        return
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        # Only devices a transport carries: torch >= 2.14 wraps hpccomm for each one it is registered for.
        dist.Backend.register_backend(BACKEND_NAME, _create_group, extended_api=True, devices=device_routes.devices())
    world.before_start(device_routes.load_ucc_first)
    rendezvous.install()
    if settings.ft and settings.ft_spares:
        from .fault_tolerance import spares

        spares.install()
    if BACKEND_SHAPE:
        torch_gaps.mend()
    _register_dist2()
    _registered = True


def _register_dist2() -> None:
    """Register with ``torch.distributed._dist2`` (torch 2.11-2.13; its API moved onto ProcessGroup in 2.14)."""
    try:
        from torch.distributed import _dist2
    except ImportError:
        return
    if BACKEND_NAME not in _dist2._BACKENDS:
        _dist2.register_backend(BACKEND_NAME, _dist2_factory)


def _dist2_factory(
    store: dist.Store, rank: int, world_size: int, timeout: timedelta, device: torch.device, **kwargs: object
) -> Front:
    if kwargs:
        raise ValueError(f"hpccomm: unexpected options {sorted(kwargs)}")
    rendezvous.check_user_identity(rank, world_size, world.identity())
    progress.engine().before_blocking_call()  # the calls below block in MPI
    return _build(_world_communicator(fresh=False).Dup(), list(range(world_size)), timeout)


def _create_group(opts: Any, _backend_options: Any = None) -> Front | None:
    """torch's extended-API creator, called on the members of each new group.

    torch >= 2.14 passes ``split_from``, the default group's backend, when the
    default group has a bound device: the new group is then split from it
    (torch calls ``perform_nocolor_split`` on the other ranks).
    """
    ident = world.identity()
    ranks = list(opts.global_ranks_in_group)
    parent = getattr(opts, "split_from", None)
    if isinstance(parent, Front) and ranks:
        options = parent.options
        options._timeout = opts.timeout
        return parent.split(opts.store, ranks, options)
    if not dist.is_initialized():
        # The default group: a store passed by the user carries its own rank and size.
        rendezvous.check_user_identity(opts.group_rank, opts.group_size, ident)
        if settings.ft:
            _check_fault_tolerance()
            if settings.ft_spares:
                return _build_world_checked(opts.timeout)
        return _build_world(world.members().Dup(), opts.timeout)
    progress.engine().before_blocking_call()  # the calls below block in MPI
    if not ranks or ranks == list(range(ident.world_size)):
        return _build(_world_communicator(fresh=False).Dup(), list(range(ident.world_size)), opts.timeout)
    MPI = world.mpi()
    parent = _world_communicator(fresh=False)
    members = parent.Get_group().Incl(ranks)
    # The tag must be equal on all members; the group name torch assigns is.
    tag = zlib.crc32(str(opts.group_id).encode()) % 32768
    try:
        comm = parent.Create_group(members, tag)
    finally:
        members.Free()
    if comm == MPI.COMM_NULL:
        raise RuntimeError(f"hpccomm new_group: rank {ident.rank} is not in ranks {ranks}")
    return _build(comm, ranks, opts.timeout)


def _check_fault_tolerance() -> None:
    """Refuse fault-tolerant mode, before any group exists, where it cannot work."""
    from .fault_tolerance import check_available

    if not BACKEND_SHAPE:
        raise RuntimeError(
            f"hpccomm: HPCCOMM_FT=1 needs torch >= 2.14, where hpccomm's groups are torch Backends, whose shrink "
            f"dist.shrink_group calls; this is torch {torch.__version__}"
        )
    if "ucc" in device_routes.routes().values():
        raise RuntimeError("hpccomm: HPCCOMM_FT=1 runs on MPI only; unset HPCCOMM_TRANSPORT=ucc")
    check_available(world.mpi().Get_library_version())


def _world_communicator(fresh: bool) -> Any:
    """hpccomm's duplicate of the world's communicator (:func:`hpccomm.world.members`); a new one for each default group."""
    if fresh or _world_comm is None:
        comm = world.members().Dup()
        _keep_world(comm)
        return comm
    return _world_comm


def _keep_world(comm: Any) -> None:
    """Keep a duplicate of the default group's ``comm``: the parent of the groups made from it. Collective."""
    global _world_comm
    if _world_comm is not None:
        _world_comm.Free()  # the previous default group's; its subgroups own their comms
    _world_comm = comm.Dup()


def _build_world(comm: Any, timeout: timedelta) -> Front:
    """The default group on ``comm``, a duplicate of the world's communicator that it owns. Collective.

    The same steps on every rank, whether the job starts, or a spare takes a
    dead rank's place while the survivors rebuild their group
    (:mod:`hpccomm.fault_tolerance.spares`).
    """
    _keep_world(comm)
    return _build(comm, list(range(comm.Get_size())), timeout, world_group=True)


def _build_world_checked(timeout: timedelta) -> Front:
    """The default group where spares are held back: checked like the survivors' repaired group. Collective.

    A replacement builds it as the survivors rebuild theirs, and a rank that
    dies meanwhile sends them all back to the spares together
    (:func:`hpccomm.fault_tolerance.spares.build_checked`).
    """
    from .fault_tolerance import spares

    if not spares.is_replacement():
        return _build_world(world.members().Dup(), timeout)
    group = spares.build_checked(
        world.members(), lambda comm: _build_world(comm.Dup(), timeout),
        lambda comm: _build_shrunk_world(comm, timeout),
    )
    if group is None:  # no place is left for this process: the survivors shrink the group without it
        spares.leave_unneeded()
    return group


def _build_shrunk_world(comm: Any, timeout: timedelta) -> Front:
    """The survivors' default group, after a shrink or a repair of the default group (fault-tolerant mode).

    The processes of ``comm`` become hpccomm's world (:func:`hpccomm.world.rebase`),
    numbered as torch numbers the new default group, so that groups made
    from then on, ``hpccomm.identity()`` and ``hpccomm.topology()`` follow.
    """
    world.rebase(comm)
    return _build_world(comm.Dup(), timeout)


def _build(comm: Any, global_ranks: Sequence[int], timeout: timedelta, world_group: bool = False) -> Front:
    """The group on MPI communicator ``comm`` (which it owns), in the shell this torch takes.

    ``world_group``: the default group, whose shrink makes the survivors the world.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    checks = comm.Dup() if settings.debug else None
    checker = debug.Checker(checks, timeout.total_seconds()) if checks is not None else None
    monitored = comm.Dup()
    monitor = Monitor(monitored)
    splitter = comm.Dup() if BACKEND_SHAPE else None
    # Last: the UCC transport, when it is handed ``comm``, frees it once its team is created.
    transports = _transports_for(comm, list(global_ranks), timeout)
    recovery = None
    if settings.ft:
        from .fault_tolerance import protect

        # ``group`` is bound below, before any message needs it.
        own = [splitter, monitored, *([checks] if checks is not None else [])]
        recovery, transports = protect(comm, own, transports, lambda: group.describe())
    front = (rank, size, transports, timeout, global_ranks, monitor, checker)
    if BACKEND_SHAPE:
        from .backend import HpccommBackend

        group = HpccommBackend(
            *front, comm=splitter, make_child=_build, recovery=recovery,
            make_world=_build_shrunk_world if world_group else None,
        )
        return group
    from .process_group import ProcessGroupHpccomm

    return ProcessGroupHpccomm(*front)


def _transports_for(comm: Any, global_ranks: list[int], timeout: timedelta) -> dict[str, Transport]:
    """The transport serving each device type in the group on ``comm`` (``HPCCOMM_TRANSPORT``). Collective.

    Each transport owns the communicator it is given; the CPU transport gets ``comm`` itself.
    """
    routes = device_routes.routes()
    built: dict[str, Transport] = {}
    if routes.get("cpu") == "mpi":
        built["cpu"] = cpu_transport(comm, global_ranks)
    if "cuda" in routes:
        # Before UCC on host memory, which frees ``comm`` once its team is made.
        built["cuda"] = _cuda_transport(comm.Dup(), global_ranks, timeout, routes["cuda"])
    if routes.get("cpu") == "ucc":
        from .transports.ucc import UCCTransport  # loads UCC: only where it is used

        built["cpu"] = UCCTransport.for_group(comm, global_ranks, timeout.total_seconds())
    return built


def _cuda_transport(comm: Any, global_ranks: list[int], timeout: timedelta, route: str) -> Transport:
    """CUDA tensors through host memory (``staged``), or on device memory (``ucc``, ``mpi``) with small ones staged.

    Collective. The CPU half of the staged path has a communicator of its own: its posts
    follow the device operations' order, not that of the group's CPU operations.
    """
    from .transports.device_ops import cuda_ops
    from .transports.host_staged import HostStagedTransport

    device = group_cuda_device()  # fixed before UCC's team (and context) is made
    ops = cuda_ops(device)
    on_device = comm.Dup() if route != "staged" else None
    staged = HostStagedTransport(cpu_transport(comm, global_ranks), ops)
    limit = cuda_staged_limits()
    if route == "mpi":
        from .transports import mpi_cuda

        return mpi_cuda.cuda_transport(on_device, staged, ops, device, limit)
    if route == "ucc":
        from .transports import ucc_cuda

        return ucc_cuda.cuda_transport(
            on_device, global_ranks, timeout.total_seconds(), staged, ops, device, limit, settings.ucc_triggered,
            settings.ucc_in_place,
        )
    return staged
