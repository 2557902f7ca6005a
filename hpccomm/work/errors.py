"""The errors an operation's wait ends with, and how they name the operation."""

from __future__ import annotations

import torch.distributed as dist

from .. import flight_recorder
from .pending import Label


class CommTimeoutError(dist.DistBackendError):
    """A collective or point-to-point operation did not complete in time.

    A ``torch.distributed.DistBackendError`` (and so a RuntimeError), as NCCL's
    timeouts are, and worded as torch's backends word theirs ("Timed out
    waiting <N>ms"), so code that catches or matches those catches this too.
    """

    __module__ = "hpccomm.work"  # its public name, in tracebacks and messages as before this module was split out


class GroupClosedError(RuntimeError):
    """The operation's group was aborted or shut down while it was pending."""

    __module__ = "hpccomm.work"


def timeout_error(label: Label, waited_s: float, final: bool = True) -> CommTimeoutError:
    """The error for an operation that did not complete within ``waited_s``.

    Args:
        final: the operation ends with it (its group timeout passed), so this
            rank's flight record is written, as NCCL writes its record on a
            timeout; False for a caller's own shorter wait, after which the
            operation goes on.
    """
    if final:
        flight_recorder.write()
    waited_ms = max(1, round(waited_s * 1000))
    return CommTimeoutError(
        f"hpccomm {describe(label)}: Timed out waiting {waited_ms}ms for it to complete; "
        "a peer rank may not have joined this operation"
    )


def describe(label: Label) -> str:
    """'<op> #<seq> on group <name> (<n> ranks)'."""
    op, group, seq, _peers, _ticket = label
    return f"{op} #{seq} on {group.describe()}"
