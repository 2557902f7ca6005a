"""Spares: processes held back at launch that take dead ranks' places (``hpccomm-run --ft --spares K``).

The last K processes of the job are spares (``HPCCOMM_FT_SPARES``): not
ranks, so ``dist.get_world_size()`` is the size asked for. A spare waits
inside ``init_process_group`` on one receive, tested every
:data:`_POLL_S` with a sleep between (a blocking MPI receive spins a core).

After the survivors agree on a death, :func:`repair` (every survivor) revokes
the *pool*, a communicator over every process of the job; each waiting
spare's receive ends with the revoke, and survivors and spares shrink the
pool together. The pool's lowest rank, always a survivor (the ranks come
before the spares and spares are used in order), gives each dead rank a
spare, and one split makes the new world: every survivor keeps its rank, and
a spare takes the number of the rank it replaces, so data sharded by rank
stays right. The spare's ``init_process_group`` then returns as that rank,
while the survivors rebuild their default group in place on the new world
(same ranks, same size; torch's group object, its name and device stay).
With too few spares left, nothing is replaced and :func:`repair` falls back
to ``dist.shrink_group``.

At a clean end, world rank 0 tells each spare still waiting to leave; the
spare finalises MPI (the others' ``MPI_Finalize`` waits for it) and exits
with status 0 without running the rest of the program.

Fenix (Sandia) recovers MPI programs with spares the same way: revoke,
shrink, then spares fill the holes.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from .. import world
from ..config import settings
from .agreement import check_built

#: How often a waiting spare tests its receive: its wake-up latency, and its whole cost (measured 0.35% of
#: a core at 20 ms, 0.7% at 10 ms, on a 2-core VM: each test runs Open MPI's progress engine once).
_POLL_S = 0.02
#: On the pool: "leave, the job is over", from world rank 0 to each spare still waiting.
_LEAVE_TAG = 1
#: How long rank 0 waits at exit for a word to a spare that is neither delivered nor failed (see _release_spares).
_LEAVE_WAIT_S = 2.0

T = TypeVar("T")

_pool: Any = None
_replacement = False
_failure_seen = False


def install() -> None:
    """Hold back the job's last ``HPCCOMM_FT_SPARES`` processes as spares as MPI starts (fault-tolerant mode)."""
    if settings.ft and settings.ft_spares:
        world.set_membership(_membership)


def is_replacement() -> bool:
    """Whether this process joined as a spare that took a dead rank's place (it then receives the state)."""
    return _replacement


def _membership(everyone: Any, settle: Callable[[Any], None]) -> None:
    """Settle on the world's communicator: at once for a rank; for a spare, once it has taken a rank's place.

    Collective over ``everyone``; ``settle`` is :func:`hpccomm.world.set_membership`'s.
    """
    global _pool
    MPI = world.mpi()
    spares = settings.ft_spares
    ranks = everyone.Get_size() - spares
    if ranks < 1:
        raise RuntimeError(
            f"hpccomm: HPCCOMM_FT_SPARES={spares} leaves no rank in a job of {everyone.Get_size()} processes; "
            "start the ranks plus the spares (hpccomm-run --ft --spares K -n N starts N + K)"
        )
    _pool = everyone.Dup()
    _pool.Set_errhandler(MPI.ERRORS_RETURN)
    me = everyone.Get_rank()
    active = everyone.Split(0 if me < ranks else MPI.UNDEFINED, me)
    atexit.register(_release_spares)  # a spare may be world rank 0 by the end (it replaced rank 0)
    if me < ranks:
        settle(active)
        return
    _wait(settle)


def _wait(settle: Callable[[Any], None]) -> None:
    """A spare's life until it replaces a rank (it has then joined the new world) or the job ends (exits)."""
    global _replacement, _failure_seen
    MPI = world.mpi()
    while True:
        word = bytearray(1)
        request = _pool.Irecv((word, MPI.BYTE), MPI.ANY_SOURCE, _LEAVE_TAG)
        while True:
            try:
                if request.Test():
                    _leave()
            except MPI.Exception:
                _failure_seen = True
                if _pool.Is_revoked():
                    break  # the survivors repair: take part
                try:
                    _pool.Ack_failed()  # a death noticed before the revoke: go on waiting for it
                except MPI.Exception:
                    pass
            time.sleep(_POLL_S)
        comm = _regroup(member=False)
        if comm is not None:
            _replacement = True
            world.skip_finalize()  # a rank of this job died: MPI_Finalize would wait for it
            _join(comm, settle)
            return


