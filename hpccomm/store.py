"""The job's store, served over MPI: no listening socket, no host name.

torch keeps a key-value :class:`~torch.distributed.Store` beside every process
group: gloo's and NCCL's rendezvous, ``monitored_barrier`` and torch's
store-based barriers read and write keys there. torch's own ``TCPStore``
listens on a port of rank 0's node and is found by host name. Under MPI the
ranks already share a channel that needs neither: :class:`MPIStore` sends each
store operation to ``MPI_COMM_WORLD`` rank 0 on hpccomm's control
communicator (:func:`hpccomm.world.control`, made as MPI starts; the store
adds none, nor the round of agreement among all ranks that making one takes),
on tags of its own, where a thread of rank 0's process answers it, so no rank
waits for rank 0's main thread to reach a store call; rank 0's own operations
are served in the calling thread.

Operations and their answers are pickled Python tuples. Every operation gets
exactly one answer: an operation that waits for keys (``get``, ``wait``,
``multi_get``) is parked by the server until its keys are set or its timeout
(the store's, or ``wait``'s own) passes, and the server itself answers the
timeout. A client that hears nothing ``_SERVER_GRACE_S`` past its timeout, or
whose MPI reports rank 0 failed (fault-tolerant mode, ULFM), raises
:class:`~torch.distributed.DistStoreError` naming the operation, never
waits on. Each rendezvous (``init_process_group`` after a destroy) gets a
table of its own, so keys of an earlier group never leak into a new one.

The server's thread looks for operations without a pause while they come,
then ever less often, up to every 0.2 s (the first operation after a quiet
spell waits that long): each look takes the GIL from rank 0's other threads,
which on a node with more ranks than cores slowed init_process_group (the
constants below say how much). The server needs ``MPI_THREAD_MULTIPLE``. At
exit, once fail-fast's goodbye is out (:func:`hpccomm.failure.after_goodbye`),
rank 0 serves on until every other rank has said goodbye to the store (its own
exit step) or has failed, then stops its thread before MPI is finalised. No
clock ends the wait: a rank still running may still use the store, however
long after rank 0 left (under the 30 s bound this wait had until 2026-11-28,
its later operations went unanswered until their own timeout), and a process
that ends without any exit step is seen by the launcher, which ends the job
(Open MPI's and MPICH's both do, also at exit status 0).
"""

from __future__ import annotations

import atexit
import collections
import itertools
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, NamedTuple

import torch.distributed as dist

from . import failure, world

#: How often the server looks for operations: back to back for _SPIN_S after the last one (a client's next
#: operation follows its answer within microseconds), every _FAST_NAP_S within _FAST_S of it (operations come
#: in bursts: a group's rendezvous), then ever less often: a tenth of the time since, at least _SLOW_NAP_S, at
#: most _IDLE_NAP_S (reached 2 s after the last operation, and from the start: init_process_group itself makes
#: none). Each look needs the GIL, which rank 0's other threads must then give up; on an oversubscribed node
#: that handover costs a scheduler turn. Measured on two fake nodes of 4 ranks each (8 processes, 2 cores),
#: init_process_group took 4.3-4.7 s with TCPStore; with this server looking every 5 ms 5.7-12.8 s, every 50
#: ms 4.9-5.0 s, every 200 ms 4.3-5.1 s. The price: the first operation after a quiet spell waits up to
#: _IDLE_NAP_S. A client waiting on an answer looks back to back for _SPIN_S, then naps _FAST_NAP_S, growing to
#: _SLOW_NAP_S (it waits in its own thread: nobody gives up the GIL for it). Back to back means without sleeping: here
#: ``time.sleep(0)`` took about 120 us, and a round trip over MPI polled with it 245 us (15 us without).
_SPIN_S = 0.002
_FAST_NAP_S = 0.0002
_FAST_S = 0.05
_SLOW_NAP_S = 0.005
_IDLE_NAP_S = 0.2


def _server_nap(quiet_s: float) -> float:
    """How long the server sleeps before looking again, ``quiet_s`` after the last operation (0: do not)."""
    if quiet_s < _SPIN_S:
        return 0.0
    if quiet_s < _FAST_S:
        return _FAST_NAP_S
    return min(_IDLE_NAP_S, max(_SLOW_NAP_S, quiet_s / 10))


def _client_nap(waited_s: float) -> float:
    """How long a client sleeps before looking for its answer again, ``waited_s`` after asking (0: do not)."""
    if waited_s < _SPIN_S:
        return 0.0
    return min(_SLOW_NAP_S, max(_FAST_NAP_S, waited_s / 100))


