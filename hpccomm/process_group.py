"""The ProcessGroup shell, for torch releases whose ``Backend`` Python cannot subclass (2.11-2.13).

There a Python backend must be a whole ``ProcessGroup`` (the torchft
pattern): torch calls its methods through the ProcessGroup trampoline. The
operations are :class:`~hpccomm.front.Front`'s; this shell adds what torch
reads off a group: its name and the device types it serves.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .front import Front
from .tracing import untraced


@untraced
class ProcessGroupHpccomm(Front, dist.ProcessGroup):
    """An hpccomm group that is itself the torch process group (torch <= 2.13).

    Takes :class:`~hpccomm.front.Front`'s arguments.
    """

    @property
    def group_name(self) -> str:
        return self._group_name

    def _set_group_name(self, name: str) -> None:
        self._group_name = self._ledger.name = name

    @property
    def _device_types(self) -> list[torch.device]:
        """The device types this group has a transport for.

        torch reads it to pick a device for object collectives and in DCP
        (``broadcast_from_rank0``, ``async_save``); a C++ process group derives
        it from its registered backends, which a Python group has none of.
        """
        return [torch.device(kind) for kind in self._transports]