def _join(comm: Any, settle: Callable[[Any], None]) -> None:
    """A replacement learns its world on ``comm``: the first step of the survivors' build of the repaired group.

    A rank that dies meanwhile fails ``settle`` here or the survivors' build
    there: then, as the survivors' :func:`build_checked` does, this process
    says so in the check, and all regroup with the spares left and try again
    on the next new world (or, too few spares left, this process leaves).
    """
    MPI = world.mpi()
    rank = comm.Get_rank()  # the number of the dead rank it replaces
    while True:
        try:
            settle(comm)
            return
        except MPI.Exception:  # a process of comm died: the others' build fails, or their check says it did
            pass
        alive, _everyone = check_built(comm, False)
        alive.Free()
        comm = _regroup(member=False, rank=rank)
        if comm is None:
            leave_unneeded()
        rank = comm.Get_rank()


def leave_unneeded() -> None:
    """A replacement that lost its place to a death while it joined, with too few spares left: leave as a spare.

    The survivors shrink the group without it. It exits with status 0, as a
    spare that was never needed does, not as a failure (which would end the job).
    """
    print("hpccomm: a rank died while this replacement joined and too few spares are left; the survivors "
          "shrink the group without this process, which leaves", file=sys.stderr, flush=True)
    os._exit(0)


def _leave() -> None:
    """The job is over without this spare: finalise MPI as the ranks do, and exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    MPI = world.mpi()
    if not _failure_seen and not MPI.Is_finalized():
        MPI.Finalize()
    os._exit(0)


def _regroup(member: bool, rank: int | None = None) -> Any:
    """Revoke and shrink the pool, give spares the dead ranks' places, and split off the new world. Collective.

    The dead are read off the shrunk pool itself (the world ranks whose
    process is not in it), so a rank that dies while the survivors repair is
    one more dead rank, not a hole. A death during the round (an error on any
    process, which then revokes the pool, or a failure ULFM's agreement
    reports) starts another round, on every process alike.

    Args:
        member: whether this process is a rank of the world (a survivor); else a spare.
        rank: for a replacement still joining (not a member yet: its
            identity is not settled), the place it had.

    Each keeps its place (a member its rank) unless the pool's rank 0 gives it
    another: where a death failed the survivors' and the replacements' first
    step on the new world (learning it), rank 0 still sees the replacements
    as spares, and may give them other dead ranks' places.

    Returns:
        the new world's communicator (ranks in world order); None for a spare
        left waiting, and on every process when too few spares are alive.
    """
    global _pool
    MPI = world.mpi()
    while True:
        try:
            _pool.Revoke()
        except MPI.Exception:
            pass  # revoked already, by another process
        pool = _pool.Shrink()
        pool.Set_errhandler(MPI.ERRORS_RETURN)
        _pool.Free()
        _pool = pool
        comm = None
        try:
            places = _places(pool) if member and pool.Get_rank() == 0 else None
            places = pool.bcast(places, root=0)
            # Rank 0's word on the places goes: a replacement whose joining failed there is a spare to it.
            mine = world.identity().rank if member else rank
            place = places.get(pool.Get_rank(), mine) if places else None
            comm = pool.Split(MPI.UNDEFINED if place is None else 0, 0 if place is None else place)
            if pool.Agree(1) == 1:
                return None if comm == MPI.COMM_NULL else comm
        except MPI.Exception:
            pass
        if comm is not None and comm != MPI.COMM_NULL:
            comm.Free()


def _places(pool: Any) -> dict[int, int]:
    """Which spare (rank in ``pool``) takes which dead world rank: all of them, or {} if too few spares live."""
    MPI = world.mpi()
    job = MPI.Group.Translate_ranks(pool.Get_group(), list(range(pool.Get_size())), MPI.COMM_WORLD.Get_group())
    alive = set(job)
    members = world.mpi_world_ranks(range(world.identity().world_size))
    dead = [rank for rank, process in enumerate(members) if process not in alive]
    ranks = set(members)
    waiting = [index for index, process in enumerate(job) if process not in ranks]
    return dict(zip(waiting, dead)) if len(waiting) >= len(dead) else {}


def refill() -> Any:
    """On every rank of the world: the new world with spares in every dead rank's place, or None if too few are left."""
    if _pool is None:
        return None
    return _regroup(member=True)


