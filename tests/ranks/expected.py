"""Inputs and expected results shared by the conformance checks and the fuzzer.

Each rank's input is a function of (rank, dtype, size), so every rank can
compute what any collective must return without communicating.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

Op = dist.ReduceOp

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
COMPLEX = [torch.complex64, torch.complex128]
ALL = [*FLOATS, *INTS, torch.bool, *COMPLEX]
NUMEL = 7  # odd, so no size divides it by accident


def value(rank: int, dtype: torch.dtype, numel: int = NUMEL, small: bool = False) -> torch.Tensor:
    """Rank ``rank``'s input: distinct per rank and exact in every dtype."""
    idx = torch.arange(numel)
    if dtype == torch.bool:
        return (idx + rank) % 2 == 0
    base = (idx + rank) % 2 + 1 if small else (idx % 3) + rank + 1
    if dtype.is_complex:
        return torch.complex(base.double(), (base % 2).double()).to(dtype)
    return base.to(dtype)


def combine(op: object, dtype: torch.dtype, tensors: list[torch.Tensor], factor: float = 2.0) -> torch.Tensor:
    """What reducing ``tensors`` with ``op`` must give."""
    if dtype == torch.bool:
        any_, all_ = functools.reduce(torch.logical_or, tensors), functools.reduce(torch.logical_and, tensors)
        parity = functools.reduce(torch.logical_xor, tensors)
        return {Op.SUM: any_, Op.MAX: any_, Op.BOR: any_, Op.PRODUCT: all_, Op.MIN: all_, Op.BAND: all_, Op.BXOR: parity}[op]
    fold = {
        Op.SUM: torch.add, Op.AVG: torch.add, Op.PRODUCT: torch.mul, Op.MIN: torch.minimum,
        Op.MAX: torch.maximum, Op.BAND: torch.bitwise_and, Op.BOR: torch.bitwise_or, Op.BXOR: torch.bitwise_xor,
        "premul": torch.add,
    }[op]
    if op == "premul":
        tensors = [t * factor for t in tensors]
    out = functools.reduce(fold, tensors)
    if op == Op.AVG:
        n = len(tensors)
        out = out / n if (dtype.is_floating_point or dtype.is_complex) else torch.div(out, n, rounding_mode="trunc")
    return out.to(dtype)


def same(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Fail unless ``actual`` has ``expected``'s dtype and values."""
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert torch.equal(actual, expected), f"{what}: got {actual.tolist()[:8]} expected {expected.tolist()[:8]}"


def valid_ops(dtype: torch.dtype) -> list[object]:
    if dtype == torch.bool:
        return [Op.SUM, Op.PRODUCT, Op.MIN, Op.MAX, Op.BAND, Op.BOR, Op.BXOR]
    if dtype.is_complex:
        # torch itself refuses PRODUCT/MIN/MAX/bitwise on complex before the backend sees it
        return [Op.SUM, Op.AVG, "premul"]
    if dtype.is_floating_point:
        return [Op.SUM, Op.PRODUCT, Op.MIN, Op.MAX, Op.AVG, "premul"]
    return [Op.SUM, Op.PRODUCT, Op.MIN, Op.MAX, Op.AVG, Op.BAND, Op.BOR, Op.BXOR]


def invalid_ops(dtype: torch.dtype) -> list[object]:
    everything = [Op.SUM, Op.PRODUCT, Op.MIN, Op.MAX, Op.AVG, Op.BAND, Op.BOR, Op.BXOR, "premul"]
    return [op for op in everything if op not in valid_ops(dtype)]


def torch_op(op: object) -> object:
    return dist._make_nccl_premul_sum(2.0) if op == "premul" else op


def inputs(dtype: torch.dtype, op: object, size: int, numel: int = NUMEL) -> list[torch.Tensor]:
    """Every rank's input for a reduction with ``op`` (PRODUCT gets small values)."""
    small = op == Op.PRODUCT
    return [value(r, dtype, numel, small) for r in range(size)]
