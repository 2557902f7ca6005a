"""How torch dtypes and ReduceOps map onto UCC datatypes and reduction ops.

Data movement carries any dtype: UCC's datatype of the same kind, or an
unsigned integer of the same width. Reductions use what UCC's CPU reduction
code (``ec/cpu``) actually implements, checked here before anything is
posted: UCC 1.8 accepts an unknown reduction op without complaint, and
reports a reduction its CPU code lacks as *complete* (leaving the data
unreduced), so an unchecked pair would return wrong numbers silently.

* float16 and bfloat16 on host memory are reduced as float32 copies and
  rounded back once (to nearest-even, by torch): UCC's CPU code has no
  float16 reduction, and its bfloat16 reduction truncates instead of rounding
  (bf16 1 + 3/256 gives 1.0078125 where torch gives 1.015625). On device
  memory UCC's CUDA reductions (``ec/cuda``) take them as they are.
* bool travels as uint8 0/1, where SUM/MAX mean "or" and PRODUCT/MIN "and".
* AVG: UCC's own AVG for floating and complex all-reduce and reduce; else
  SUM then a division by hpccomm: UCC's reduce-scatter has no AVG, and UCC
  multiplies integer sums by a floating-point 1/n where torch truncates.
  PREMUL_SUM: the input multiplied first, then SUM.
* BAND/BOR/BXOR on integers and bool; anything else is a ValueError naming
  the op and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import torch.distributed as dist

from .mpi_types import Reduction

RedOpType = dist.ReduceOp.RedOpType

#: Reduced as float32 copies (see the module docstring).
WIDENED = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
_INTEGERS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64)
_FLOATS = (torch.float32, torch.float64)
_COMPLEX = (torch.complex64, torch.complex128)
_ORDERED = (RedOpType.SUM, RedOpType.PRODUCT, RedOpType.MIN, RedOpType.MAX)
_BITWISE = (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR)


@dataclass(frozen=True)
class UCCReduction:
    """What a torch reduction on one dtype becomes on UCC.

    Its ``divide_by_size`` and ``premul_factor`` are what the staging helpers
    (:mod:`hpccomm.transports.local_steps`) read, as from a :class:`Reduction`.

    Attributes:
        op: UCC's reduction op (``UCC_OP_*``).
        datatype: UCC's datatype of what is reduced (the widened dtype's, for 16-bit floats).
        widen_to: reduce a copy in this dtype, then copy back; None reduces in place.
        divide_by_size: hpccomm divides the result by the group size (AVG on integers).
        premul_factor: PREMUL_SUM: multiply each rank's input by this first.
    """

    op: int
    datatype: int
    widen_to: torch.dtype | None = None
    divide_by_size: bool = False
    premul_factor: float | torch.Tensor | None = None


def datatype(lib: Any, dtype: torch.dtype) -> int:
    """UCC's datatype carrying one element of ``dtype`` (for data movement)."""
    found = _datatypes(lib).get(dtype)
    return found if found is not None else _by_width(lib, dtype.itemsize, dtype)


@cache
def _datatypes(lib: Any) -> dict[torch.dtype, int]:
    return {
        torch.float32: lib.UCC_DT_FLOAT32,
        torch.float64: lib.UCC_DT_FLOAT64,
        torch.float16: lib.UCC_DT_FLOAT16,
        torch.bfloat16: lib.UCC_DT_BFLOAT16,
        torch.int8: lib.UCC_DT_INT8,
        torch.int16: lib.UCC_DT_INT16,
        torch.int32: lib.UCC_DT_INT32,
        torch.int64: lib.UCC_DT_INT64,
        torch.uint8: lib.UCC_DT_UINT8,
        torch.uint16: lib.UCC_DT_UINT16,
        torch.uint32: lib.UCC_DT_UINT32,
        torch.uint64: lib.UCC_DT_UINT64,
        torch.bool: lib.UCC_DT_UINT8,
        torch.complex64: lib.UCC_DT_FLOAT32_COMPLEX,
        torch.complex128: lib.UCC_DT_FLOAT64_COMPLEX,
    }


