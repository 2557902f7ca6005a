"""How torch dtypes and ReduceOps map onto MPI datatypes and operations.

Most pairs map to a predefined MPI datatype and op. Three families need care:

* bfloat16 and float16: no MPI offers a usable bfloat16, and MPI's FLOAT16
  reduces 4-17x slower than float32. They travel as raw 16-bit words and are
  reduced by user-defined MPI ops whose bodies come from
  :mod:`hpccomm.transports.half_reduce` (compiled vector kernels, or torch).
* bool: travels as uint8 0/1, where SUM/MAX mean "or" and PRODUCT/MIN "and".
* AVG and PREMUL_SUM: MPI has neither; they are a SUM plus local arithmetic,
  done by the caller (see :class:`Reduction`).

Every lookup raises a ValueError naming the op and dtype for pairs that make
no sense (MIN on complex, BAND on float) before anything is communicated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch
import torch.distributed as dist

from ..world import mpi
from . import half_reduce

RedOpType = dist.ReduceOp.RedOpType

HALF_DTYPES = half_reduce.HALF_DTYPES
_BITWISE = (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR)
_ORDERED = (RedOpType.MIN, RedOpType.MAX)


@lru_cache(maxsize=None)
def datatype(dtype: torch.dtype) -> Any:
    """The MPI datatype that carries one element of ``dtype``."""
    MPI = mpi()
    table = {
        torch.float32: MPI.FLOAT,
        torch.float64: MPI.DOUBLE,
        torch.int8: MPI.INT8_T,
        torch.uint8: MPI.UINT8_T,
        torch.int16: MPI.INT16_T,
        torch.int32: MPI.INT32_T,
        torch.int64: MPI.INT64_T,
        torch.bool: MPI.UINT8_T,
        torch.complex64: MPI.C_FLOAT_COMPLEX,
        torch.complex128: MPI.C_DOUBLE_COMPLEX,
        torch.bfloat16: MPI.UINT16_T,
        torch.float16: MPI.UINT16_T,
        torch.uint16: MPI.UINT16_T,
        torch.uint32: MPI.UINT32_T,
        torch.uint64: MPI.UINT64_T,
    }
    try:
        return table[dtype]
    except KeyError:
        # Data movement works for any dtype as a run of bytes of its size.
        return MPI.BYTE.Create_contiguous(dtype.itemsize).Commit()


@dataclass(frozen=True)
class Reduction:
    """What a torch ReduceOp on one dtype becomes on the wire.

    Attributes:
        kind: torch's reduce op kind (SUM for AVG and PREMUL_SUM).
        mpi_op: the MPI operation to run.
        datatype: the MPI datatype of one element.
        divide_by_size: AVG: divide the reduced result by the group size.
        premul_factor: PREMUL_SUM: multiply each rank's input by this first.
        plain: True when MPI's op alone gives the result (no AVG, no PREMUL_SUM).
    """

    kind: Any
    mpi_op: Any
    datatype: Any
    divide_by_size: bool = False
    premul_factor: float | torch.Tensor | None = None
    # A field, not a property: read on every all_reduce.
    plain: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "plain", not self.divide_by_size and self.premul_factor is None)


def reduction(op_name: str, reduce_op: dist.ReduceOp, dtype: torch.dtype) -> Reduction:
    """Map ``reduce_op`` on ``dtype`` to a :class:`Reduction`.

    Args:
        op_name: the collective's name, for error messages.
        reduce_op: the ReduceOp from the collective's options.
        dtype: the tensor dtype being reduced.

    Raises:
        ValueError: the op makes no sense for the dtype.
    """
    kind = reduce_op.op
    if kind == RedOpType.AVG:
        if dtype == torch.bool:
            raise ValueError(f"hpccomm {op_name}: ReduceOp.AVG is not defined for torch.bool")
        return Reduction(RedOpType.SUM, _mpi_op(op_name, RedOpType.SUM, dtype), datatype(dtype), divide_by_size=True)
    if kind == RedOpType.PREMUL_SUM:
        if not (dtype.is_floating_point or dtype.is_complex):
            raise ValueError(
                f"hpccomm {op_name}: ReduceOp.PREMUL_SUM needs a floating or complex "
                f"tensor, got {dtype}"
            )
        factor = reduce_op.__getstate__()[1]
        return Reduction(RedOpType.SUM, _mpi_op(op_name, RedOpType.SUM, dtype), datatype(dtype), premul_factor=factor)
    return Reduction(kind, _mpi_op(op_name, kind, dtype), datatype(dtype))


def _mpi_op(op_name: str, kind: Any, dtype: torch.dtype) -> Any:
    if kind in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"hpccomm {op_name}: ReduceOp.{kind.name} needs an integer or bool tensor, got {dtype}")
    if kind in _ORDERED and dtype.is_complex:
        raise ValueError(f"hpccomm {op_name}: ReduceOp.{kind.name} is not defined for complex dtype {dtype}")
    if dtype in HALF_DTYPES:
        return _half_op(kind, dtype)
    return _predefined_op(kind, dtype == torch.bool)


@lru_cache(maxsize=None)
def _predefined_op(kind: Any, is_bool: bool) -> Any:
    MPI = mpi()
    if is_bool:
        # 0/1 bytes: MAX is "or", MIN is "and", and the bitwise ops act as logic ops.
        kind = {RedOpType.SUM: RedOpType.MAX, RedOpType.PRODUCT: RedOpType.MIN}.get(kind, kind)
    table = {
        RedOpType.SUM: MPI.SUM,
        RedOpType.PRODUCT: MPI.PROD,
        RedOpType.MIN: MPI.MIN,
        RedOpType.MAX: MPI.MAX,
        RedOpType.BAND: MPI.BAND,
        RedOpType.BOR: MPI.BOR,
        RedOpType.BXOR: MPI.BXOR,
    }
    try:
        return table[kind]
    except KeyError:
        raise ValueError(f"hpccomm: unsupported ReduceOp {kind}") from None


@lru_cache(maxsize=None)
def _half_op(kind: Any, dtype: torch.dtype) -> Any:
    """A user-defined MPI op reducing raw 16-bit words as ``dtype``."""
    return half_reduce.mpi_op(kind, dtype)


_PREMUL_SUM = int(RedOpType.PREMUL_SUM.value)


def _kind_by_hash_is_exact() -> bool:
    for kind in RedOpType.__members__.values():
        if kind != RedOpType.PREMUL_SUM and hash(dist.ReduceOp(kind)) != kind.value:
            return False
    return hash(dist._make_nccl_premul_sum(2.0)) == _PREMUL_SUM


# A ReduceOp hashes to its kind's int value; reading it that way costs a third
# of `reduce_op.op.value`, and pybind enum comparisons cost more than the rest
# of a small all_reduce. Checked once, in case a torch release changes it.
op_kind = hash if _kind_by_hash_is_exact() else (lambda reduce_op: reduce_op.op.value)


_plain_reductions: dict[tuple[int, torch.dtype], Reduction] = {}


def cached_reduction(op: str, reduce_op: dist.ReduceOp, dtype: torch.dtype) -> Reduction:
    """:func:`reduction`, made once per (kind, dtype): the all-reduce hot path looks it up instead.

    PREMUL_SUM, whose factor changes per call, is made each time.
    """
    kind = op_kind(reduce_op)
    found = _plain_reductions.get((kind, dtype))
    if found is not None:
        return found
    if kind == _PREMUL_SUM:
        return reduction(op, reduce_op, dtype)  # carries a per-call factor
    found = reduction(op, reduce_op, dtype)  # raises for pairs that make no sense
    _plain_reductions[(kind, dtype)] = found
    return found
