"""The MPI ops that reduce bfloat16 and float16, and the kernels inside them.

MPI has no usable 16-bit float types, so hpccomm sends these tensors as raw
16-bit words and reduces them in user-defined MPI ops (see
:mod:`hpccomm.transports.mpi_types`), made here:

* where the package was built with ``hpccomm._half_reduce`` (cffi, from
  ``cffi_build/half_reduce.c``) and the CPU has a vector path for the dtype,
  the op is a C function handed to ``MPI_Op_create``: MPI calls it with no
  Python (and no GIL) in between;
* otherwise a Python op reduces with torch's kernels.

Both widen to float32 and round back to nearest-even, so they give the same
bits. Measured on one AVX-512 core, 128 Ki elements, SUM: compiled 7.5 us
(bfloat16, AVX512-BF16), 12 us (bfloat16 on plain AVX-512, and float16);
torch 17-30 us, plus the Python call. On an AVX2-only CPU, bfloat16
all_reduce of 1-16 MiB on 2 ranks took 0.41-0.44x the time with the AVX2
kernel that it took with torch's.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from functools import cache
from typing import Any

import torch
import torch.distributed as dist

from ..config import settings
from ..world import mpi

try:
    from .. import _half_reduce as _compiled
except ImportError:  # built without a C compiler: torch reduces
    _compiled = None

RedOpType = dist.ReduceOp.RedOpType
#: An MPI user op's body: reduces ``inbuf`` into ``outbuf`` (buffers of 16-bit
#: words) in place; the third argument, MPI's datatype, is unused.
Reducer = Callable[[Any, Any, Any], None]

HALF_DTYPES = (torch.bfloat16, torch.float16)
PATHS = ("torch", "avx2", "avx512", "avx512bf16")  # index = the C library's HALF_PATH_* value
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
    # float16 has no AVX512-BF16 kernel: it never reports that path.
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


def compiled_reducer(kind: Any, dtype: torch.dtype) -> tuple[int, int, int, int] | None:
    """The C function that reduces ``dtype`` with ``kind`` on :func:`path`, for C callers.

    Returns:
        ``(address, dtype code, op code, path code)``: ``address`` is
        ``hpccomm_half_reduce_into`` (see ``cffi_build/half_reduce.h``), to be
        called with the three codes; None where :func:`path` is 'torch'.
    """
    chosen = path(dtype)
    if chosen == "torch":
        return None
    ffi, lib = _compiled.ffi, _compiled.lib
    address = int(ffi.cast("uintptr_t", ffi.addressof(lib, "hpccomm_half_reduce_into")))
    return address, _DTYPE_CODES[dtype], _OP_CODES[kind], PATHS.index(chosen)


def mpi_op(kind: Any, dtype: torch.dtype) -> Any:
    """The MPI op reducing ``dtype`` words with ``kind``: a C function where compiled, else Python."""
    chosen = path(dtype)
    if chosen != "torch":
        native = _native_op(kind, dtype, chosen)
        if native is not None:
            return native
    return mpi().Op.Create(reducer(kind, dtype, chosen), commute=True)


def native_ops_available() -> bool:
    """Whether hpccomm can hand C functions to this MPI library's MPI_Op_create."""
    return _compiled is not None and _mpi_op_create() is not None


def _native_op(kind: Any, dtype: torch.dtype, via: str) -> Any:
    create = _mpi_op_create()
    if create is None:
        return None
    ffi, lib = _compiled.ffi, _compiled.lib
    if lib.hpccomm_half_use_path(_DTYPE_CODES[dtype], PATHS.index(via)) != 0:
        return None
    function = lib.hpccomm_half_mpi_function(_DTYPE_CODES[dtype], _OP_CODES[kind])
    if function == ffi.NULL:
        return None
    handle = ctypes.create_string_buffer(16)  # MPI_Op: an int (MPICH) or a pointer (Open MPI)
    if create(int(ffi.cast("uintptr_t", function)), 1, handle) != 0:
        return None
    MPI = mpi()
    size = MPI._sizeof(MPI.Op)
    op = MPI.Op.fromhandle(int.from_bytes(handle.raw[:size], sys.byteorder))
    # A handle read wrongly for this MPI's ABI would fail here, not inside a collective.
    return op if op.Is_commutative() else None


@cache
def _mpi_op_create() -> Any:
    """MPI_Op_create of the MPI library mpi4py loaded, or None where it cannot be found."""
    if _compiled is None:
        return None
    # mpi4py opens libmpi privately (not RTLD_GLOBAL): find its mapped file
    # (libmpich.so for a distribution's MPICH, e.g. Debian's).
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "/libmpi.so" in line or "/libmpich.so" in line})
    except OSError:
        return None
    for lib_path in paths:
        try:
            create = ctypes.CDLL(lib_path).MPI_Op_create
        except (OSError, AttributeError):
            continue
        create.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
        create.restype = ctypes.c_int
        return create
    return None


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
