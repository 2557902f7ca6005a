"""The results a survivor keeps of its last collectives, to hand to survivors whose copy failed (fault-tolerant mode).

Even with the revoke ordered (:mod:`hpccomm.stop_points`), MPI can end one
collective unevenly when a rank dies around it: Open MPI's nonblocking
all-reduce of a few bytes was seen to complete on two survivors and fail on
the third (its send to the dead rank had been delivered, but the request was
still open when the death was learnt), 1 run in 39 of issue 32's reproducer
under load. Then one survivor would redo a step the others had finished.

Every collective whose result is the same on every rank (all-reduce,
broadcast, all-gather, barrier) and is at most ``HPCCOMM_FT_KEEP_BYTES``
(64 KiB) has a copy of its CPU outputs kept once it completes, the newest
:data:`KEPT_OPERATIONS` of them. Larger ones are not kept: a copy costs a
pass over the result's memory on every call, as much as a fast all-reduce
of it. When the
survivors find that some of them completed operation m and the others failed
it (and no survivor got further), a survivor that completed it sends its
copy to the others, whose operation m then completes with it: every
survivor stops at operation m + 1, and the redo pairs up.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import torch

#: How many of the newest results are kept: survivors more than one operation apart are not evened out.
KEPT_OPERATIONS = 16
#: Operation -> its output tensors, from the transport call's arguments: those whose result every rank shares.
_OUTPUTS = {
    "allreduce": lambda tensors, reduction: list(tensors),
    "broadcast": lambda tensor, root: [tensor],
    "allgather": lambda outputs, tensor: list(outputs),
    "allgather_into": lambda output, tensor: [output],
    "barrier": lambda: [],
}


def shared_outputs(op: str, args: Sequence[Any]) -> list[torch.Tensor] | None:
    """The outputs of ``op`` called with ``args`` if every rank ends with the same ones on the CPU; else None."""
    outputs = _OUTPUTS.get(op)
    if outputs is None:
        return None
    tensors = outputs(*args)
    return tensors if all(t.is_cpu for t in tensors) else None


class KeptResults:
    """Copies of this rank's newest completed collectives' outputs, by operation number.

    Args:
        max_bytes: the largest result kept; a larger operation is not (0: none is).
    """

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        #: Operation number % KEPT_OPERATIONS -> (number, its outputs' bytes): one list store a call, no lock.
        self._ring: list[tuple[int, list[bytes]] | None] = [None] * KEPT_OPERATIONS

    def keep(self, number: int, outputs: Sequence[torch.Tensor]) -> None:
        """Copy ``outputs``, the result of completed operation ``number`` (if it is small enough)."""
        if len(outputs) == 1:  # all-reduce and broadcast: 0.4 us a call here, where torch's clone() took 0.8
            tensor = outputs[0]
            size = tensor.nbytes
            if size > self._max_bytes:
                return
            copies = [ctypes.string_at(tensor.data_ptr(), size) if tensor.is_contiguous() else _bytes_of(tensor)]
        else:
            if sum(t.nbytes for t in outputs) > self._max_bytes:
                return
            copies = [ctypes.string_at(t.data_ptr(), t.nbytes) if t.is_contiguous() else _bytes_of(t) for t in outputs]
        self._ring[number % KEPT_OPERATIONS] = (number, copies)

    def numbers(self) -> list[int]:
        """The operations whose results are kept."""
        return sorted(entry[0] for entry in list(self._ring) if entry is not None)

    def payload(self, number: int) -> list[bytes]:
        """Operation ``number``'s kept outputs, as bytes to send."""
        entry = self._ring[number % KEPT_OPERATIONS]
        if entry is None or entry[0] != number:
            raise KeyError(number)
        return list(entry[1])


def _bytes_of(tensor: torch.Tensor) -> bytes:
    """A non-contiguous tensor's elements in order, as bytes."""
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""


def fill(outputs: Sequence[torch.Tensor], payload: Sequence[bytes]) -> None:
    """Write another survivor's kept result (:meth:`KeptResults.payload`) into this rank's ``outputs``.

    Raises:
        RuntimeError: the result does not fit the outputs (the survivors' operations differ).
    """
    if len(payload) != len(outputs):
        raise RuntimeError(f"hpccomm: another survivor's result has {len(payload)} tensors, this rank's {len(outputs)}")
    for tensor, data in zip(outputs, payload):
        if len(data) != tensor.numel() * tensor.element_size():
            raise RuntimeError("hpccomm: another survivor's result does not fit this rank's tensor")
        if data:
            tensor.copy_(torch.frombuffer(bytearray(data), dtype=tensor.dtype).view(tensor.shape))
