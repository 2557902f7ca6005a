"""Failing fast: when one rank dies, the job ends within seconds and says why.

The classic MPI failure is a job that hangs until its allocation runs out: a
rank raises and then blocks in ``MPI_Finalize`` (which synchronises with the
others) while the others block in a collective it will never join. hpccomm
breaks that cycle in two ways, installed when MPI starts in a job of more
than one rank:

* an uncaught exception prints the traceback, then "hpccomm: rank R: ...
  aborting the job" and calls ``MPI_Abort``, so the launcher ends every rank
  and exits non-zero (the pattern of ``python -m mpi4py``);
* every rank that exits, for any reason (``sys.exit(3)`` included), first tells
  the others on hpccomm's control communicator (:func:`hpccomm.world.control`).
  A rank waiting on an operation whose group contains a departed rank raises
  :class:`PeerExitedError` naming it, instead of waiting out the timeout. A
  rank killed outright (SIGKILL) is noticed by the launcher itself, which ends
  the job.

The goodbye receives are posted when MPI starts, so every goodbye is matched
and its send completes; at exit the sends are awaited (bounded) and the
receives that never matched are cancelled. No request is left pending when
MPI finalises: a pending send to a rank that already left can hang
``MPI_Finalize``. Between the two, the steps given to :func:`after_goodbye`
run: teardowns that wait for the other ranks (UCC's), which must not keep
this rank's goodbye from the others and must still learn of ranks that leave.

Where torch's flight recorder is to be written on failure
(:mod:`hpccomm.flight_recorder`), a rank that aborts the job first writes its
record, then says goodbye with a word that asks each other rank for theirs:
a rank writes its record as it collects that goodbye (any wait on an hpccomm
operation does, every few polls) and answers that it has. The aborting rank
waits for every answer, from ranks that have not left, for at most torch's
bound on a dump (``TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC``); a rank busy outside
hpccomm answers only then, if at all.
"""

from __future__ import annotations

import atexit
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from . import flight_recorder
from .world import GOODBYE_TAG, RECORDED_TAG, Identity, control, identity, mpi, mpi_world_ranks, on_identity

#: Before MPI_Abort: time for the launcher to forward this rank's last output,
#: which an abort would otherwise cut off.
_FLUSH_S = 0.5
#: After a peer's goodbye, how long a pending op may still complete: its data
#: can be in flight on another channel when the goodbye arrives.
GRACE_S = 1.0

#: How long exit waits for this rank's goodbyes to be delivered.
_GOODBYE_WAIT_S = 2.0
#: If MPI_Abort has not ended this process within this many seconds, SIGALRM
#: ends it: the launcher ends a job whose rank dies without finalising MPI.
#: (Debian's Open MPI 4.1.4 has twice left a job hanging after ranks called
#: MPI_Abort.)
_ABORT_WAIT_S = 3

_control: Any = None
#: This rank's world rank (for messages) and its rank on the control communicator (for goodbyes).
_rank = -1
_me = -1
#: Control ranks whose goodbye receive was ever posted: each gets one, however the world changes.
_posted: set[int] = set()
_departed: set[int] = set()
_first_seen: dict[int, float] = {}
#: peer rank -> (posted receive for its goodbye, its 1-byte buffer)
_inbox: dict[int, tuple[Any, bytearray]] = {}
#: Held while a thread tests or cancels the goodbye receives: MPI forbids two
#: threads completing one request, and the progress thread and a waiting
#: caller both check for departed peers.
_inbox_lock = threading.Lock()
_after_goodbye: list[Callable[[], None]] = []
#: What a goodbye says: this rank leaves; or it leaves failing, and asks for each rank's flight record first.
_LEAVING = b"\x01"
_FAILING = b"\x02"
#: Set once this rank's goodbyes are out (each peer gets exactly one).
_goodbyes_sent = False
#: This rank's answers to failing ranks that asked for its flight record: sends to complete before exit.
_answers: list[Any] = []


class PeerExitedError(RuntimeError):
    """A rank this operation needs has left the job."""


