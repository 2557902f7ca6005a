"""The MPI world this process belongs to: start-up, identity and node layout.

MPI starts lazily, on the first call that needs it, so that ``import hpccomm``
(and torch's entry-point scan) stays cheap and side-effect free. Starting it
takes three steps: the steps upper layers gave :func:`before_start` run
(hpccomm loads UCC there where a device is routed to it, so that MPI finds
UCC's UCX already loaded), mpi4py loads the library without initialising it,
hpccomm sets the library settings that apply to that library and version
(:func:`hpccomm_run.library_defaults`, and :func:`hpccomm_run.singleton_defaults`
where no launcher started the process; MPI reads them in ``MPI_Init``), then
calls ``MPI_Init_thread`` asking for ``MPI_THREAD_MULTIPLE``; hpccomm's control
communicator (:func:`control`) is made as the identity below is learnt. A program that
imported ``mpi4py.MPI`` before hpccomm started MPI keeps its own start. From then on
MPI is the single source of truth for rank, world size, local rank and local
world size (those of ``MPI_COMM_WORLD``, or of the survivors once a
fault-tolerant job has shrunk its default group: :func:`rebase`); they are
exported as ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
``LOCAL_WORLD_SIZE`` for libraries that read the torchrun variables, and
given to the steps registered with :func:`on_identity` (fail-fast's arming,
:mod:`hpccomm.failure`). This module imports none of hpccomm's upper layers:
they register with it. The node
of every world rank (:class:`WorldNodes`) is learnt at the same time, so any
group's layout follows without communicating (:mod:`hpccomm.topology`).
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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


@dataclass(frozen=True)
class WorldNodes:
    """Which node each world rank runs on.

    Attributes:
        node_of: the node index of each world rank; nodes are numbered in the
            order of their lowest world rank. A node is what MPI calls a
            shared-memory domain (``MPI_COMM_TYPE_SHARED``).
        hosts: the host name of each node.
    """

    node_of: tuple[int, ...]
    hosts: tuple[str, ...]


_lock = threading.Lock()
_identity: Identity | None = None
_nodes: WorldNodes | None = None
_control: Any = None

#: Tags on :func:`control`, one for each kind of message: fail-fast's goodbyes (:mod:`hpccomm.failure`), the
#: operations sent to the job's store (:mod:`hpccomm.store`), which answers each on a tag of its own, from
#: STORE_ANSWER_TAG up, and the word that a rank has written its flight record (:mod:`hpccomm.flight_recorder`)
#: for a failing rank that asked for it.
GOODBYE_TAG = 1
STORE_OPERATION_TAG = 2
RECORDED_TAG = 3
STORE_ANSWER_TAG = 4


_MPI_MODULE: "_MPI | None" = None


def mpi() -> "_MPI":
    """Import and initialise mpi4py's MPI module (once) and return it."""
    if _MPI_MODULE is not None:
        return _MPI_MODULE
    return _import_mpi()


def before_start(step: Callable[[], None]) -> None:
    """Run ``step`` before MPI starts (once, in the order given; again-given steps are ignored).

    For what must be loaded ahead of MPI's own libraries: the upper layers know
    what (UCC, where a device is routed to it: :mod:`hpccomm.registration`).
    """
    if step not in _before_start:
        _before_start.append(step)


def on_identity(step: Callable[[Identity], None]) -> None:
    """Give ``step`` this process's :class:`Identity` once MPI has started (fail-fast arms itself so)."""
    if step not in _on_identity:
        _on_identity.append(step)


def set_membership(choose: Callable[[Any, Callable[[Any], None]], None]) -> None:
    """Let ``choose`` say which processes of ``MPI_COMM_WORLD`` are the world, as MPI starts.

    ``choose(MPI_COMM_WORLD, settle)`` is called on every process,
    collectively, and calls ``settle(comm)`` on the communicator whose ranks
    are the world: ``settle`` learns this process's identity and the node
    table over ``comm`` (collective over ``comm``; MPI's error where a process
    of it died meanwhile, which ``choose`` may meet by settling on another).
    Fault-tolerant mode's spares (:mod:`hpccomm.fault_tolerance.spares`) are
    processes of the job but not ranks: a spare's call returns only once it
    has taken a rank's place and settled.
    """
    global _membership
    _membership = choose


_before_start: list[Callable[[], None]] = []
_on_identity: list[Callable[[Identity], None]] = []
_membership: Callable[[Any, Callable[[Any], None]], None] | None = None
#: The communicator whose ranks are the world's (MPI_COMM_WORLD, unless spares or a shrink say otherwise).
_members: Any = None


