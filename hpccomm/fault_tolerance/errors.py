"""What a fault-tolerant program catches: :class:`PeerFailure`, and :func:`failed_ranks` for errors without their type."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist


class FailureSeen(Exception):
    """A waiting operation saw the group revoked or a rank of its node dead (internal: becomes PeerFailure)."""


class PeerFailure(dist.DistBackendError):
    """Ranks of this group died; the survivors agree which (fault-tolerant mode only).

    A ``torch.distributed.DistBackendError``, as NCCL's communicator errors are.
    Recover with ``dist.shrink_group(error.failed_ranks, group)``.

    Attributes:
        failed_ranks: the dead ranks, as ranks of the group the operation ran on,
            the same on every survivor.
        uneven: empty when every survivor stopped at the same operation of the
            group (the failed one), so that each redoes the same step. Else each
            survivor's first operation not completed (group rank -> operation
            number, counted from the group's first): a rank died in the middle
            of an operation that some survivors completed and others did not.
    """

    def __init__(self, message: str, failed_ranks: Sequence[int], uneven: dict[int, int] | None = None) -> None:
        super().__init__(message)
        self.failed_ranks = list(failed_ranks)
        self.uneven = dict(uneven or {})

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.failed_ranks, self.uneven))


def failed_ranks(group: dist.ProcessGroup | None = None) -> list[int] | None:
    """The ranks of ``group`` (default: the default group) its survivors agreed had failed, or None.

    None while no operation of the group has met a failure, and outside
    fault-tolerant mode. For errors that reach the program without their
    type: DDP's backward re-raises its gradient all-reduce's PeerFailure as a
    plain RuntimeError.

    Args:
        group: a group whose CPU backend is hpccomm's.
    """
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    backend = group._get_backend(torch.device("cpu"))
    return getattr(backend, "failed_ranks", None)