#: How long past an operation's timeout a client waits for the server's own timeout answer.
_SERVER_GRACE_S = 10.0
#: Operations that wait for their keys, and where their keys are among the arguments.
_WAITING = {"get": lambda args: [args[0]], "wait": lambda args: args[0], "multi_get": lambda args: args[0]}

Answer = Callable[[tuple], None]


def _as_bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class _Parked(NamedTuple):
    """An operation waiting for its keys on the server."""

    deadline: float
    generation: int
    op: str
    args: tuple
    answer: Answer

    def missing(self, table: dict[str, bytes]) -> list[str]:
        """The keys it waits for that ``table`` does not hold."""
        return [key for key in _WAITING[self.op](self.args) if key not in table]


class _Tables:
    """The keys of every rendezvous, and the operations parked until theirs are set (rank 0)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[int, dict[str, bytes]] = {}
        self._parked: list[_Parked] = []

    def serve(self, generation: int, op: str, args: tuple, timeout_s: float, answer: Answer) -> None:
        """Carry out ``op`` and ``answer`` it, now or once its keys are set."""
        with self._lock:
            table = self._tables.setdefault(generation, {})
            if op in _WAITING:
                parked = _Parked(time.monotonic() + timeout_s, generation, op, args, answer)
                if parked.missing(table):
                    self._parked.append(parked)
                else:
                    answer(("ok", _read(table, op, args)))
                return
            try:
                result = _write(table, op, args)
            except (KeyError, ValueError) as error:
                answer(("error", str(error)))
                return
            answer(("ok", result))
            self._answer_where(lambda parked: parked.generation == generation and not parked.missing(table),
                               lambda parked: ("ok", _read(table, parked.op, parked.args)))

    def expire(self, now: float) -> None:
        """Answer parked operations whose timeout has passed."""
        with self._lock:
            self._answer_where(lambda parked: parked.deadline <= now,
                               lambda parked: ("timeout", parked.missing(self._tables[parked.generation])))

    def close(self) -> None:
        """Answer every parked operation: the server is going away."""
        with self._lock:
            self._answer_where(lambda parked: True, lambda parked: ("closed", None))

    def _answer_where(self, due: Callable[[_Parked], bool], reply: Callable[[_Parked], tuple]) -> None:
        """Answer the parked operations that are ``due`` with ``reply``, keep the others. Holds the lock."""
        waiting = []
        for parked in self._parked:
            if due(parked):
                parked.answer(reply(parked))
            else:
                waiting.append(parked)
        self._parked = waiting


def _read(table: dict[str, bytes], op: str, args: tuple) -> Any:
    if op == "get":
        return table[args[0]]
    if op == "multi_get":
        return [table[key] for key in args[0]]
    return None  # wait


def _write(table: dict[str, bytes], op: str, args: tuple) -> Any:
    if op == "set":
        table[args[0]] = args[1]
        return None
    if op == "multi_set":
        table.update(zip(args[0], args[1]))
        return None
    if op == "add":
        key, amount = args
        try:
            value = int(table.get(key, b"0")) + amount
        except ValueError:
            raise ValueError(f"add: the value of key {key!r} is not an integer") from None
        table[key] = str(value).encode()
        return value
    if op == "compare_set":
        # As TCPStore: a missing key is set only when ``expected`` is empty; the answer is the value now held
        # (``expected`` for a missing key that was not set).
        key, expected, desired = args
        if key not in table:
            if expected:
                return expected
            table[key] = desired
        elif table[key] == expected:
            table[key] = desired
        return table[key]
    if op == "append":
        table[args[0]] = table.get(args[0], b"") + args[1]
        return None
    if op == "check":
        return all(key in table for key in args[0])
    if op == "delete":
        return table.pop(args[0], None) is not None
    if op == "num_keys":
        return len(table)
    raise ValueError(f"unknown store operation {op!r}")


class _Server:
    """Rank 0's thread: receives operations on ``comm`` and answers them."""

    def __init__(self, comm: Any, tables: _Tables) -> None:
        self._comm = comm
        self._tables = tables
        # Answers are posted by the thread that completes an operation (a rank 0 thread's set may release a
        # parked get): appended here from any thread, tested by the server's thread alone.
        self._posted: collections.deque[Any] = collections.deque()
        self._goodbyes: set[int] = set()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpccomm-store", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._serve_until_stopped()
        except Exception as error:  # never silently: clients would wait for their timeouts
            print(f"hpccomm: the store's server on rank 0 stopped: {error!r}", file=sys.stderr, flush=True)
        finally:
            self._tables.close()
            self._flush(deadline=time.monotonic() + 1.0)

    def _serve_until_stopped(self) -> None:
        MPI = world.mpi()
        status = MPI.Status()
        last = time.monotonic() - 10 * _IDLE_NAP_S  # quiet from the start: init_process_group makes no operation
        while True:
            try:
                message = self._comm.improbe(MPI.ANY_SOURCE, world.STORE_OPERATION_TAG, status)
            except MPI.Exception:
                # ULFM: a rank failed; receiving from any source goes on once the failure is acknowledged.
                # Then the usual nap: an error that comes back at every look must not spin holding the GIL.
                self._comm.Ack_failed()
                message = None
            now = time.monotonic()
            if message is not None:
                self._serve(status.Get_source(), message.recv())
                last = now
                continue
            self._tables.expire(now)
            self._flush()
            if self._stopping.is_set() and self._everyone_left():
                return
            nap = _server_nap(now - last)
            if nap:
                self._stopping.wait(nap)  # a sleep that stop() cuts short

    def _flush(self, deadline: float | None = None) -> None:
        """Complete posted answers (all of them, or until ``deadline``, when one is given)."""
        while True:
            pending = [self._posted.popleft() for _ in range(len(self._posted))]
            self._posted.extend(send for send in pending if not _done(send))
            if deadline is None or not self._posted or time.monotonic() > deadline:
                return
            time.sleep(_FAST_NAP_S)

    def _serve(self, source: int, message: tuple) -> None:
        tag, generation, op, args, timeout_s = message
        if op == "goodbye":
            self._goodbyes.add(source)
            return

        def answer(reply: tuple) -> None:
            self._posted.append(self._comm.isend(reply, dest=source, tag=tag))

        self._tables.serve(generation, op, args, timeout_s, answer)

    def _everyone_left(self) -> bool:
        """Whether every other world rank has said goodbye or failed (spares, processes but not ranks, never ask)."""
        failed = world.failed_ranks(self._comm)
        me = self._comm.Get_rank()
        ranks = world.mpi_world_ranks(range(world.identity().world_size))
        return all(rank in self._goodbyes or rank in failed for rank in ranks if rank != me)

    def stop(self) -> None:
        """Serve until every other rank has said goodbye or failed, then stop."""
        self._stopping.set()
        self._thread.join()