def install(rank: int, world_size: int) -> None:
    """Arm fail-fast for this process (nothing for a world of one); again after the world changed.

    A receive is posted for the goodbye of each world rank, by its rank on the
    control communicator (``MPI_COMM_WORLD``'s): again after a shrink or a
    repair renumbered the world (:func:`hpccomm.world.rebase`), for a newcomer
    only. Processes of the job that are not ranks (fault-tolerant mode's
    spares) neither get nor send goodbyes.
    """
    global _control, _rank, _me
    if world_size < 2:
        return
    MPI = mpi()
    _rank = rank
    if _control is None:
        _control = control()
        _me = _control.Get_rank()
        sys.excepthook = _aborting_hook(sys.excepthook)
        atexit.register(_say_goodbye)
    with _inbox_lock:
        for peer in _peers():
            if peer not in _inbox and peer not in _departed and peer not in _posted:
                buf = bytearray(1)
                _inbox[peer] = (_control.Irecv((buf, MPI.BYTE), peer, GOODBYE_TAG), buf)
                _posted.add(peer)


def _peers() -> list[int]:
    """The other world ranks, as ranks of the control communicator."""
    return [peer for peer in mpi_world_ranks(range(identity().world_size)) if peer != _me]


def _arm(identity: Identity) -> None:
    install(identity.rank, identity.world_size)


on_identity(_arm)  # armed as MPI starts (importing hpccomm imports this module first), and at each rebase


def after_goodbye(step: Callable[[], None]) -> bool:
    """Run ``step`` at exit once this rank's goodbyes are out, while :func:`departed` still learns of others.

    Returns:
        False, and nothing is registered, where fail-fast is not armed (a
        world of one, or before MPI started): the caller runs ``step`` itself.
    """
    if _control is None:
        return False
    _after_goodbye.append(step)
    return True


def _aborting_hook(previous: Any) -> Any:
    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        # torch's init_process_group wraps this hook and points sys.stderr at
        # a buffer while it runs, so write to the real stderr ourselves.
        lines = traceback.format_exception(kind, value, tb)
        report = "".join(f"[rank{_rank}]: {line}" for line in "".join(lines).splitlines(keepends=True))
        err = sys.__stderr__
        err.write(report)
        err.write(f"hpccomm: rank {_rank}: uncaught {kind.__name__}: {value}; aborting the job\n")
        err.flush()
        sys.stdout.flush()
        _gather_records()
        time.sleep(_FLUSH_S)
        _exit_unless_aborted_within(_ABORT_WAIT_S)
        mpi().COMM_WORLD.Abort(1)

    del previous  # replaced: printing and then aborting is the whole job
    return hook


def _exit_unless_aborted_within(seconds: int) -> None:
    # mpi4py calls MPI_Abort without releasing the GIL, so while it hangs no
    # Python thread runs, nor any Python signal handler: the kernel must end
    # the process, by SIGALRM's default action.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(seconds)


def _send_goodbyes(word: bytes) -> list[Any]:
    """Post this rank's goodbye to every other rank (once per process); the sends."""
    global _goodbyes_sent
    MPI = mpi()
    if _goodbyes_sent:
        return []
    _goodbyes_sent = True
    token = bytearray(word)
    sends = []
    for peer in _peers():
        try:
            sends.append(_control.Isend((token, MPI.BYTE), peer, GOODBYE_TAG))
        except MPI.Exception:
            pass  # fault-tolerant mode: the peer died
    return sends


def _gather_records() -> None:
    """Before aborting the job: write this rank's flight record, and have every rank still here write theirs.

    Each rank answers once written (:func:`_test_inbox`); the wait ends when all
    have, or have left, or after torch's bound on a dump.
    """
    if _control is None or _goodbyes_sent or not flight_recorder.enabled():
        return
    flight_recorder.write(_rank)
    MPI = mpi()
    answers = {}
    for peer in _peers():  # posted before the asks, so every answer finds its receive
        answers[peer] = _control.Irecv((bytearray(1), MPI.BYTE), peer, RECORDED_TAG)
    _send_goodbyes(_FAILING)
    # Each peer is settled by a fact: its answer, or its goodbye. The bound is only for a peer that can give
    # neither (busy outside hpccomm, or hung): torch's own bound on one dump, which NCCL's heartbeat monitor also
    # gives its dump (TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC, 15 s by default).
    deadline = time.monotonic() + flight_recorder.wait_s()
    while answers and time.monotonic() < deadline:
        _collect_goodbyes()  # answers others that ask too; learns who has left
        answers = {peer: request for peer, request in answers.items() if not _ended(request) and peer not in _departed}
        time.sleep(0.001)
    # MPI_Abort follows, which ends whatever is still pending.


