"""A collective request's life: init and post, poll until it ends, finalize.

:class:`Request` starts with ``ucc_collective_init`` then
``ucc_collective_post`` (UCC 1.8 does not implement the combined
``ucc_collective_init_and_post``) in one C call, or with the init alone and
the post later (:meth:`Request.post`, or :meth:`Request.post_on` a CUDA
stream's execution engine): collectives must be initialised in the same order
on every rank, but device memory is posted only once the caller's stream has
produced it. Each :meth:`Request.test` progresses the context once and reads
the request's status, finalizing the request in the same C call once it has
ended (``cffi_build/ucc.c``). A positive status is not an end: UCC reports
``UCC_OPERATION_INITIALIZED`` for a request initialised and not yet posted,
and after a triggered post until the stream has reached it, then
``UCC_INPROGRESS``. An error status becomes a
:class:`~hpccomm.ucc.errors.UCCError` from :meth:`Request.result`.
"""

from __future__ import annotations

from typing import Any

from .context import Context
from .errors import UCCError, check, describe


class Request:
    """One posted collective on a team. Made by :meth:`~hpccomm.ucc.team.Team.post`.

    Args:
        context: the team's context (its binding, lock and handle).
        team: the team's ``ucc_team_h``.
        live: the team's requests that have not ended: this one is in it
            until it ends.
        args: a filled ``ucc_coll_args_t *``.
        keep: what UCC reads or writes until the request ends.
        post: False initialises only.

    Raises:
        UCCError: UCC refused the collective; nothing is left posted.

    Attributes:
        status: positive (UCC_OPERATION_INITIALIZED, UCC_INPROGRESS) until
            the request ends, then UCC_OK or an error status.
    """

    __slots__ = ("_binding", "_live", "_handle", "_keep", "status", "_lib", "_lock", "_context")

    def __init__(
        self, context: Context, team: Any, live: set[Request], args: Any, keep: Any, post: bool = True
    ) -> None:
        binding = context.binding
        lib = binding.lib
        cell = binding.ffi.new("ucc_coll_req_h *")
        with context.lock:
            if post:
                status = lib.hpccomm_ucc_start(team, args, cell)
            else:
                status = lib.hpccomm_ucc_init(team, args, cell)
        check(binding, status, "ucc_collective_init/post" if post else "ucc_collective_init")
        self._binding = binding
        self._live = live
        self._handle = cell[0]
        self._keep = keep
        self._lib = lib
        self._lock = context.lock
        self._context = context.handle
        self.status = lib.UCC_INPROGRESS if post else lib.UCC_OPERATION_INITIALIZED
        live.add(self)

    def post(self) -> None:
        """Post a request made with ``post=False``.

        Raises:
            UCCError: UCC refused it; the request has ended (nothing is left posted).
        """
        with self._lock:
            status = self._lib.hpccomm_ucc_post(self._handle)
        self._posted(status, "ucc_collective_post")

    def post_on(self, ee: Any) -> None:
        """Post a request made with ``post=False`` on an execution engine (``ucc_collective_triggered_post``).

        UCC starts it once the engine's CUDA stream reaches this point and holds
        the stream until it has completed; :meth:`test` still tells the host.

        Raises:
            UCCError: UCC refused it; the request has ended.
        """
        with self._lock:
            status = self._lib.hpccomm_ucc_triggered_post(ee, self._handle)
        self._posted(status, "ucc_collective_triggered_post")

    def _posted(self, status: int, call: str) -> None:
        if status == self._lib.UCC_OK:
            return
        # Finalized by the C helper: the request has ended.
        self.status = status
        self._handle = None
        self._keep = None
        self._live.discard(self)
        raise UCCError(status, f"{call}: {describe(self._binding, status)}")

    def test(self) -> bool:
        """Progress once; True once the request has ended (successfully or not).

        A request initialised and not posted yet never ends: polling it only
        progresses the context.
        """
        if self._handle is None:
            return True
        with self._lock:
            status = self._lib.hpccomm_ucc_poll(self._context, self._handle)
        if status > 0:  # UCC_INPROGRESS, or UCC_OPERATION_INITIALIZED (not posted, or triggered and waiting)
            return False
        # Ended, and finalized by the poll: UCC no longer touches the buffers.
        self.status = status
        self._handle = None
        self._keep = None
        self._live.discard(self)
        return True

    def result(self, what: str = "collective") -> None:
        """Raise :class:`UCCError` if the request ended with an error.

        Args:
            what: the operation, for the message.
        """
        if self.status != self._lib.UCC_OK:
            if self.status > 0:
                raise RuntimeError(f"{what}: the UCC request has not ended")
            raise UCCError(self.status, f"{what}: {describe(self._binding, self.status)}")
