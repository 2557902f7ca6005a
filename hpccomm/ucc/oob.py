"""UCC's out-of-band allgather, over an MPI communicator.

UCC bootstraps contexts and teams (exchanging worker addresses, agreeing on a
team id) through an allgather the caller supplies: three C callbacks that
start one, test it and free it. hpccomm's are Python callbacks (cffi's
``extern "Python"``) posting ``MPI_Iallgather`` on a communicator of the
group's ranks used for nothing else (a duplicate, or one handed over by the
caller), so no store is needed and bootstrap traffic never mixes with
anything else. UCC calls them only from inside the UCC call that
bootstraps (context or team creation, and the barrier in a context's
destroy), on the calling thread.

A waiting allgather can give up: past a deadline, or when the owner's
``abandoned`` callback names a reason (a peer that left the job). The test
callback then returns an error, which makes the UCC call fail instead of
waiting forever. MPI moves a buffer of this module's own (C memory, outside
Python's), copied from UCC's send buffer at the start and into its receive
buffer once complete, and freed only once MPI is done with it: an allgather
given up stays posted in MPI, which writes a late peer's part when it comes,
and by then UCC has freed its buffers (at exit, a crash in MPI's finalize),
as Python may have freed its own objects.
"""

from __future__ import annotations

import ctypes
import itertools
import time
from collections.abc import Callable
from typing import Any

from . import binding

_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]

#: Polls between checks of the deadline and of ``abandoned`` (each costs more than a poll).
_POLLS_PER_CHECK = 64

#: request id -> (its OutOfBand, [the posted MPI request, its polls, whether its result was copied out], (the
#: address of the buffer MPI moves, its bytes sent, UCC's receive buffer))
_requests: dict[int, tuple[OutOfBand, Any, Any]] = {}
_request_ids = itertools.count(1)
_callbacks_defined = False