def _say_goodbye() -> None:
    MPI = mpi()
    if MPI.Is_finalized():
        return
    sends = _send_goodbyes(_LEAVING) + _answers
    deadline = time.monotonic() + _GOODBYE_WAIT_S
    while sends and time.monotonic() < deadline:
        sends = [request for request in sends if not _ended(request)]
        time.sleep(0.001)
    for step in _after_goodbye:
        try:
            step()
        except Exception as exc:  # the others still run; exit goes on
            print(f"hpccomm: rank {_rank}: at exit: {type(exc).__name__}: {exc}", file=sys.stderr)
    with _inbox_lock:
        for request, _buf in _inbox.values():
            if not _ended(request):
                request.Cancel()
                _ended(request, wait=True)
        _inbox.clear()


def _ended(request: Any, wait: bool = False) -> bool:
    """Whether ``request`` has ended; one that ended in error (a dead peer, in fault-tolerant mode) has."""
    try:
        if wait:
            request.Wait()
            return True
        return request.Test()
    except mpi().Exception:
        return True


def departed(ranks: Iterable[int], mpi_ranks: Iterable[int] | None = None) -> list[int]:
    """The ranks in ``ranks`` that left the job over GRACE_S ago (usually none).

    Args:
        ranks: world ranks a pending operation needs.
        mpi_ranks: their ranks in ``MPI_COMM_WORLD``, as the group recorded
            them when it was made; default: translated now. A group made
            before a shrink renumbered the world (fault-tolerant mode) must
            pass them: its world ranks are of the world it was made in.
    """
    if _control is None:
        return []
    _collect_goodbyes()
    if not _departed:
        return []
    now = time.monotonic()
    ranks = list(ranks)
    # Goodbyes travel on MPI_COMM_WORLD, whose numbering a shrink of the world changes (fault-tolerant mode).
    return sorted(
        rank for rank, mpi_rank in zip(ranks, mpi_world_ranks(ranks) if mpi_ranks is None else mpi_ranks)
        if mpi_rank in _departed and now - _first_seen[mpi_rank] > GRACE_S
    )


def _collect_goodbyes() -> None:
    # A thread that finds another collecting skips this round: it sees the result in _departed.
    if not _inbox or not _inbox_lock.acquire(blocking=False):
        return
    try:
        _test_inbox()
    finally:
        _inbox_lock.release()


def _test_inbox() -> None:
    peers = list(_inbox)
    MPI = mpi()
    try:
        arrived = [peers[index] for index in MPI.Request.Testsome([_inbox[peer][0] for peer in peers]) or []]
    except MPI.Exception:
        arrived = _test_each()
    now = time.monotonic()
    asking = []
    for peer in arrived:
        if bytes(_inbox.pop(peer)[1]) == _FAILING:
            asking.append(peer)
        _departed.add(peer)
        _first_seen.setdefault(peer, now)
    if asking and flight_recorder.write(_rank):
        for peer in asking:  # the asking rank waits for this word before it aborts the job
            _answers.append(_control.Isend((bytearray(_LEAVING), MPI.BYTE), peer, RECORDED_TAG))


def _test_each() -> list[int]:
    """The peers whose goodbye arrived, testing each receive alone: fault-tolerant mode's path.

    There (ULFM) the receive of a rank that died ends in error; it is dropped, as
    the rank is reported through its groups' ``PeerFailure`` instead.
    """
    MPI = mpi()
    arrived = []
    for peer in list(_inbox):
        try:
            if _inbox[peer][0].Test():
                arrived.append(peer)
        except MPI.Exception:
            del _inbox[peer]
    return arrived