def _by_width(lib: Any, itemsize: int, dtype: torch.dtype) -> int:
    widths = {1: lib.UCC_DT_UINT8, 2: lib.UCC_DT_UINT16, 4: lib.UCC_DT_UINT32, 8: lib.UCC_DT_UINT64,
              16: lib.UCC_DT_FLOAT64_COMPLEX}
    try:
        return widths[itemsize]
    except KeyError:
        raise ValueError(f"hpccomm: UCC has no datatype of {itemsize} bytes for {dtype}") from None


#: The collectives whose UCC implementation has AVG.
_NATIVE_AVG = ("all_reduce", "reduce")


def reduction(lib: Any, op_name: str, red: Reduction, dtype: torch.dtype, on_device: bool = False) -> UCCReduction:
    """Map a validated torch reduction (:func:`~hpccomm.transports.mpi_types.reduction`) onto UCC.

    Args:
        lib: the UCC binding's ``lib``.
        op_name: the collective (``all_reduce``, ``reduce``, ``reduce_scatter``...),
            which decides whether UCC averages, and names it in errors.
        red: the reduction the front made (its kind is SUM for AVG and PREMUL_SUM).
        dtype: the tensor's dtype.
        on_device: the tensor is in device memory, where 16-bit floats are reduced natively.

    Raises:
        ValueError: UCC cannot reduce ``dtype`` this way.
    """
    if red.premul_factor is not None:
        plain = _plain(lib, op_name, RedOpType.SUM, False, dtype, on_device)
        return UCCReduction(plain.op, plain.datatype, plain.widen_to, premul_factor=red.premul_factor)
    return _plain(lib, op_name, red.kind, red.divide_by_size, dtype, on_device)


@cache
def _plain(lib: Any, op_name: str, kind: Any, average: bool, dtype: torch.dtype, on_device: bool) -> UCCReduction:
    widen_to = None if on_device else WIDENED.get(dtype)
    wire = widen_to or dtype
    ops = {
        RedOpType.SUM: lib.UCC_OP_SUM,
        RedOpType.PRODUCT: lib.UCC_OP_PROD,
        RedOpType.MIN: lib.UCC_OP_MIN,
        RedOpType.MAX: lib.UCC_OP_MAX,
        RedOpType.BAND: lib.UCC_OP_BAND,
        RedOpType.BOR: lib.UCC_OP_BOR,
        RedOpType.BXOR: lib.UCC_OP_BXOR,
    }
    if dtype == torch.bool and kind in (*_ORDERED, *_BITWISE):
        # 0/1 bytes: MAX is "or", MIN is "and", and the bitwise ops act as logic ops.
        kind = {RedOpType.SUM: RedOpType.MAX, RedOpType.PRODUCT: RedOpType.MIN}.get(kind, kind)
        return UCCReduction(ops[kind], lib.UCC_DT_UINT8)
    if wire in _INTEGERS and kind in (*_ORDERED, *_BITWISE):
        return UCCReduction(ops[kind], datatype(lib, wire), divide_by_size=average)
    native = average and op_name in _NATIVE_AVG
    op = lib.UCC_OP_AVG if native else ops.get(kind)
    if (wire in _FLOATS or wire in WIDENED) and kind in _ORDERED:
        return UCCReduction(op, datatype(lib, wire), widen_to, divide_by_size=average and not native)
    if wire in _COMPLEX and kind in (RedOpType.SUM, RedOpType.PRODUCT):
        return UCCReduction(op, datatype(lib, wire), divide_by_size=average and not native)
    name = "AVG" if average else getattr(kind, "name", str(kind))
    raise ValueError(f"hpccomm {op_name}: UCC cannot reduce {dtype} with ReduceOp.{name}")
