"""Element-wise reductions of bfloat16 and float16 words, the bodies of their MPI ops.

MPI has no usable 16-bit float types, so hpccomm sends these tensors as raw
16-bit words and reduces them in user-defined MPI ops (see
:mod:`hpccomm.transports.mpi_types`). The op's body comes from here: the
compiled vector kernels of ``hpccomm._half_reduce`` (built by cffi from
``cffi_build/half_reduce.c``) where the package was built with them and the
CPU has a path for the dtype, else torch's own kernels. Both widen to float32
and round back to nearest-even, so they give the same bits.

Measured on one AVX-512 core, 128 Ki elements, SUM: compiled 13 us (bfloat16)
and 12 us (float16); torch 17-30 us. Inside an MPI op the gap grows, because
torch's call also wraps both buffers as tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..config import settings

try:
    from .. import _half_reduce as _compiled
except ImportError:  # built without a C compiler: torch reduces
    _compiled = None

RedOpType = dist.ReduceOp.RedOpType
#: An MPI user op's body: reduces ``inbuf`` into ``outbuf`` (buffers of 16-bit
#: words) in place; the third argument, MPI's datatype, is unused.
Reducer = Callable[[Any, Any, Any], None]

PATHS = ("torch", "avx2", "avx512")  # index = the C library's HALF_PATH_* value
_DTYPE_CODES = {torch.bfloat16: 0, torch.float16: 1}
_OP_CODES = {RedOpType.SUM: 0, RedOpType.PRODUCT: 1, RedOpType.MIN: 2, RedOpType.MAX: 3}
_TORCH_KERNELS = {
    RedOpType.SUM: torch.Tensor.add_,
    RedOpType.PRODUCT: torch.Tensor.mul_,
    RedOpType.MIN: lambda out, inp: torch.minimum(out, inp, out=out),
    RedOpType.MAX: lambda out, inp: torch.maximum(out, inp, out=out),
}


def compiled_available() -> bool:
    """Whether this installation carries the compiled kernels."""
    return _compiled is not None


def available_paths(dtype: torch.dtype) -> tuple[str, ...]:
    """Every path that can reduce ``dtype`` here, slowest ('torch') first."""
    best = _compiled.lib.hpccomm_half_path(_DTYPE_CODES[dtype]) if _compiled is not None else 0
    if dtype == torch.bfloat16 and best:
        return ("torch", PATHS[best])  # no AVX2 kernel: torch's is as fast there
    return PATHS[: best + 1]


def path(dtype: torch.dtype) -> str:
    """The path that reduces ``dtype``: the fastest available, capped by ``HPCCOMM_HALF_KERNELS``.

    Raises:
        ValueError: ``HPCCOMM_HALF_KERNELS`` names no path.
    """
    wanted = settings.half_kernels
    if wanted != "auto" and wanted not in PATHS:
        raise ValueError(f"hpccomm: HPCCOMM_HALF_KERNELS={wanted!r}; use auto, {', '.join(PATHS)}")
    usable = available_paths(dtype)
    if wanted != "auto":
        usable = tuple(p for p in usable if PATHS.index(p) <= PATHS.index(wanted))
    return usable[-1]


def reducer(kind: Any, dtype: torch.dtype, via: str | None = None) -> Reducer:
    """The body of the MPI op that reduces ``dtype`` words with ``kind``.

    Args:
        kind: SUM, PRODUCT, MIN or MAX.
        dtype: torch.bfloat16 or torch.float16.
        via: the path to use (one of :func:`available_paths`); default :func:`path`.
    """
    chosen = via or path(dtype)
    if chosen not in available_paths(dtype):
        raise ValueError(f"hpccomm: no {chosen!r} path for {dtype} here (have {', '.join(available_paths(dtype))})")
    if chosen == "torch":
        return _torch_reducer(_TORCH_KERNELS[kind], dtype)
    return _compiled_reducer(_DTYPE_CODES[dtype], _OP_CODES[kind], PATHS.index(chosen))


def _torch_reducer(kernel: Callable[[torch.Tensor, torch.Tensor], Any], dtype: torch.dtype) -> Reducer:
    def reduce_words(inbuf: Any, outbuf: Any, _datatype: Any = None) -> None:
        # Some algorithms (Open MPI's Rabenseifner) hand over empty chunks,
        # which torch.frombuffer refuses.
        if len(outbuf):
            kernel(torch.frombuffer(outbuf, dtype=dtype), torch.frombuffer(inbuf, dtype=dtype))

    return reduce_words


def _compiled_reducer(dtype_code: int, op_code: int, path_code: int) -> Reducer:
    ffi, lib = _compiled.ffi, _compiled.lib
    reduce_half, from_buffer = lib.hpccomm_half_reduce, ffi.from_buffer

    def reduce_words(inbuf: Any, outbuf: Any, _datatype: Any = None) -> None:
        words = len(outbuf) // 2
        if words and reduce_half(dtype_code, op_code, path_code, from_buffer(inbuf), from_buffer(outbuf), words):
            raise RuntimeError("hpccomm: the compiled 16-bit reduction refused its arguments")

    return reduce_words