def _done(send: Any) -> bool:
    try:
        return send.Test()
    except world.mpi().Exception:  # its rank failed (ULFM): nobody is left to receive it
        return True


class _Channel:
    """This process's way to the server: the control communicator, and rank 0's tables and thread."""

    def __init__(self) -> None:
        MPI = world.mpi()
        self.comm = world.control()
        self.rank = self.comm.rank
        self._tags = itertools.count()
        self._tag_ub = min(int(self.comm.Get_attr(MPI.TAG_UB)), 1 << 30)
        self.tables = _Tables() if self.rank == 0 else None
        self._server = _Server(self.comm, self.tables) if self.tables is not None else None
        self.generations = itertools.count()
        # torch keeps a store only as the C++ object under its PrefixStore; pybind11 finds the methods
        # below through the Python object, which must therefore outlive it: it lives as long as the process.
        self.stores: list[MPIStore] = []
        # After fail-fast's goodbye: rank 0 serving on must not keep the others from learning that it left (they
        # waited up to 30 s, the bound this wait had then, for a rank 0 that had left a collective unjoined).
        if not failure.after_goodbye(self.close):
            atexit.register(self.close)

    def call(self, generation: int, op: str, args: tuple, timeout_s: float) -> Any:
        """Carry out ``op`` on the server and return its result; raises DistStoreError."""
        if self.tables is not None:
            reply = self._local(generation, op, args, timeout_s)
        else:
            reply = self._remote(generation, op, args, timeout_s)
        kind, value = reply
        if kind == "ok":
            return value
        if kind == "timeout":
            raise dist.DistStoreError(
                f"hpccomm: store {op} timed out after {timeout_s * 1000:.0f} ms waiting for key(s) {value}"
            )
        if kind == "closed":
            raise dist.DistStoreError(
                f"hpccomm: store {op}: the job's store has shut down (rank 0, which serves it, is exiting)"
            )
        raise dist.DistStoreError(f"hpccomm: store {value}")

    def _local(self, generation: int, op: str, args: tuple, timeout_s: float) -> tuple:
        answered = threading.Event()
        replies: list[tuple] = []

        def answer(reply: tuple) -> None:
            replies.append(reply)
            answered.set()

        self.tables.serve(generation, op, args, timeout_s, answer)
        if not answered.wait(timeout_s + _SERVER_GRACE_S):
            return ("timeout", _WAITING[op](args))
        return replies[0]

    def _remote(self, generation: int, op: str, args: tuple, timeout_s: float) -> tuple:
        MPI = world.mpi()
        tag = world.STORE_ANSWER_TAG + next(self._tags) % (self._tag_ub - world.STORE_ANSWER_TAG)
        asked = time.monotonic()
        give_up = asked + timeout_s + _SERVER_GRACE_S
        try:
            self.comm.send((tag, generation, op, args, timeout_s), dest=0, tag=world.STORE_OPERATION_TAG)
            while True:
                message = self.comm.improbe(0, tag)
                if message is not None:
                    return message.recv()
                now = time.monotonic()
                if now > give_up:
                    raise dist.DistStoreError(
                        f"hpccomm: store {op}: rank 0, which serves the job's store, did not answer in "
                        f"{timeout_s + _SERVER_GRACE_S:.0f} s"
                    )
                nap = _client_nap(now - asked)
                if nap:
                    time.sleep(nap)
        except MPI.Exception as error:
            raise dist.DistStoreError(
                f"hpccomm: store {op}: the job's store ran in MPI_COMM_WORLD rank 0, which has failed "
                f"({error.Get_error_string()}); store operations (new groups, gloo, barriers) are no longer "
                "possible in this job"
            ) from None

    def close(self) -> None:
        """At exit: say goodbye to the server, or (rank 0) serve until the others have."""
        if self._server is not None:
            self._server.stop()
            return
        try:
            self.comm.send((0, 0, "goodbye", (), 0.0), dest=0, tag=world.STORE_OPERATION_TAG)
        except world.mpi().Exception:
            pass  # rank 0 failed: there is nobody to tell


