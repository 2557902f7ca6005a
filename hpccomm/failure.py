"""Failing fast: when one rank dies, the job ends within seconds and says why.

The classic MPI failure is a job that hangs until its allocation runs out: a
rank raises and then blocks in ``MPI_Finalize`` (which synchronises with the
others) while the others block in a collective it will never join. hpccomm
breaks that cycle in two ways, installed when MPI starts in a job of more
than one rank:

* an uncaught exception prints the traceback, then "hpccomm: rank R: ...
  aborting the job" and calls ``MPI_Abort``, so the launcher ends every rank
  and exits non-zero (the pattern of ``python -m mpi4py``); in fault-tolerant
  mode the rank exits with status 1 instead, which ``mpirun --with-ft ulfm``
  answers the same way (its ``prterun`` deadlocked on ranks' aborts at once);
* every rank that exits, for any reason (``sys.exit(3)`` included), first tells
  the others on hpccomm's control communicator (:func:`hpccomm.world.control`),
  and its goodbye says what it did: on each of its groups, how many
  collectives it posted, and the point-to-point messages it posted to and
  from the rank it tells
  (:class:`hpccomm.ledger.Ledger`). A rank waiting on an operation raises
  :class:`PeerExitedError` naming the departed rank only where that rank had
  not done its part in it; an operation whose departed ranks all did theirs
  goes on, however late its data arrives. A rank killed outright (SIGKILL) is
  noticed by the launcher itself, which ends the job.

No clock decides whether a peer failed: the verdict is what the peer said it did.
Goodbyes are matched as they arrive, by a probe for any source on their tag
(one probe per check, whatever the job's size), and at exit by a last probe;
no receive is posted for them, so none is left pending when MPI finalises.

From ``HPCCOMM_GOODBYE_TREE_FROM`` ranks (64) up, goodbyes travel a tree
(:mod:`hpccomm.goodbye_tree`): a leaving rank sends its record (its
collectives on each group, and its point-to-point partners) to its tree
neighbours and its point-to-point counts to each partner only; every rank
passes records on to its other neighbours, as it takes them in while it waits
on an operation and from a relay thread (every :data:`_RELAY_S`) while it is
busy elsewhere; and at exit it lingers, passing news on, until every other
rank has left (or, in fault-tolerant mode, died), which MPI's finalize would
wait for anyway. A rank waiting on a partner's messages takes the partner's
facts from its own goodbye, which its record never overtakes in the verdict:
until that goodbye is in, the partner counts as not yet gone.

The sends are awaited (bounded): a pending send to a rank that already left
can hang ``MPI_Finalize``, and goodbyes stay small enough for MPI's eager
protocol (:data:`hpccomm.ledger.MOST_GROUPS`). Between the sends and finalising, the steps
given to :func:`after_goodbye` run: teardowns that wait for the other ranks
(UCC's), which must not keep this rank's goodbye from the others and must
still learn of ranks that leave; the allgathers they will still make are
counted in the goodbye (``Ledger.promised``), as settled just before it by
the steps given to :func:`before_goodbye`.

Where torch's flight recorder is to be written on failure
(:mod:`hpccomm.flight_recorder`), a rank that aborts the job first writes its
record, then says goodbye with a word that asks each other rank for theirs:
a rank writes its record as it collects that goodbye (any wait on an hpccomm
operation does, every few polls) and answers that it has. The aborting rank
waits for every answer, from ranks that have not left, for at most torch's
bound on a dump (``TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC``); a rank busy outside
hpccomm answers only once it waits on an operation, if at all, except over the
tree, where its relay thread answers.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from . import flight_recorder, goodbye_tree, ledger
from .config import settings
from .world import (GOODBYE_TAG, RECORDED_TAG, Identity, control, failed_ranks, has_thread_multiple, identity, mpi,
                    mpi_world_ranks, on_identity)

#: Before MPI_Abort: time for the launcher to forward this rank's last output,
#: which an abort would otherwise cut off.
_FLUSH_S = 0.5

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
#: What each departed rank said, by its rank on the control communicator: its facts on each group shared.
_said = ledger.Departures()
#: Held while a thread probes for goodbyes: the progress thread and a waiting caller both check for departed
#: peers, and a probe's message must be received by the thread that matched it.
_inbox_lock = threading.Lock()
_status: Any = None
_ANY_SOURCE = -1  # MPI's, set as fail-fast is armed
_before_goodbye: list[Callable[[], None]] = []
_after_goodbye: list[Callable[[], None]] = []
_before_abort: list[Callable[[], None]] = []
#: What a goodbye says: this rank leaves; or it leaves failing, and asks for each rank's flight record first.
_LEAVING = b"\x01"
_FAILING = b"\x02"
#: Set once this rank's goodbyes are out (each peer gets exactly one).
_goodbyes_sent = False
#: This rank's answers to failing ranks that asked for its flight record: sends to complete before exit.
_answers: list[Any] = []
#: Marks a message of departure records passed along the tree (:mod:`hpccomm.goodbye_tree`).
_NEWS = b"\x03"
#: Where goodbyes travel the tree: the book of departures, None where each goodbye goes to every rank.
_news: goodbye_tree.NewsBook | None = None
#: How often the relay thread takes in and passes on news: a hop's delay where the rank is busy outside hpccomm
#: (a rank waiting on an operation passes news on as it takes it in), and the most often a rank sends a
#: neighbour a batch. Each wake-up cost about 140 us of CPU here (a probe and a pass take 3 us of it; the rest
#: is the thread's wake-up): every 50 ms, 0.27-0.35% of a core; every 20 ms, 0.6-0.76% (2 ranks, 2026-11-29).
_RELAY_S = 0.05
_relay: threading.Thread | None = None
_passed_at = 0.0
_relay_stop = threading.Event()
#: Sends of news and goodbyes still in flight; messages this rank sent and received for departures (counted).
_in_flight: list[Any] = []
counts = {"sent": 0, "received": 0}
#: Failing ranks whose ask for flight records this rank has answered.
_answered: set[int] = set()


class PeerExitedError(RuntimeError):
    """A rank this operation needs has left the job."""


def install(rank: int, world_size: int) -> None:
    """Arm fail-fast for this process (nothing for a world of one); again after the world changed.

    Goodbyes are probed for on the control communicator (``MPI_COMM_WORLD``),
    from any source: nothing is posted per peer, and a shrink or a repair that
    renumbered the world (:func:`hpccomm.world.rebase`) changes only whom this
    rank's own goodbye goes to. Processes of the job that are not ranks
    (fault-tolerant mode's spares) neither get nor send goodbyes.
    """
    global _control, _rank, _me, _status, _ANY_SOURCE, _news, _relay
    if world_size < 2:
        return
    _rank = rank
    if _control is None:
        _status, _ANY_SOURCE = mpi().Status(), mpi().ANY_SOURCE
        _control = control()
        _me = _control.Get_rank()
        sys.excepthook = _aborting_hook(sys.excepthook)
        atexit.register(_say_goodbye)
        if over_tree(world_size):
            _news = goodbye_tree.NewsBook(_me, mpi_world_ranks(range(world_size)))
            _relay = threading.Thread(target=_relay_news, name="hpccomm-goodbyes", daemon=True)
            _relay.start()
    elif _news is not None:
        with _inbox_lock:
            _news.reshape(_me, mpi_world_ranks(range(world_size)), _dead())


def over_tree(size: int) -> bool:
    """Whether news among ``size`` ranks travels a tree (:mod:`hpccomm.goodbye_tree`), not from each to every rank.

    From ``HPCCOMM_GOODBYE_TREE_FROM`` ranks, where MPI offers
    ``MPI_THREAD_MULTIPLE`` for the thread that passes news on. Goodbyes, and
    fault-tolerant mode's stops (:mod:`hpccomm.fault_tolerance.stop_points`).
    """
    return 0 < settings.goodbye_tree_from <= size and has_thread_multiple()


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


def before_goodbye(step: Callable[[], None]) -> None:
    """Run ``step`` at exit just before this rank's goodbyes are written (not where it aborts the job).

    For local steps that settle what the goodbye says: whether a teardown
    promised in a ledger (``Ledger.promised``) will run after all.
    """
    _before_goodbye.append(step)


def before_abort(step: Callable[[], None]) -> None:
    """Run ``step`` just before this rank aborts the job (an uncaught exception; not in fault-tolerant mode).

    For local clean-up that a destructor would do at a normal exit: after
    ``MPI_Abort`` the launcher ends every rank, and none of them runs its
    destructors. Fault-tolerant mode runs nothing: the job goes on without
    this rank, and whatever the step would undo is still in use.
    """
    _before_abort.append(step)


def _run_steps(steps: list[Callable[[], None]]) -> None:
    for step in steps:
        try:
            step()
        except Exception as exc:  # the others still run; exit goes on
            print(f"hpccomm: rank {_rank}: at exit: {type(exc).__name__}: {exc}", file=sys.stderr)


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
        if settings.ft:
            # Under mpirun --with-ft ulfm (Open MPI 5.0.11), with every rank calling MPI_Abort at once,
            # prterun deadlocked on a mutex of its main thread after the ranks were gone (5 jobs of 30 on
            # one node), and across nodes exited 0 (10 of 10). It answers a rank's non-zero exit by ending
            # the job: 60 of 60 such jobs ended at once with status 1 (docs/fault-tolerance.md).
            sys.stderr.flush()
            os._exit(1)
        _run_steps(_before_abort)
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


def goodbye(word: bytes = _LEAVING) -> tuple[list[tuple[int, Any]], goodbye_tree.Record | None]:
    """What this rank's goodbye says if it leaves now (measured by the scale benchmarks).

    Returns:
        The direct messages, as (rank of the control communicator, message):
        to every other rank, with what concerns each; over the tree, its
        point-to-point counts to each partner only. And over the tree, the
        record its tree neighbours get and pass on (None without the tree).
    """
    peers = _peers()
    record = None
    if _news is not None:
        partners = ledger.partners(goodbye_tree.MOST_PARTNERS)
        record = (word, ledger.collective_counts(), partners)
        if partners is not None:
            peers = [peer for peer in peers if peer in partners]
    return [(peer, (word, ledger.facts_for(peer))) for peer in peers], record


def _send_goodbyes(word: bytes) -> list[Any]:
    """Post this rank's goodbye (:func:`goodbye`) once per process; the direct sends.

    Over the tree, the record goes to the tree neighbours after the direct
    messages, so it never overtakes a partner's counts.
    """
    global _goodbyes_sent
    if _goodbyes_sent:
        return []
    _goodbyes_sent = True
    direct, record = goodbye(word)
    sends = [send for peer, message in direct if (send := _post(peer, message)) is not None]
    if record is not None:
        with _inbox_lock:
            _news.learn([(_me, record)], None)
            _pass_on(now=True)
    return sends


def _post(peer: int, message: Any) -> Any:
    """Post ``message`` to ``peer`` on the goodbye tag; the send, or None where the peer died (fault-tolerant mode)."""
    try:
        send = _control.isend(message, peer, GOODBYE_TAG)
    except mpi().Exception:
        return None
    counts["sent"] += 1
    return send


def _pass_on(now: bool = False) -> None:
    """Send each tree neighbour the records it is owed, one message each (under the inbox lock).

    At most once every :data:`_RELAY_S` unless ``now``: the records that come
    meanwhile wait for the next batch, so a rank sends each neighbour at most
    one message per interval however many ranks leave in it (at a job's end,
    all of them at once).
    """
    global _in_flight, _passed_at
    moment = time.monotonic()
    if not now and moment - _passed_at < _RELAY_S:
        return
    _passed_at = moment
    for neighbour, batch in _news.outbox().items():
        send = _post(neighbour, (_NEWS, batch))
        if send is not None:
            _in_flight.append(send)
    _in_flight = [send for send in _in_flight if not _ended(send)]


def _dead() -> set[int]:
    """The ranks of the control communicator that MPI knows failed (fault-tolerant mode; none otherwise)."""
    return failed_ranks(_control) if settings.ft else set()


def _relay_turn(dead: set[int], now: bool) -> set[int]:
    """Take in departure news and pass it on, round the neighbours that died; the dead ranks known.

    Args:
        dead: the dead ranks the tree's neighbours were last chosen around.
        now: pass the news on even if this rank passed some on less than
            :data:`_RELAY_S` ago.
    """
    _collect_goodbyes()
    with _inbox_lock:
        if settings.ft and (known := _dead()) != dead:
            dead = known  # a neighbour died: the news goes round it
            _news.reshape(_me, mpi_world_ranks(range(identity().world_size)), dead)
        _pass_on(now)
    return dead


def _relay_news() -> None:
    """The relay thread: take in and pass on departure news, for a rank that may be busy outside hpccomm."""
    dead: set[int] = set()
    while not _relay_stop.wait(_RELAY_S):
        try:
            dead = _relay_turn(dead, now=True)
        except Exception as exc:  # the thread goes on: a later turn may pass the news on
            print(f"hpccomm: rank {_rank}: passing departures on: {type(exc).__name__}: {exc}", file=sys.stderr)


def _gather_records() -> None:
    """Before aborting the job: write this rank's flight record, and have every rank still here write theirs.

    Each rank answers once written (:func:`_collect_goodbyes`); the wait ends when all
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
        gone = _said if _news is None else _news.records
        answers = {peer: request for peer, request in answers.items() if not _ended(request) and peer not in gone}
        time.sleep(0.001)
    # MPI_Abort follows, which ends whatever is still pending.


def _say_goodbye() -> None:
    MPI = mpi()
    if MPI.Is_finalized():
        return
    _run_steps(_before_goodbye)
    sends = _send_goodbyes(_LEAVING)
    if _news is None:
        _await(sends + _answers)
    _run_steps(_after_goodbye)
    if _news is not None:
        _linger()
        _await(sends + _answers + _in_flight)
    _collect_goodbyes(wait=True)  # the goodbyes already here are received: none is left to MPI's finalize


def _await(sends: list[Any]) -> None:
    """Wait for ``sends`` to be delivered, for at most :data:`_GOODBYE_WAIT_S`."""
    deadline = time.monotonic() + _GOODBYE_WAIT_S
    while sends and time.monotonic() < deadline:
        sends = [request for request in sends if not _ended(request)]
        time.sleep(0.001)


def _linger() -> None:
    """Over the tree, at exit: pass news on until every other rank has left (or died).

    Ranks still at work may need news that passes through this one; MPI's
    finalize would wait for every rank as long anyway. This thread takes the
    relay thread's place, looking four times as often, so that the exit ends
    soon after the last record is in.
    """
    _relay_stop.set()
    if _relay is not None:
        _relay.join()
    dead: set[int] = set()
    while True:
        dead = _relay_turn(dead, now=False)
        with _inbox_lock:
            if _news.everyone_left(dead):
                break
        time.sleep(_RELAY_S / 4)
    with _inbox_lock:
        _pass_on(now=True)


def _ended(request: Any) -> bool:
    """Whether ``request`` has ended; one that ended in error (a dead peer, in fault-tolerant mode) has."""
    try:
        return request.Test()
    except mpi().Exception:
        return True


def abandoned(book: ledger.Ledger, op: str, peer: int | None, ticket: int) -> list[int]:
    """The world ranks an operation needs that left the job without doing their part in it (usually none).

    A departed rank that did its part is not among them: what it sent is
    delivered, however late (an oversubscribed rank can still be inside a
    collective that a faster one completed and left).

    Args:
        book: the ledger of the operation's group.
        op: the operation's name ("send" and "recv" are point-to-point).
        peer: the group rank a point-to-point operation waits for (None: any
            rank); -1 for a collective, which needs every rank of the group.
        ticket: the operation's ticket (:meth:`hpccomm.ledger.Ledger.post`).
    """
    if _control is None:
        return []
    _collect_goodbyes()
    return _said.abandoned(book, op, peer, ticket)


def _collect_goodbyes(wait: bool = False) -> None:
    """Receive the goodbyes that have arrived.

    Args:
        wait: take the lock even if another thread holds it (at exit);
            otherwise a thread that finds another collecting skips this round
            and sees the result in ``_said``.
    """
    if _control is None:
        return
    MPI = mpi()
    if not wait:
        try:
            # The usual answer, nothing, without the lock: with the lock taken around the probe a check cost
            # 4-5 us more than the probe alone (measured at 16 ranks on one node, 2 cores; the cause not found).
            if not _control.Iprobe(_ANY_SOURCE, GOODBYE_TAG):
                return
        except MPI.Exception:
            pass  # ULFM: a rank failed; acknowledged below
    if not _inbox_lock.acquire(blocking=wait):
        return
    try:
        asking, news = [], False
        while True:
            try:
                message = _control.improbe(_ANY_SOURCE, GOODBYE_TAG, _status)
            except MPI.Exception:
                # ULFM (fault-tolerant mode): a rank failed; probing any source goes on once that is acknowledged.
                # Its failure reaches its groups as PeerFailure, not as a goodbye.
                _control.Ack_failed()
                break
            if message is None:
                break
            peer = _status.Get_source()
            word, content = message.recv()
            counts["received"] += 1
            if word == _NEWS:
                asking += _take_news(content, peer)
                news = True
                continue
            _said.add(peer, content)  # a goodbye with what concerns this rank: its point-to-point counts too
            if _news is None and word == _FAILING:
                asking.append(peer)
        if news:
            _pass_on()  # a waiting rank passes news on as it comes (in batches at most every _RELAY_S)
        asking = [peer for peer in asking if peer not in _answered]
        if asking and flight_recorder.write(_rank):
            for peer in asking:  # the asking rank waits for this word before it aborts the job
                _answered.add(peer)
                _answers.append(_control.Isend((bytearray(_LEAVING), MPI.BYTE), peer, RECORDED_TAG))
    finally:
        _inbox_lock.release()


def _take_news(batch: tuple[tuple[int, goodbye_tree.Record], ...], source: int) -> list[int]:
    """Take in departure records from a tree neighbour (under the inbox lock); the failing ranks among them.

    A departed rank's facts come from its record alone where this rank is not
    its partner; a partner's come with the departed rank's own goodbye.
    """
    failing = []
    for peer, record in _news.learn(batch, source):  # never this rank's own: it learns that before sending it
        if not goodbye_tree.is_partner(record, _me):
            _said.add(peer, goodbye_tree.facts_from(record))
        if record[0] == _FAILING:
            failing.append(peer)
    return failing
