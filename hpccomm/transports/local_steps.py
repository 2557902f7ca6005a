"""Local steps around a transport's communication: staging copies, aliasing, AVG and PREMUL_SUM.

Transports communicate contiguous buffers and plain reductions. What the
caller hands over may be neither: a non-contiguous tensor goes through a
contiguous stand-in that is copied back afterwards; an input that overlaps the
output is copied first; PREMUL_SUM multiplies the input before a SUM and AVG
divides the result after one. Each helper returns the tensor to communicate
and appends what must run after the communication to an ``after`` list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .mpi_types import Reduction

#: Local steps to run, in order, once the communication has completed.
After = list[Callable[[], None]]


def staged(tensor: torch.Tensor, after: After, copy_in: bool = True) -> torch.Tensor:
    """A contiguous tensor to communicate through; copies back when it is a stand-in."""
    if tensor.is_contiguous():
        return tensor
    stage = tensor.contiguous() if copy_in else torch.empty_like(tensor, memory_format=torch.contiguous_format)
    after.append(lambda: tensor.copy_(stage))
    return stage


def scatter_back(flat: torch.Tensor, outputs: Sequence[torch.Tensor]) -> Callable[[], None]:
    """A step that copies consecutive slices of ``flat`` into ``outputs``."""

    def copy_out() -> None:
        offset = 0
        for out in outputs:
            n = out.numel()
            out.copy_(flat[offset : offset + n].view(out.shape))
            offset += n

    return copy_out


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when two contiguous tensors share any bytes."""
    a_start, b_start = a.data_ptr(), b.data_ptr()
    return a_start < b_start + b.nbytes and b_start < a_start + a.nbytes and a.nbytes > 0 and b.nbytes > 0


def unaliased(send: torch.Tensor, recv: torch.Tensor) -> torch.Tensor:
    """``send``, or a copy of it when it overlaps ``recv``: MPI forbids aliased buffers."""
    return send.clone() if overlaps(send, recv) else send


def concat(tensors: Sequence[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The tensors' elements back to back in one new tensor."""
    if not tensors:
        return torch.empty(0, dtype=dtype)
    return torch.cat([t.reshape(-1) for t in tensors])


def premultiplied(tensor: torch.Tensor, reduction: Reduction, in_place: bool) -> torch.Tensor:
    """``tensor`` times PREMUL_SUM's factor (``tensor`` itself for other reductions)."""
    factor = reduction.premul_factor
    if factor is None:
        return tensor
    if isinstance(factor, torch.Tensor):
        factor = factor.to(device=tensor.device, dtype=tensor.dtype)
    return tensor.mul_(factor) if in_place else tensor * factor


def averager(tensor: torch.Tensor, reduction: Reduction, size: int) -> After:
    """AVG's division of the summed ``tensor`` by ``size`` (nothing for other reductions)."""
    if not reduction.divide_by_size:
        return []
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        return [lambda: tensor.div_(size)]
    return [lambda: tensor.div_(size, rounding_mode="trunc")]