def _import_mpi() -> "_MPI":
    global _MPI_MODULE
    for step in _before_start:
        step()

    import mpi4py

    if "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI  # loaded (and so started) by the program: its settings stand
    else:
        MPI = _start_mpi(mpi4py)
    _MPI_MODULE = MPI
    return MPI


def _start_mpi(mpi4py: Any) -> "_MPI":
    """Load the MPI library, set what applies to it, then initialise it."""
    import hpccomm_run

    # Async work is driven from a background thread while the caller's
    # thread may post more; that needs MPI_THREAD_MULTIPLE.
    mpi4py.rc.thread_level = "multiple"
    automatic = mpi4py.rc.initialize
    if automatic:
        # Load without MPI_Init, so that the settings below are chosen for the
        # library actually loaded; mpi4py still finalises at exit (hpccomm
        # does, in fault-tolerant mode: see _finalize_at_exit).
        mpi4py.rc.initialize = False
        if mpi4py.rc.finalize is None:
            mpi4py.rc.finalize = not _fault_tolerant()
    from mpi4py import MPI

    if automatic:
        mpi4py.rc.initialize = True
        library = hpccomm_run.describe_library(MPI)
        hpccomm_run.apply_mpi_library_defaults(library=library, ft=_fault_tolerant())
        alone = hpccomm_run.apply_singleton_defaults(library=library)
        try:
            MPI.Init_thread(MPI.THREAD_MULTIPLE)
        finally:
            for setting in alone:  # read by MPI_Init; not for a launcher this process starts later
                os.environ.pop(setting.name, None)
        if not mpi4py.rc.finalize:
            # Registered first, so it runs after every other exit step of hpccomm (atexit is last in, first out).
            atexit.register(_finalize_at_exit, MPI)
    return MPI


def _fault_tolerant() -> bool:
    from .config import settings

    return settings.ft


_finalize_skipped = False


def skip_finalize() -> None:
    """Leave MPI unfinalised at exit: this process met a rank's death (fault-tolerant mode).

    Open MPI 5.0's ``MPI_Finalize`` ends with a fence over every process the
    job started; after a death it was seen to wait forever for the dead one
    (about one run in seven where the rank died inside a collective). Under
    ``mpirun --with-ft ulfm`` a process that exits unfinalised is not an error:
    the job's exit status stays its ranks' own.
    """
    global _finalize_skipped
    _finalize_skipped = True


def _finalize_at_exit(MPI: Any) -> None:
    # With ULFM's heartbeat detector on, Open MPI 5.0.11's MPI_Finalize was seen to spin without end in
    # ompi_comm_failure_detector_finalize (3 of 4 jobs of 4 ranks that had met no failure).
    detector = os.environ.get("OMPI_MCA_mpi_ft_detector", "").strip().lower() in ("1", "true", "yes", "on")
    if not _finalize_skipped and not detector and not MPI.Is_finalized():
        MPI.Finalize()


def identity() -> Identity:
    """Start MPI if needed and return this process's :class:`Identity`."""
    global _identity, _control
    if _identity is not None:
        return _identity
    with _lock:
        if _identity is None:
            try:
                _control = mpi().COMM_WORLD.Dup()
                if _membership is not None:
                    _membership(mpi().COMM_WORLD, _rebased)
                else:
                    _identity = _discover()
            except mpi().Exception:
                # A rank died while MPI started (fault-tolerant mode: the job goes on): this process
                # raises, and MPI_Finalize at its exit would wait for the dead rank without end.
                skip_finalize()
                raise
            _control.Set_name("hpccomm-control")
            _export_env(_identity)
            _report_thread_level(_identity)
            for step in _on_identity:
                step(_identity)
    return _identity


def control() -> Any:
    """hpccomm's control communicator: a duplicate of ``MPI_COMM_WORLD`` made as MPI starts (collective then).

    It carries what belongs to no group, each kind on its own tags (:data:`GOODBYE_TAG`,
    :data:`STORE_OPERATION_TAG`, :data:`STORE_ANSWER_TAG`, :data:`RECORDED_TAG`): sharing it, the job's
    store adds no communicator to ``init_process_group``, where making one is a
    round of agreement among all ranks (measured: 0.26-0.34 s of 4.4 s at 8 ranks on 2 cores).
    """
    identity()
    return _control


def members() -> Any:
    """The communicator whose ranks are the world's ranks: ``MPI_COMM_WORLD``, until spares or a shrink differ.

    Owned by this module: a caller duplicates it, never frees it.
    """
    identity()
    return _members if _members is not None else mpi().COMM_WORLD


def nodes() -> WorldNodes:
    """Start MPI if needed and return the node of every world rank."""
    identity()
    assert _nodes is not None
    return _nodes


