"""A UCC team: the ranks of one group, on a context; collectives are posted on it.

Creating a team is collective over its ranks (an MPI communicator, whose
ranks bootstrap through the out-of-band allgather, used only then); its
ranks may be any subset of the context's. It gives up at its timeout,
whether it waits in the out-of-band allgather (there also once a peer left
without its part) or past it: UCC's own set-up of the team, over its team
layers, waits for every rank too. A team whose creation gave up is kept, and
its context with it, for the process's end: UCC may be inside that creation
yet. Destroying a team is local. A team keeps track of its posted requests:
one that is still in flight when the team ends (its operation timed out, or
its group was aborted) may still be written to by UCC, so the team, its
requests and their buffers are then kept, never freed, until the process
ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .context import Context
from .errors import UCCError, check, describe
from .oob import OutOfBand
from .request import Request

#: Teams that ended with requests in flight, or whose creation failed: kept alive, with what UCC may still touch.
_kept: list[Team] = []
#: Polls of a team's creation between checks of its deadline (each costs more than a poll).
_POLLS_PER_CHECK = 64


class Team:
    """A UCC team over the ranks of an MPI communicator, on ``context``. Collective.

    Args:
        context: the context (created over these ranks or a superset).
        comm: the team's ranks; a rank's team rank is its rank in ``comm``.
        timeout_s: how long creation waits for the other ranks, in the
            out-of-band allgather and past it.
        abandoned: asked while the out-of-band allgather waits; returns why to give up, or None.
        own: ``comm`` is handed over: the team bootstraps on it and frees it,
            instead of on a duplicate (see :class:`~hpccomm.ucc.oob.OutOfBand`).

    Raises:
        UCCError: creation failed (a team whose creation failed half-way
            cannot be destroyed by UCC: it is kept).
    """

    def __init__(
        self,
        context: Context,
        comm: Any,
        timeout_s: float,
        abandoned: Callable[[], str | None] | None = None,
        own: bool = False,
    ) -> None:
        self.context = context
        self.binding = context.binding
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()
        #: Posted requests that have not ended yet.
        self.live: set[Request] = set()
        #: Execution engines (CUDA streams) made on this team: destroyed before it.
        self._engines: list[Any] = []
        ffi, lib = self.binding.ffi, self.binding.lib
        deadline = time.monotonic() + timeout_s
        self._oob = OutOfBand(comm, abandoned, timeout_s, own)
        params = ffi.new("ucc_team_params_t *")
        params.mask = lib.UCC_TEAM_PARAM_FIELD_EP | lib.UCC_TEAM_PARAM_FIELD_EP_RANGE | lib.UCC_TEAM_PARAM_FIELD_OOB
        params.ep = self.rank
        params.ep_range = lib.UCC_COLLECTIVE_EP_RANGE_CONTIG
        self._oob.fill(params.oob)
        handle = ffi.new("ucc_team_h *")
        context_handle = ffi.new("ucc_context_h *", context.handle)
        with context.lock:
            status = lib.ucc_team_create_post(context_handle, 1, params, handle)
        if status != lib.UCC_OK:
            self._oob.close()
            raise UCCError(status, f"ucc_team_create_post: {describe(self.binding, status)}")
        self.handle: Any = handle[0]

        def give_up() -> str | None:
            # The deadline alone: past the out-of-band allgather (whose own test says why it gave up, a
            # departure included) every rank has posted each step, so no departure reads as one without its part.
            if time.monotonic() > deadline:
                return f"its creation did not end within {timeout_s:g} s: a peer rank did not finish it"
            return None

        status, why = self._progress_until_done(lib.ucc_team_create_test, give_up)
        if status != lib.UCC_OK:
            # UCC may be inside its creation yet: the team is never destroyed, nor the context under it
            # (counted among its teams, it is left for the process's end, as for a team with a request in flight).
            _kept.append(self)
            context.teams.add(self)
            why = f" ({why})" if why else self._oob.why_failed()
            raise UCCError(status, f"ucc_team_create_test: {describe(self.binding, status)}{why}")
        # UCC calls a team's out-of-band allgather only while the team is
        # created: its communicator is freed now. The OutOfBand itself stays
        # referenced, so the handle UCC holds in its params stays valid.
        self._oob.close()
        context.teams.add(self)

    def _progress_until_done(
        self, step: Callable[[Any], int], give_up: Callable[[], str | None] | None = None,
    ) -> tuple[int, str | None]:
        """Call ``step(handle)`` (a UCC team call that may be in progress), progressing the context, until it ends.

        Args:
            step: the UCC call.
            give_up: asked now and then while it is in progress: why to stop
                waiting (a deadline passed), or None to go on.

        Returns:
            The last status, which is not ``UCC_INPROGRESS`` (``UCC_ERR_TIMED_OUT``
            where ``give_up`` said why, the step still in progress), and that why.
        """
        lib = self.binding.lib
        lock, context = self.context.lock, self.context.handle
        polls = 0
        while True:
            # The lock is let go between polls: other groups' work progresses meanwhile.
            with lock:
                status = step(self.handle)
                if status != lib.UCC_INPROGRESS:
                    return status, None
                lib.ucc_context_progress(context)
            polls += 1
            if give_up is not None and polls % _POLLS_PER_CHECK == 0 and (why := give_up()) is not None:
                return lib.UCC_ERR_TIMED_OUT, why

    def post(self, args: Any, keep: Any = None, post: bool = True) -> Request:
        """Initialise and post a collective.

        Args:
            args: a filled ``ucc_coll_args_t *`` (UCC copies it: reusable at once).
            keep: what UCC reads or writes until the request ends (tensors,
                count arrays); held by the request.
            post: False initialises only: the caller posts it later
                (:meth:`Request.post`), in the order of initialisation.

        Raises:
            UCCError: UCC refused the collective; nothing is left posted.
        """
        return Request(self.context, self.handle, self.live, args, keep, post)

    def execution_engine(self, cuda_stream: int) -> Any:
        """A UCC execution engine on a CUDA stream, for triggered posts (:meth:`Request.post_on`).

        Args:
            cuda_stream: the ``cudaStream_t`` (torch's ``Stream.cuda_stream``).

        Raises:
            UCCError: UCC made none (a UCC without CUDA support says NOT_SUPPORTED).
        """
        ffi, lib = self.binding.ffi, self.binding.lib
        cell = ffi.new("ucc_ee_h *")
        with self.context.lock:
            status = lib.hpccomm_ucc_ee_create(self.handle, ffi.cast("void *", cuda_stream), cell)
        check(self.binding, status, "ucc_ee_create")
        self._engines.append(cell[0])
        return cell[0]

    def destroy(self, in_flight: bool = False) -> bool:
        """``ucc_team_destroy`` (local); True if the team was destroyed.

        Args:
            in_flight: some operation on the team ended without completing,
                so UCC may still work on it: keep the team (and its requests)
                instead of destroying it.
        """
        if self.handle is None:
            return True
        if in_flight or self.live:
            _kept.append(self)
            self.handle = None
            return False
        with self.context.lock:
            for engine in self._engines:
                self.binding.lib.ucc_ee_destroy(engine)
        self._engines = []
        status, _ = self._progress_until_done(self.binding.lib.ucc_team_destroy)
        self.handle = None
        self.context.teams.discard(self)
        check(self.binding, status, "ucc_team_destroy")
        return True