def build_checked(comm: Any, build: Callable[[Any], T], again: Callable[[Any], T] | None = None) -> T | None:
    """``build(comm)`` on the new world, regrouping with the spares until every process built it. Collective.

    Run alike by the survivors and by a replacement, whose first round's
    ``build`` differs (it learnt its world as it left the pool): from the
    second round on, once a rank died while the group was built, each runs
    ``again`` (default: ``build``) on the next new world.

    Returns:
        the group; None where a round found too few spares left (the caller shrinks).
    """
    while True:
        try:
            group: T | None = build(comm)
        except Exception:  # a rank died under the build's collectives: an MPI error, or one made of it
            group = None
        alive, everyone = check_built(comm, group is not None)
        alive.Free()
        if everyone:
            return group
        if group is not None:
            group.abort()  # type: ignore[attr-defined]
        comm = refill()
        if comm is None:
            return None
        build = again or build


def _release_spares() -> None:
    """At a clean exit, from world rank 0: tell each spare still waiting to leave."""
    if _pool is None or world.identity().rank != 0:
        return
    MPI = world.mpi()
    if MPI.Is_finalized():
        return
    in_world = set(world.mpi_world_ranks(range(world.identity().world_size)))
    job = MPI.Group.Translate_ranks(_pool.Get_group(), list(range(_pool.Get_size())), MPI.COMM_WORLD.Get_group())
    word = bytearray(1)
    sends = []
    for index, process in enumerate(job):
        if process not in in_world:
            try:
                sends.append(_pool.Isend((word, MPI.BYTE), index, _LEAVE_TAG))
            except MPI.Exception:
                pass  # that spare died
    # Each send is settled by a fact: delivered (a waiting spare always has its receive posted), or ended in
    # error (ULFM: that spare died). The bound is only for a spare that is neither, on a node that hangs: the same
    # as fail-fast gives its goodbyes at exit (hpccomm.failure._GOODBYE_WAIT_S), not a verdict on the spare.
    deadline = time.monotonic() + _LEAVE_WAIT_S
    while sends and time.monotonic() < deadline:
        sends = [request for request in sends if not _settled(request)]
        time.sleep(0.001)


def _settled(request: Any) -> bool:
    """Whether a send has ended: delivered, or failed because its receiver died."""
    try:
        return request.Test()
    except world.mpi().Exception:
        return True


def repair(failed: Sequence[int]) -> int:
    """Bring the default group back to its size after ranks died: spares take their places.

    Called by every survivor, after a :class:`~hpccomm.PeerFailure` (or
    ``hpccomm.failed_ranks()``) of the default group. Each spare that takes a
    dead rank's place returns from its ``init_process_group`` as that rank;
    the survivors' default group is rebuilt in place: the same torch group,
    size and ranks. Other groups, and whatever used the default group (DDP),
    must be made again, as after ``dist.shrink_group``. Then every rank,
    replacements included, calls :meth:`TrainingState.resume
    <hpccomm.fault_tolerance.state.TrainingState.resume>` to share the state.
    With too few spares left, the default group is shrunk instead
    (``dist.shrink_group(failed)``: ranks renumbered).

    Args:
        failed: the dead ranks, as agreed (``hpccomm.failed_ranks()``).

    Returns:
        the number of ranks replaced (0: the group was shrunk).

    Raises:
        ValueError: ``failed`` is not what the survivors agreed.
        PeerFailure: a rank died while the group was rebuilt.
    """
    group = dist.distributed_c10d._get_default_group()
    backend = group._get_backend(torch.device("cpu"))
    agreed = getattr(backend, "failed_ranks", None)
    if not agreed or sorted(set(int(rank) for rank in failed)) != agreed:
        raise ValueError(
            f"hpccomm repair: failed={sorted(failed)} but the survivors agreed on {agreed}: pass "
            "hpccomm.failed_ranks() (the default group's)"
        )
    before = set(world.mpi_world_ranks(range(world.identity().world_size)))
    if backend.refill():
        return len(before - set(world.mpi_world_ranks(range(world.identity().world_size))))
    dist.shrink_group(agreed)
    return 0