def _discover(comm: Any = None) -> Identity:
    """This process's identity and the world's node table, learnt over ``comm`` (default ``MPI_COMM_WORLD``)."""
    global _nodes
    MPI = mpi()
    world = MPI.COMM_WORLD if comm is None else comm
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank)
    try:
        local_rank, local_size = node.rank, node.size
        # key=world.rank: local rank 0 is the node's lowest world rank, which names the node.
        lowest = node.bcast(world.rank, root=0)
    finally:
        node.Free()
    per_rank = world.allgather((lowest, hostname()))
    lowest_ranks = sorted({low for low, _host in per_rank})
    index = {low: i for i, low in enumerate(lowest_ranks)}
    _nodes = WorldNodes(
        node_of=tuple(index[low] for low, _host in per_rank),
        hosts=tuple(per_rank[low][1] for low in lowest_ranks),
    )
    return Identity(
        rank=world.rank,
        world_size=world.size,
        local_rank=local_rank,
        local_world_size=local_size,
        num_nodes=len(lowest_ranks),
        thread_level=MPI.Query_thread(),
    )


#: The ``MPI_COMM_WORLD`` rank of each world rank, once a shrink has renumbered the world; None before.
_mpi_world_ranks: tuple[int, ...] | None = None


def rebase(comm: Any) -> Identity:
    """Make the processes of ``comm`` the world: the survivors of a shrink of the default group, or a repair.

    Collective over ``comm``, which this module then keeps (:func:`members`).
    From then on :func:`identity`, :func:`nodes` and
    ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` are those of
    ``comm``'s ranks, as torch numbers its default group, and the steps given
    to :func:`on_identity` run again (fail-fast learns of newcomers)
    (fault-tolerant mode, :mod:`hpccomm.fault_tolerance`).
    """
    identity()
    with _lock:
        _rebased(comm)
        steps = list(_on_identity)
    for step in steps:
        step(_identity)
    return _identity


def _rebased(comm: Any) -> None:
    global _identity, _mpi_world_ranks, _members
    MPI = mpi()
    _identity = _discover(comm)
    _mpi_world_ranks = tuple(
        MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())), MPI.COMM_WORLD.Get_group())
    )
    _members = comm
    _export_env(_identity)


def mpi_world_ranks(ranks: Iterable[int]) -> list[int]:
    """World ranks as ranks of ``MPI_COMM_WORLD`` (the same until a shrink renumbers the world)."""
    if _mpi_world_ranks is None:
        return list(ranks)
    return [_mpi_world_ranks[rank] for rank in ranks]


def failed_ranks(comm: Any) -> set[int]:
    """The ranks of ``comm`` that this process's MPI knows failed (ULFM); none where the MPI has no ULFM."""
    MPI = mpi()
    try:
        failed = comm.Get_failed()
    except (MPI.Exception, NotImplementedError):
        return set()
    try:
        ranks = MPI.Group.Translate_ranks(failed, list(range(failed.size)), comm.Get_group())
    finally:
        failed.Free()
    return {rank for rank in ranks if rank != MPI.UNDEFINED}


def _export_env(ident: Identity) -> None:
    os.environ["RANK"] = str(ident.rank)
    os.environ["WORLD_SIZE"] = str(ident.world_size)
    os.environ["LOCAL_RANK"] = str(ident.local_rank)
    os.environ["LOCAL_WORLD_SIZE"] = str(ident.local_world_size)


def _report_thread_level(ident: Identity) -> None:
    """One line from rank 0 when MPI offers less than MPI_THREAD_MULTIPLE."""
    from .config import settings

    MPI = mpi()
    if ident.rank != 0 or ident.thread_level >= MPI.THREAD_MULTIPLE or not settings.progress_thread:
        return
    import hpccomm_run

    level = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED",
             MPI.THREAD_SERIALIZED: "SERIALIZED"}.get(ident.thread_level, str(ident.thread_level))
    # One write, newline included: MPICH's hydra forwards each write as it comes, and another of the rank's
    # lines once landed between this one and its newline.
    sys.stderr.write(
        f"hpccomm: {hpccomm_run.describe_library(MPI).name} provides MPI_THREAD_{level}, not "
        "MPI_THREAD_MULTIPLE: no progress thread, so asynchronous work (DDP's gradient "
        "all-reduces) progresses only while the rank waits on an operation, without overlapping compute\n"
    )
    sys.stderr.flush()


def has_thread_multiple() -> bool:
    """True when MPI lets several threads call it at once."""
    return identity().thread_level >= mpi().THREAD_MULTIPLE


def hostname() -> str:
    """This node's host name, as MPI peers would see it."""
    return socket.gethostname()