class OutOfBand:
    """UCC's out-of-band allgather among the ranks of an MPI communicator.

    Args:
        comm: the communicator; duplicated, and the duplicate is owned.
        own: take ``comm`` itself instead (the caller hands it over and no
            longer uses it): it carries the allgathers, and :meth:`close`
            frees it.
        abandoned: asked now and then while an allgather waits; returns why to
            give up (a departed peer, say), or None to keep waiting. Where it
            has a ``step()`` method, each allgather calls it as it is posted
            (the owner counts them: a peer that left after its part of one
            is no reason to give up on it).
        timeout_s: seconds from now after which a waiting allgather gives up
            (see :meth:`give_up_after`); None waits for ever.

    Attributes:
        deadline: ``time.monotonic()`` value past which a waiting allgather
            gives up; None waits for ever (unless ``abandoned`` says otherwise).
        failure: why the last allgather gave up, or None.
    """

    def __init__(
        self,
        comm: Any,
        abandoned: Callable[[], str | None] | None = None,
        timeout_s: float | None = None,
        own: bool = False,
    ) -> None:
        self._binding = binding.load()
        _define_callbacks(self._binding)
        self._comm = comm if own else comm.Dup()
        self.size = self._comm.Get_size()
        self.rank = self._comm.Get_rank()
        self._abandoned = abandoned
        self.deadline: float | None = None
        self.give_up_after(timeout_s)
        self.failure: str | None = None
        self._handle = self._binding.ffi.new_handle(self)
        #: Allgathers that gave up while MPI still owned their buffers.
        self._stuck: list[Any] = []

    def give_up_after(self, timeout_s: float | None) -> None:
        """Set :attr:`deadline` ``timeout_s`` seconds from now (None: no deadline)."""
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def fill(self, oob: Any) -> None:
        """Point a ``ucc_oob_coll_t`` (of context or team params) at this allgather."""
        lib = self._binding.lib
        oob.allgather = lib.hpccomm_ucc_oob_allgather
        oob.req_test = lib.hpccomm_ucc_oob_test
        oob.req_free = lib.hpccomm_ucc_oob_free
        oob.coll_info = self._handle
        oob.n_oob_eps = self.size
        oob.oob_ep = self.rank

    def start(self, send: Any, recv: Any, nbytes: int) -> int:
        """Post an allgather of ``nbytes`` from ``send`` into ``recv``; a request id.

        MPI moves copies of this module's own (the module docstring); ``recv``
        gets the result once :meth:`test` has seen it complete.
        """
        from mpi4py import MPI

        ffi = self._binding.ffi
        own = 0
        if nbytes:
            own = _libc.malloc(nbytes * (self.size + 1))  # what this rank sends, then what every rank sent
            if not own:
                raise MemoryError(f"hpccomm: UCC's out-of-band allgather of {nbytes} bytes")
            ffi.memmove(ffi.cast("void *", own), send, nbytes)
            sendbuf = MPI.buffer.fromaddress(own, nbytes)
            recvbuf = MPI.buffer.fromaddress(own + nbytes, nbytes * self.size)
        else:
            sendbuf, recvbuf = bytearray(0), bytearray(0)
        self.failure = None
        step = getattr(self._abandoned, "step", None)
        if step is not None:
            step()
        request = self._comm.Iallgather([sendbuf, MPI.BYTE], [recvbuf, MPI.BYTE])
        request_id = next(_request_ids)
        _requests[request_id] = (self, [request, 0, False], (own, nbytes, recv))
        return request_id

    def test(self, request_id: int) -> int:
        """UCC_OK once the allgather completed (its result then in UCC's buffer), UCC_INPROGRESS, or an error once
        it gave up."""
        lib = self._binding.lib
        _oob, state, (own, nbytes, recv) = _requests[request_id]
        if state[2] or state[0].Test():
            if own and not state[2]:
                ffi = self._binding.ffi
                ffi.memmove(recv, ffi.cast("void *", own + nbytes), nbytes * self.size)
            state[2] = True
            return lib.UCC_OK
        state[1] += 1
        if state[1] % _POLLS_PER_CHECK == 0:
            reason = self._give_up_reason()
            if reason is not None:
                self.failure = reason
                return lib.UCC_ERR_TIMED_OUT
        return lib.UCC_INPROGRESS

    def free(self, request_id: int) -> None:
        """Forget a request and free its buffer; one that gave up keeps its buffer for good (MPI may still write
        it) and stays referenced."""
        entry = _requests.pop(request_id, None)
        if entry is None:
            return
        _oob, state, (own, _nbytes, _recv) = entry
        if state[2] or state[0].Test():
            if own:
                _libc.free(own)
        else:
            self._stuck.append(entry)

    def why_failed(self) -> str:
        """`` (why)`` for an error message when the last allgather gave up (:attr:`failure`); else empty."""
        return f" ({self.failure})" if self.failure else ""

    def _give_up_reason(self) -> str | None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            return "the out-of-band allgather timed out: a peer rank did not take part"
        return self._abandoned() if self._abandoned is not None else None

    def close(self) -> None:
        """Free the communicator (the duplicate, or the one handed over), unless an allgather on it never completed."""
        if self._comm is not None and not self._stuck:
            self._comm.Free()
        self._comm = None


def _define_callbacks(binding_: Any) -> None:
    """Attach the three ``extern "Python"`` callbacks of ``ucc_api.cdef`` (once)."""
    global _callbacks_defined
    if _callbacks_defined:
        return
    ffi, lib = binding_.ffi, binding_.lib
    error = int(lib.UCC_ERR_NO_MESSAGE)

    # An exception inside a callback is printed by cffi and UCC sees `error`.
    @ffi.def_extern(error=error)
    def hpccomm_ucc_oob_allgather(send: Any, recv: Any, nbytes: int, info: Any, request: Any) -> int:
        oob: OutOfBand = ffi.from_handle(info)
        request[0] = ffi.cast("void *", oob.start(send, recv, nbytes))
        return lib.UCC_OK

    @ffi.def_extern(error=error)
    def hpccomm_ucc_oob_test(request: Any) -> int:
        request_id = int(ffi.cast("uintptr_t", request))
        return _requests[request_id][0].test(request_id)

    @ffi.def_extern(error=error)
    def hpccomm_ucc_oob_free(request: Any) -> int:
        request_id = int(ffi.cast("uintptr_t", request))
        entry = _requests.get(request_id)
        if entry is not None:
            entry[0].free(request_id)
        return lib.UCC_OK

    _callbacks_defined = True
