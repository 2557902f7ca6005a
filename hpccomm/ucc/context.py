"""A UCC context: the communication resources (UCX workers, endpoints) teams run on.

A context is created collectively over an MPI communicator, whose ranks
exchange their addresses through the out-of-band allgather
(:mod:`hpccomm.ucc.oob`). Created that way (a "global" context) UCC connects
its endpoints up front and a small all-reduce costs about a third of what it
costs on a context created without one. Teams over any subset of those ranks
can then be created on it (:class:`~hpccomm.ucc.team.Team`).

Destroying a context is collective too: UCC's UCX layer ends with an
out-of-band barrier, so no rank tears down its endpoints while a peer's last
messages to it are still on the way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import UCCError, check, describe
from .library import Library
from .oob import OutOfBand


class Context:
    """A UCC context over the ranks of an MPI communicator. Collective.

    Args:
        comm: the ranks that share the context (duplicated for bootstrap).
        timeout_s: how long creation waits for the other ranks.
        abandoned: asked while bootstrap waits; returns why to give up, or None.
        library: the UCC library (default: the process's).

    Raises:
        UCCError: UCC refused (the message carries UCC's status string).
    """

    def __init__(
        self,
        comm: Any,
        timeout_s: float,
        abandoned: Callable[[], str | None] | None = None,
        library: Library | None = None,
    ) -> None:
        self.library = library or Library.instance()
        self.binding = self.library.binding
        self.lock = self.library.lock
        #: Teams on this context not destroyed yet.
        self.teams: set[Any] = set()
        ffi, lib = self.binding.ffi, self.binding.lib
        self._oob = OutOfBand(comm, abandoned, timeout_s)
        config = ffi.new("ucc_context_config_h *")
        handle = ffi.new("ucc_context_h *")
        params = ffi.new("ucc_context_params_t *")
        params.mask = lib.UCC_CONTEXT_PARAM_FIELD_OOB
        self._oob.fill(params.oob)
        # Never UCC_CONTEXT_PARAM_FIELD_MEM_PARAMS: its one-sided set-up fails on one rank.
        with self.lock:
            status = lib.ucc_context_config_read(self.library.handle, ffi.NULL, config)
            if status == lib.UCC_OK:
                try:
                    status = lib.ucc_context_create(self.library.handle, params, config[0], handle)
                finally:
                    lib.ucc_context_config_release(config[0])
        if status != lib.UCC_OK:
            why = self._oob.why_failed()
            self._oob.close()
            raise UCCError(status, f"ucc_context_create: {describe(self.binding, status)}{why}")
        self._oob.give_up_after(None)
        self.handle: Any = handle[0]
        self.library.contexts.add(self)

    def destroy(self, timeout_s: float) -> bool:
        """``ucc_context_destroy``, collective; True if it ran.

        A context with teams left (one holds an operation that never
        completed, or its creation gave up) is left alone for the process's end.

        Args:
            timeout_s: how long its closing barrier waits for the other ranks;
                past it (or once a peer left), UCC tears down without it.
        """
        if self.handle is None:
            return True
        if self.teams:
            return False
        self._oob.give_up_after(timeout_s)
        with self.lock:
            status = self.binding.lib.ucc_context_destroy(self.handle)
        self.handle = None
        self.library.contexts.discard(self)
        self._oob.close()
        check(self.binding, status, "ucc_context_destroy")
        return True
