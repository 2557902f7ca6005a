"""UCC on device memory (hpccomm/transports/ucc_cuda.py), without a GPU.

Every operation through UCC's host-gated path over real UCC on host memory,
the device simulated (tests/ranks/device_paths.py with ``DEVICE_PATH=ucc``):
needs hpccomm built with UCC (skipped, saying why, where it is not; failed
where UCC_HOME is set: tests/transports.py). What a UCC without CUDA is told
runs everywhere. The path's ordering logic in isolation:
tests/test_device_gated.py; on a GPU: tests/gpu.
"""

from __future__ import annotations

import pytest
from launch import assert_all_ranks_ok, run_ranks
from transports import ON_UCC, needs_ucc

from hpccomm.ucc import binding


@needs_ucc
@pytest.mark.parametrize("nprocs, in_place, late", [(2, "scratch", False), (3, "scratch", False),
                                                     (2, "native", False), (2, "scratch", True)])
def test_every_operation_on_ucc_gated_by_the_callers_stream(nprocs, in_place, late):
    # The every-op values (in-place reductions: every dtype and op, through the group's scratch or
    # UCC's in-place flag), async interleaving, one rank's inputs late while the others post (its
    # requests initialised but not posted meanwhile), completion only once landed. ``late``: the
    # simulated device lags the host as a GPU does (back-to-back blocking reductions must still
    # share one scratch buffer, as they did not on an H100).
    env = {**ON_UCC, "DEVICE_PATH": "ucc", "HPCCOMM_UCC_IN_PLACE": in_place, "FAKE_DEVICE_LATE": "1" if late else "0"}
    run = run_ranks(nprocs, "device_paths.py", env=env)
    assert_all_ranks_ok(run, nprocs)


def test_a_ucc_without_cuda_is_named_with_what_is_missing():
    missing = binding.cuda_support()
    if not binding.built():
        assert missing == binding.BUILT_WITHOUT_UCC
        return
    status = binding.status()
    assert status.available, status.reason
    if "libucc_mc_cuda" in "".join(_components(status.library)):
        pytest.skip("this UCC has CUDA components: tests/gpu checks it on a GPU")
    # The hand-built UCC here is CPU only: the message names the missing component and the fix.
    assert missing is not None and "was built without CUDA" in missing and "libucc_mc_cuda.so" in missing, missing
    assert "--with-cuda" in missing


@needs_ucc
def test_a_refusal_on_device_memory_becomes_one_error_naming_what_is_missing():
    from hpccomm.transports.ucc_cuda import _unsupported
    from hpccomm.ucc import UCCError

    lib = binding.load().lib
    error = _unsupported(UCCError(lib.UCC_ERR_NOT_SUPPORTED, "ucc_collective_init: Operation is not supported"), lib)
    assert isinstance(error, RuntimeError) and not isinstance(error, UCCError)
    assert str(error).startswith("hpccomm: UCC cannot run this collective on CUDA memory: ")
    assert "ucc_collective_init: Operation is not supported" in str(error)
    other = UCCError(lib.UCC_ERR_NO_MEMORY, "ucc_collective_init: Out of memory")
    assert _unsupported(other, lib) is other  # other errors pass as they are


def _components(library: str | None) -> list[str]:
    import os

    directory = os.path.join(os.path.dirname(library or ""), "ucc")
    return os.listdir(directory) if os.path.isdir(directory) else []


@needs_ucc
@pytest.mark.parametrize("chosen", [None, "try"])
def test_the_memtype_cache_is_turned_off_in_the_loaded_ucx_unless_the_user_chose(chosen, tmp_path):
    # UCX reads UCX_MEMTYPE_CACHE when it loads, before hpccomm could set it: the loaded UCX's own
    # option is set instead (in a fresh process: the option is process-wide).
    import os
    import subprocess
    import sys

    script = ("from hpccomm.ucc import binding; binding.load(); before = binding.memtype_cache(); "
              "print(before, binding.turn_off_memtype_cache(), binding.memtype_cache())")
    env = {key: value for key, value in os.environ.items() if key != "UCX_MEMTYPE_CACHE"}
    if chosen is not None:
        env["UCX_MEMTYPE_CACHE"] = chosen
    # Away from the checkout, so that the process imports the installed hpccomm (tests/conftest.py).
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    before, *done, after = proc.stdout.split()
    if chosen is None:
        assert before != "n" and (done, after) == (["off"], "n"), proc.stdout  # UCX's default is on ("try")
    else:
        assert (before, " ".join(done), after) == (chosen, f"left to UCX_MEMTYPE_CACHE={chosen}", chosen), proc.stdout
