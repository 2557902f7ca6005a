"""From torch's process groups to hpccomm's: the lookup, and the calls hpccomm adds to a group.

torch hands the user its own ``ProcessGroup``; hpccomm's operations live on
the :class:`~hpccomm.front.Front` behind it. :func:`front_of` finds that
front, and the calls hpccomm offers beside torch's API go through it:
:func:`monitored_barrier`, which torch serves for Gloo only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _rank_not_in_group

from .front import Front


def front_of(group: object) -> Front | None:
    """The hpccomm group behind a torch process group, or None where hpccomm does not serve it.

    On torch >= 2.14 the group is torch's ProcessGroup and hpccomm its CPU
    backend; on older releases the group is hpccomm's own.

    Args:
        group: a torch process group (or hpccomm's own group).
    """
    if isinstance(group, Front):
        return group
    try:
        backend = group._get_backend(torch.device("cpu"))  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        return None
    return backend if isinstance(backend, Front) else None


def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """``torch.distributed.monitored_barrier`` for hpccomm groups (torch's serves Gloo only).

    The barrier itself is :class:`hpccomm.monitor.Monitor`'s.

    Args:
        group: an hpccomm process group; default: the default group. Ranks
            outside it return at once, as in torch.
        timeout: a timedelta or seconds; default: the group's timeout.
        wait_all_ranks: rank 0 names every missing rank, not just the first.

    Raises:
        MonitoredBarrierError: as :meth:`hpccomm.monitor.Monitor.barrier` describes.
        ValueError: ``group`` is not an hpccomm group.
    """
    if _rank_not_in_group(group):
        return
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    front = front_of(pg)
    if front is None:
        raise ValueError(
            f"hpccomm monitored_barrier: group uses backend '{dist.get_backend(pg)}', not hpccomm; "
            "use torch.distributed.monitored_barrier for Gloo groups"
        )
    front.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
