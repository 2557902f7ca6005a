"""The results a survivor keeps of its last collectives, to hand to survivors whose copy failed (fault-tolerant mode).

Even with the revoke ordered (:mod:`hpccomm.fault_tolerance.stop_points`), MPI can end one
collective unevenly when a rank dies around it: Open MPI's nonblocking
all-reduce of a few bytes was seen to complete on two survivors and fail on
the third (its send to the dead rank had been delivered, but the request was
still open when the death was learnt), 1 run in 39 of issue 32's reproducer
under load. Then one survivor would redo a step the others had finished.

Every collective whose result is the same on every rank (all-reduce,
broadcast, all-gather, barrier) has its CPU outputs kept once it completes,
the newest :data:`KEPT_OPERATIONS` of them: copied where they are at most
``HPCCOMM_FT_KEEP_BYTES`` (64 KiB); larger ones by reference (a copy costs a
pass over the result's memory on every call, as much as a fast all-reduce
of it), valid only while the tensor is unchanged: its version counter
(which every in-place torch operation on it or its views advances) is the
one it had, and no later operation of the group has been posted with the
same memory (an MPI write advances no counter). A tensor changed in a way
neither sees (through ``.data`` or a NumPy view) would be sent changed. When the
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
#: The operations whose result every rank shares; each one's outputs are its transport call's first argument (a
#: tensor or a list of them; a barrier has none).
_SHARED = frozenset({"allreduce", "broadcast", "allgather", "allgather_into", "barrier"})


def shared_outputs(op: str, args: Sequence[Any]) -> list[torch.Tensor] | None:
    """The outputs of ``op`` called with ``args`` if every rank ends with the same ones on the CPU; else None."""
    if op not in _SHARED:
        return None
    if not args:
        return []
    first = args[0]
    tensors = [first] if isinstance(first, torch.Tensor) else list(first)
    for tensor in tensors:
        if not tensor.is_cpu:
            return None
    return tensors


class KeptResults:
    """Copies of this rank's newest completed collectives' outputs, by operation number.

    Args:
        max_bytes: the largest result kept; a larger operation is not (0: none is).
    """

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        #: Operation number % KEPT_OPERATIONS -> (number, its outputs' bytes, or _Held for large ones): one
        #: list store a call, no lock.
        self._ring: list[tuple[int, list[bytes] | _Held] | None] = [None] * KEPT_OPERATIONS
        #: Storage address -> the number of the operation whose held outputs live there.
        self._held_at: dict[int, int] = {}

    def keep(self, number: int, outputs: Sequence[torch.Tensor]) -> None:
        """Copy ``outputs``, the result of completed operation ``number`` (if it is small enough)."""
        copies: list[bytes] | _Held
        tensor = outputs[0] if len(outputs) == 1 else None  # the hot path: one tensor
        size = tensor.nbytes if tensor is not None else sum(t.nbytes for t in outputs)
        if size > self._max_bytes:
            copies = _Held(outputs)
            for address in copies.addresses:
                self._held_at[address] = number
        elif tensor is not None and tensor.is_contiguous():
            # Bytes straight from memory: 0.6 us a call for a 4-byte all-reduce, where torch's clone() took 0.8.
            copies = [ctypes.string_at(tensor.data_ptr(), size)]
        else:
            copies = [ctypes.string_at(t.data_ptr(), t.nbytes) if t.is_contiguous() else _bytes_of(t) for t in outputs]
        slot = number % KEPT_OPERATIONS
        dropped = self._ring[slot]
        self._ring[slot] = (number, copies)
        if dropped is not None and isinstance(dropped[1], _Held):
            self._forget(dropped[0], dropped[1])

    def posting(self, args: Sequence[Any]) -> None:
        """Another operation is posted with ``args``: held results in the same memory are no longer valid."""
        if not self._held_at:
            return
        for value in args:
            for tensor in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(tensor, torch.Tensor):
                    number = self._held_at.get(tensor.untyped_storage().data_ptr())
                    if number is not None:
                        entry = self._ring[number % KEPT_OPERATIONS]
                        if entry is not None and entry[0] == number:
                            self._ring[number % KEPT_OPERATIONS] = None
                            self._forget(number, entry[1])

    def _forget(self, number: int, held: Any) -> None:
        for address in getattr(held, "addresses", ()):
            if self._held_at.get(address) == number:
                del self._held_at[address]

    def numbers(self) -> list[int]:
        """The operations whose results are kept (and, held ones, unchanged)."""
        return sorted(
            entry[0] for entry in list(self._ring)
            if entry is not None and (not isinstance(entry[1], _Held) or entry[1].unchanged())
        )

    def payload(self, number: int) -> list[bytes] | None:
        """Operation ``number``'s kept outputs, as bytes to send; None where they are gone or changed."""
        entry = self._ring[number % KEPT_OPERATIONS]
        if entry is None or entry[0] != number:
            return None
        if isinstance(entry[1], _Held):
            return entry[1].payload()
        return list(entry[1])


class _Held:
    """Outputs too large to copy on every call, held with their version counters."""

    def __init__(self, outputs: Sequence[torch.Tensor]) -> None:
        self.tensors = list(outputs)
        self.versions = [t._version for t in outputs]
        self.addresses = [t.untyped_storage().data_ptr() for t in outputs]

    def unchanged(self) -> bool:
        return [t._version for t in self.tensors] == self.versions

    def payload(self) -> list[bytes] | None:
        data = [_bytes_of(t) for t in self.tensors]
        return data if self.unchanged() else None


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
        if len(data) != tensor.nbytes:
            raise RuntimeError("hpccomm: another survivor's result does not fit this rank's tensor")
        if data:
            tensor.copy_(torch.frombuffer(bytearray(data), dtype=tensor.dtype).view(tensor.shape))