_channel: _Channel | None = None
_channel_lock = threading.Lock()


def _get_channel() -> _Channel:
    global _channel
    with _channel_lock:
        if _channel is None:
            _channel = _Channel()
        return _channel


class MPIStore(dist.Store):
    """A :class:`torch.distributed.Store` whose keys rank 0 keeps and serves over MPI.

    Collective: every rank of ``MPI_COMM_WORLD`` creates one, in the same order
    (hpccomm's rendezvous does, once per ``init_process_group``). Needs
    ``MPI_THREAD_MULTIPLE``.

    Args:
        timeout: how long operations that wait for keys wait (``set_timeout``
            changes it, as on any store).
    """

    def __init__(self, timeout: timedelta = dist.default_pg_timeout) -> None:
        super().__init__()
        channel = _get_channel()
        self._channel = channel
        self._generation = next(channel.generations)
        channel.stores.append(self)
        self.set_timeout(timeout)

    def _call(self, op: str, args: tuple, timeout: timedelta | None = None) -> Any:
        timeout_s = (self.timeout if timeout is None else timeout).total_seconds()
        return self._channel.call(self._generation, op, args, timeout_s)

    def set(self, key: str, value: bytes | str) -> None:
        """Set ``key`` to ``value``, waking whoever waits for it."""
        self._call("set", (key, _as_bytes(value)))

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting up to the store's timeout for it to be set."""
        return self._call("get", (key,))

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer at ``key`` (0 if unset) and return the sum."""
        return self._call("add", (key, int(amount)))

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is unset and ``expected`` is empty).

        Returns:
            the value ``key`` holds afterwards (``expected`` if it is unset and was not set).
        """
        return self._call("compare_set", (key, _as_bytes(expected), _as_bytes(desired)))

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        """Wait until every key of ``keys`` is set, up to ``timeout`` (default: the store's)."""
        self._call("wait", (list(keys),), timeout)

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key of ``keys`` is set, without waiting."""
        return self._call("check", (list(keys),))

    def deleteKey(self, key: str) -> bool:  # noqa: N802: the name torch's C++ Store calls
        """Delete ``key``; True if it was set."""
        return self._call("delete", (key,))

    delete_key = deleteKey

    def getNumKeys(self) -> int:  # noqa: N802: the name torch's C++ Store calls
        """How many keys this rendezvous's table holds."""
        return self._call("num_keys", ())

    num_keys = getNumKeys

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        """The values of ``keys``, waiting up to the store's timeout for all of them."""
        return self._call("multi_get", (list(keys),))

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        """Set each key of ``keys`` to the value at the same place in ``values``."""
        if len(keys) != len(values):
            raise ValueError(f"hpccomm: store multi_set: {len(keys)} keys but {len(values)} values")
        self._call("multi_set", (list(keys), [_as_bytes(value) for value in values]))

    def append(self, key: str, value: bytes | str) -> None:
        """Append ``value`` to the bytes at ``key`` (set it if unset)."""
        self._call("append", (key, _as_bytes(value)))

    def has_extended_api(self) -> bool:
        """Whether append, multi_get and multi_set are served (they are)."""
        return True

    def clone(self) -> "MPIStore":
        """This store: it is safe to use from several threads at once, so one object serves them all."""
        return self
