"""The Backend shell: hpccomm as a ``torch.distributed.Backend`` (torch >= 2.14).

From torch 2.14 a Python class can subclass ``Backend``, and torch's own
``ProcessGroup`` wraps it per device type, as it wraps Gloo and NCCL: group
names, the flight recorder, coalesced point-to-point (``batch_isend_irecv``),
``split_group``, DeviceMesh and mixed strings such as ``"cpu:hpccomm,cuda:nccl"``
then work as torch expects. The operations are :class:`~hpccomm.front.Front`'s;
this shell adds torch's group API:

* ``split``: an MPI communicator split of this group's communicator, called
  by every rank of the group (``dist.split_group``; ``new_group`` when the
  default group has a bound device), with no store round trip;
* ``options``, ``set_timeout``, ``abort``/``shutdown`` and abort hooks;
* ``shrink`` (``dist.shrink_group``), in fault-tolerant mode
  (:mod:`hpccomm.fault_tolerance`);
* ``supports_*`` flags that say what hpccomm does; the calls it cannot serve
  (``merge``, ``new_window``, ``reconfigure``, and ``shrink`` outside
  fault-tolerant mode) raise an error naming the method and why.

torch's trampoline reads each ``supports_*`` flag as a Python attribute and
recurses without end where a subclass does not define it: all are defined.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import Backend

from . import progress, world
from .fault_tolerance import Recovery
from .front import BACKEND_NAME, Front
from .tracing import untraced

#: Builds a child group's backend on an MPI communicator: (comm, world ranks of its ranks, timeout).
ChildFactory = Callable[[Any, Sequence[int], timedelta], "HpccommBackend"]
#: Builds the survivors' default group on their communicator (fault-tolerant mode).
WorldFactory = Callable[[Any, timedelta], "HpccommBackend"]


@untraced
class HpccommBackend(Front, Backend):
    """An hpccomm group as one of torch's per-device backends (torch >= 2.14).

    Args:
        comm: an MPI communicator over the group's ranks, kept for ``split``
            (the transports own communicators of their own).
        make_child: builds the backend of a group split from this one.
        recovery: the group's failure state, in fault-tolerant mode (else None).
        make_world: for the default group in fault-tolerant mode, builds the
            survivors' default group when it is shrunk.
        front: :class:`~hpccomm.front.Front`'s arguments.
    """

    def __init__(
        self,
        *front: Any,
        comm: Any,
        make_child: ChildFactory,
        recovery: Recovery | None = None,
        make_world: WorldFactory | None = None,
    ) -> None:
        super().__init__(*front)
        self._comm = comm
        self._make_child = make_child
        self._recovery = recovery
        self._make_world = make_world
        self._abort_hooks: dict[int, Callable[[], None]] = {}

    # -- what torch reads off a backend ---------------------------------------

    @property
    def options(self) -> Backend.Options:
        options = Backend.Options(BACKEND_NAME, timeout=timedelta(seconds=self._timeout_s))
        options.global_ranks_in_group = list(self._global_ranks)
        options.group_name = self._group_name
        return options

    @property
    def supports_splitting(self) -> bool:
        return True

    @property
    def supports_coalescing(self) -> bool:
        return True

    @property
    def supports_abort_hooks(self) -> bool:
        return True

    @property
    def supports_shrinking(self) -> bool:
        return self._recovery is not None  # fault-tolerant mode

    @property
    def failed_ranks(self) -> list[int] | None:
        """The group's agreed failed ranks in fault-tolerant mode (:func:`hpccomm.failed_ranks`), else None."""
        return None if self._recovery is None else self._recovery.failed_ranks

    @property
    def supports_reconfigure(self) -> bool:
        return False

    @property
    def supports_window(self) -> bool:
        return False

    @property
    def _supports_time_estimate(self) -> bool:
        return False

    def supports_tensor_alloc(self, device_index: int) -> bool:
        return False

    def _set_group_uid(self, name: str) -> None:
        """torch names the group (``ProcessGroup._set_group_name`` reaches each backend here)."""
        super()._set_group_uid(name)  # the group's name, as torch reads it back
        self._group_name = self._ledger.name = name

    def allreduce_sparse(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """torch's entry for sparse tensors: the same all-reduce, which sums sparse tensors as Gloo does."""
        return self.allreduce(tensors, opts)

    # -- splitting -------------------------------------------------------------

    def split(self, store: Any, ranks: Sequence[int], opts: Backend.Options | None) -> "HpccommBackend":
        """The backend of the new group of this group's ``ranks``.

        Collective over this group: torch calls it on every rank, each with
        the ranks of its own new group (those in no new group pass another's).

        Args:
            store: the new group's store (unused: MPI connects the ranks).
            ranks: the new group's ranks, as ranks of this group, in their new order.
            opts: the new group's options (its timeout), or None for this group's.

        Raises:
            RuntimeError: this rank is in none of the new groups, after taking its
                part in the split (see the comment below).
        """
        ranks = [int(rank) for rank in ranks]
        member = self._rank in ranks
        comm = self._split(min(ranks) if member else None, ranks.index(self._rank) if member else 0)
        if not member:
            # torch's trampoline dereferences the None that would say "no group here" (a crash in
            # torch 2.15): fail this rank with the reason instead; the members' split has completed.
            raise RuntimeError(
                f"hpccomm split_group: rank {self._rank} of {self.describe()} is in none of the new groups; "
                "torch cannot take 'no group' back from a Python backend's split (it crashes), so put "
                "every rank in some group of split_ranks (a group of one rank will do)"
            )
        timeout = opts._timeout if opts is not None else timedelta(seconds=self._timeout_s)
        return self._make_child(comm, [self._global_ranks[rank] for rank in ranks], timeout)

    def perform_nocolor_split(self, device: torch.device | None = None) -> None:
        """Take part in a split that makes no group for this rank (torch calls it on non-members)."""
        self._split(None, 0)

    def _split(self, color: int | None, key: int) -> Any:
        if self._closed is not None:
            raise RuntimeError(f"hpccomm split: {self.describe()} was {self._closed}; create a new group")
        MPI = world.mpi()
        progress.engine().before_blocking_call()  # MPI_Comm_split blocks
        comm = self._comm.Split(MPI.UNDEFINED if color is None else color, key)
        return None if comm == MPI.COMM_NULL else comm

    # -- what hpccomm cannot do ------------------------------------------------

    def merge(self, store: Any, opts: Any, rank: int, size: int) -> None:
        raise RuntimeError(
            "hpccomm merge (ProcessGroup.merge_remote_group): joining groups of separately started jobs "
            "needs MPI_Comm_connect/accept across jobs, which hpccomm does not use; start one job with every rank"
        )

    def new_window(self, tensor: torch.Tensor | None = None) -> None:
        raise RuntimeError("hpccomm new_window: one-sided windows are not offered (supports_window is False)")

    def reconfigure(self, opts: Any) -> None:
        raise RuntimeError("hpccomm reconfigure: not offered; MPI fixes a group's membership (supports_reconfigure is False)")

    def get_reconfigure_handle(self) -> str:
        raise RuntimeError("hpccomm get_reconfigure_handle: not offered (supports_reconfigure is False)")

    def shrink(self, ranks_to_exclude: Sequence[int], shrink_flags: int = 0, opts_override: Any = None) -> "HpccommBackend":
        """The backend of this group without ``ranks_to_exclude`` (``dist.shrink_group``; fault-tolerant mode).

        Called by the survivors only. After a :class:`~hpccomm.fault_tolerance.PeerFailure`
        the new group runs on the communicator the survivors agreed on; without
        one, the excluded ranks are alive and simply left out.

        Args:
            ranks_to_exclude: ranks of this group; must include every failed rank.
            shrink_flags: torch's ``SHRINK_DEFAULT``/``SHRINK_ABORT`` (the same here:
                a failed group's operations have already ended).
            opts_override: the new group's options (its timeout), or None for this group's.

        Raises:
            PeerFailure: a rank died while the new group was made; shrink again
                with its ``failed_ranks`` (:meth:`Recovery.rebuild`).
        """
        if self._recovery is None:
            raise RuntimeError(
                "hpccomm shrink: only in fault-tolerant mode (hpccomm-run --ft, or HPCCOMM_FT=1 under "
                "mpirun --with-ft ulfm); otherwise a rank's failure ends the job"
            )
        excluded = sorted({int(rank) for rank in ranks_to_exclude})
        timeout = getattr(opts_override, "_timeout", None) or timedelta(seconds=self._timeout_s)
        if self._make_world is not None:
            make_world = self._make_world
            # The default group: torch renumbers the world.
            return self._recovery.rebuild(excluded, lambda comm: make_world(comm, timeout))
        remaining = [self._global_ranks[rank] for rank in range(self._size) if rank not in excluded]
        return self._recovery.rebuild(excluded, lambda comm: self._make_child(comm, remaining, timeout))

    def refill(self) -> bool:
        """The default group back at its size, in place, with spares in the dead ranks' places.

        Called by the survivors only (:func:`hpccomm.fault_tolerance.spares.repair`).
        The new world keeps every survivor's rank; this object (torch's group
        around it, its name, its device) stays, and runs on the new world from
        now on. False, with nothing changed, where too few spares are left.
        """
        if self._recovery is None or self._make_world is None:
            raise RuntimeError("hpccomm repair: only the default group, in fault-tolerant mode, is repaired with spares")
        from .fault_tolerance import spares

        comm = spares.refill()
        if comm is None:
            return False
        make_world, timeout = self._make_world, timedelta(seconds=self._timeout_s)
        rebuilt = spares.build_checked(comm, lambda comm: make_world(comm, timeout))
        if rebuilt is None:
            return False
        self._close("repaired")
        kept = {"_group_name": self._group_name, "_abort_hooks": self._abort_hooks}
        self.__dict__.update(rebuilt.__dict__)
        self.__dict__.update(kept)
        self._ledger.name = self._group_name  # the repaired group's operations are counted under the group's name
        # Its parts (and what they were given: its description, for messages) are this group's now: one state.
        rebuilt.__dict__ = self.__dict__
        return True

    # -- ending ------------------------------------------------------------------

    def registerAbortHook(self, hook_id: int, hook: Callable[[], None]) -> None:  # noqa: N802 (torch's trampoline name)
        """Run ``hook`` when this group is aborted (``ProcessGroup.register_abort_hook``)."""
        self._abort_hooks[hook_id] = hook

    def unregisterAbortHook(self, hook_id: int) -> None:  # noqa: N802 (torch's trampoline name)
        self._abort_hooks.pop(hook_id, None)

    register_abort_hook = registerAbortHook
    unregister_abort_hook = unregisterAbortHook

    def abort(self) -> None:
        """End the group now (pending work fails), then run the abort hooks."""
        super().abort()
        hooks, self._abort_hooks = list(self._abort_hooks.values()), {}
        for hook in hooks:
            hook()

    def _close(self, how: str) -> None:
        first = self._closed is None
        super()._close(how)
        if first:
            self._comm.Free()

