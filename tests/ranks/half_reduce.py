"""bfloat16/float16 reduction kernels: every path on this machine against torch, alone and inside MPI.

Run under ``hpccomm-run -n N``. The compiled kernels must be present (the
package builds them) and each available path must give torch's bits: values
with tails of every length, infinities, overflow, subnormals and NaN.
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import hpccomm  # noqa: F401  (MPI settings before mpi4py starts MPI)
import torch
import torch.distributed as dist
from hpccomm.transports import half_reduce
from hpccomm.world import mpi
from rankcheck import check, run_all

MPI = mpi()
comm = MPI.COMM_WORLD
RedOpType = dist.ReduceOp.RedOpType
KINDS = (RedOpType.SUM, RedOpType.PRODUCT, RedOpType.MIN, RedOpType.MAX)
TORCH_KERNELS = {
    RedOpType.SUM: lambda a, b: a + b,
    RedOpType.PRODUCT: lambda a, b: a * b,
    RedOpType.MIN: torch.minimum,
    RedOpType.MAX: torch.maximum,
}
DTYPES = (torch.bfloat16, torch.float16)
# Lengths around the 8- and 16-lane vector widths, so every tail length runs.
LENGTHS = (0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 4099)


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def small_integers(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Values in -4..4: sums and products over 4 ranks stay exact in 16-bit floats."""
    return torch.randint(-4, 5, (n,), generator=torch.Generator().manual_seed(seed)).to(dtype)


def operands(n: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(n, generator=gen) * 100).to(dtype)
    b = (torch.randn(n, generator=gen) * 100).to(dtype)
    if n >= 12:
        big = torch.finfo(dtype).max
        tiny = torch.finfo(dtype).smallest_normal / 4  # a subnormal
        a[0], b[1] = float("nan"), float("nan")
        a[2], b[3] = float("inf"), -float("inf")
        a[4] = b[4] = big  # overflows to inf
        a[5], b[5] = tiny, tiny
        a[6], b[6] = tiny, -2 * tiny
        a[7], b[7] = 0.0, -0.0
        a[8], b[8] = -tiny, 3.0
    return a, b


def as_bytes(tensor: torch.Tensor):
    """The tensor's memory as MPI hands it to an op: a buffer whose len() is in bytes."""
    return MPI.buffer.fromaddress(tensor.data_ptr(), tensor.nbytes)


def same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit-equal, except that any NaN matches any NaN and +0 matches -0.

    torch itself differs there between its scalar and vector kernels (NaN
    payloads; which zero MIN/MAX keep on a tie).
    """
    nan = want.isnan()
    if not torch.equal(got.isnan(), nan):
        return False
    got, want = got[~nan] + 0.0, want[~nan] + 0.0  # -0 + 0 is +0
    return torch.equal(got.view(torch.int16), want.view(torch.int16))


@check
def compiled_kernels_are_built_and_chosen():
    assert half_reduce.compiled_available(), "hpccomm._half_reduce is missing: the package was built without it"
    flags = cpu_flags()
    if {"avx512f", "avx512bw", "avx512dq", "avx512_bf16"} <= flags:
        assert half_reduce.path(torch.bfloat16) == "avx512bf16", half_reduce.available_paths(torch.bfloat16)
    elif "avx512f" in flags:
        assert half_reduce.path(torch.bfloat16) == "avx512", half_reduce.available_paths(torch.bfloat16)
    if "avx512f" in flags:
        assert half_reduce.path(torch.float16) == "avx512", half_reduce.available_paths(torch.float16)
    elif {"avx2", "f16c"} <= flags:
        assert half_reduce.path(torch.float16) == "avx2", half_reduce.available_paths(torch.float16)


@check
def every_path_matches_torch_bit_for_bit():
    for dtype in DTYPES:
        for via in half_reduce.available_paths(dtype):
            for kind in KINDS:
                body = half_reduce.reducer(kind, dtype, via)
                for n in LENGTHS:
                    a, b = operands(n, dtype, seed=n)
                    want = TORCH_KERNELS[kind](b, a)
                    out = b.clone()
                    body(as_bytes(a), as_bytes(out))
                    assert same_bits(out, want), f"{dtype} {via} {kind.name} n={n}: {out[:12]} != {want[:12]}"


@check
def every_path_matches_torch_on_every_bit_pattern():
    # All 65,536 words against a shuffle of themselves: every subnormal, NaN and
    # rounding case, in vectors both with and without a subnormal result.
    words = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    shuffled = words[torch.randperm(words.numel(), generator=torch.Generator().manual_seed(7))]
    for dtype in DTYPES:
        a, b = words.view(dtype), shuffled.view(dtype)
        for via in half_reduce.available_paths(dtype):
            for kind in KINDS:
                out = b.clone()
                half_reduce.reducer(kind, dtype, via)(as_bytes(a), as_bytes(out))
                assert same_bits(out, TORCH_KERNELS[kind](b, a)), f"{dtype} {via} {kind.name}"


@check
def every_path_reduces_inside_mpi_allreduce():
    # Nonblocking, as hpccomm posts it: Open MPI's Rabenseifner hands the op empty chunks at 3 ranks.
    # Every rank runs every case (no early exit inside the loop), so none is left waiting.
    wrong = []
    for dtype in DTYPES:
        for via in half_reduce.available_paths(dtype):
            for kind in KINDS:
                op = MPI.Op.Create(half_reduce.reducer(kind, dtype, via), commute=True)
                for n in (5, 4099):
                    mine = small_integers(n, dtype, seed=comm.rank)
                    want = mine.clone()
                    for r in range(comm.size):
                        if r != comm.rank:
                            want = TORCH_KERNELS[kind](want, small_integers(n, dtype, seed=r))
                    comm.Iallreduce(MPI.IN_PLACE, [as_bytes(mine), MPI.UINT16_T], op).Wait()
                    if not torch.equal(mine, want):
                        wrong.append(f"{dtype} {via} {kind.name} n={n}")
                op.Free()
    assert not wrong, f"wrong results: {wrong}"


@check
def hpccomm_ops_are_native_and_reduce_right():
    # The ops hpccomm itself uses: C functions handed to MPI_Op_create, no Python per call.
    assert half_reduce.native_ops_available(), "MPI_Op_create was not found in the loaded MPI library"
    wrong = []
    for dtype in DTYPES:
        for kind in KINDS:
            op = half_reduce.mpi_op(kind, dtype)
            for n in (0, 5, 4099):
                mine = small_integers(n, dtype, seed=comm.rank)
                want = mine.clone()
                for r in range(comm.size):
                    if r != comm.rank:
                        want = TORCH_KERNELS[kind](want, small_integers(n, dtype, seed=r))
                comm.Iallreduce(MPI.IN_PLACE, [as_bytes(mine), MPI.UINT16_T], op).Wait()
                if not torch.equal(mine, want):
                    wrong.append(f"{dtype} {kind.name} n={n}")
    assert not wrong, f"wrong results: {wrong}"


@check
def unknown_path_is_refused():
    try:
        half_reduce.reducer(RedOpType.SUM, torch.bfloat16, "sse9")
    except ValueError as exc:
        assert "sse9" in str(exc)
    else:
        raise AssertionError("an unknown path was accepted")


if __name__ == "__main__":
    run_all(comm.rank)
