"""Loading the compiled UCC binding (``hpccomm._ucc``) and saying what was loaded.

The binding is built only where UCC was found at install time (see
``cffi_build/extensions.py``). Loading it loads ``libucc`` and, through
libucc's run path, the UCX it was built against.

UCX is loaded once per process, by file name (``libucp.so.0``...), so the
first copy wins. The MPI wheels bundle their own, older UCX and link
``libmpi`` against it. If libucc came first and pulled in only UCX's base
library (the rest arrives with UCC's transport plugins), libmpi would then
load the other UCX libraries from its own copy on top of UCC's base: a mix
that fails with undefined symbols. So when nothing has loaded UCX yet, all of
UCC's UCX is loaded here at once, and MPI, started after, uses it too (UCX
keeps its ABI for older callers). hpccomm loads the binding before it starts
MPI whenever some device is routed to UCC; a program that started MPI first
gets MPI's UCX under UCC (UCX then warns that it is older than UCC expects).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, NamedTuple

_UCX_LIBRARIES = ("libucm.so.0", "libucs.so.0", "libuct.so.0", "libucp.so.0")

#: Why UCC is missing from an installation built without it.
BUILT_WITHOUT_UCC = (
    "hpccomm was built without UCC: set UCC_HOME to a UCC installation (or make `pkg-config ucc` "
    "find it) and reinstall hpccomm; see docs/ucc-cuda.md"
)

_binding: Any = None
_absent: str | None = None
#: UCX libraries loaded here; held so they stay loaded.
_ucx_handles: list[ctypes.CDLL] = []


class UCCUnavailableError(RuntimeError):
    """hpccomm was installed without the UCC binding, or it cannot be loaded."""


class UCCStatus(NamedTuple):
    """Whether UCC can be used in this process, and which one.

    Attributes:
        available: the binding is built and loads.
        version: UCC's version string (e.g. ``1.8.0``), or None.
        library: the path of the ``libucc`` loaded, or None.
        ucx: the path of the ``libucp`` (UCX) loaded, or None.
        reason: why UCC is not available, or None.
    """

    available: bool
    version: str | None
    library: str | None
    ucx: str | None
    reason: str | None


def load() -> Any:
    """The binding module (``.ffi``, ``.lib``), loaded once.

    Raises:
        UCCUnavailableError: the package was built without UCC, or the
            binding does not load (the message says how to fix it).
    """
    global _binding, _absent
    if _binding is not None:
        return _binding
    if _absent is not None:
        raise UCCUnavailableError(_absent)
    if not built():
        # Checked first: `from .. import _ucc` of a missing module reads as a
        # failed load ("cannot import name"), not as an installation without UCC.
        _absent = BUILT_WITHOUT_UCC
        raise UCCUnavailableError(_absent)
    try:
        from .. import _ucc
    except ImportError as exc:
        _absent = f"hpccomm's UCC binding does not load: {exc}{_ucx_hint(str(exc))}"
        raise UCCUnavailableError(_absent) from None
    _load_all_of_ucx()
    _binding = _ucc
    return _binding


def _ucx_hint(error: str) -> str:
    """Why libucc may have failed to load, where a UCX symbol is missing: the loader found another UCX."""
    if "undefined symbol: uc" not in error:
        return ""
    found = _mapped("libucs.so")
    which = f" ({found})" if found else ""
    return (
        f"; libucc was loaded with a UCX{which} other than the one UCC was built against (an older one, "
        "such as a distribution's libucx0): put that UCX's lib directory first on LD_LIBRARY_PATH"
    )


def _load_all_of_ucx() -> None:
    """Load the rest of the UCX that libucc pulled in, before anything loads another."""
    if _mapped("libucp.so") is not None:
        return  # already loaded (by MPI, or by us): that copy is the process's UCX
    base = _mapped("libucs.so")
    if base is None:
        return
    directory = os.path.dirname(base)
    for name in _UCX_LIBRARIES:
        path = os.path.join(directory, name)
        if os.path.exists(path):
            _ucx_handles.append(ctypes.CDLL(path))


def _mapped(fragment: str) -> str | None:
    """The path of a loaded shared library whose file name contains ``fragment``."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(" ")[-1]
                if os.path.basename(path).startswith(fragment):
                    return path
    except OSError:
        pass
    return None


def turn_off_memtype_cache() -> str:
    """Turn UCX's memory-type cache off, where the loaded UCX has one and the user left it alone.

    The cache made tl/ucp crash on CUDA memory (``uct_mm_ep_am_short``, H100,
    UCX 1.22: ``../shared/FACTS.md``). UCX reads ``UCX_MEMTYPE_CACHE`` when its
    base library loads, before hpccomm could set the variable, so the loaded
    UCX's own option is set instead (``ucs_global_opts_set_value``), which
    applies until UCX first makes the cache (at its first CUDA buffer). A UCX
    without the option refuses it and is left as it is.

    Returns:
        What was done, for the log: ``off``, ``left to UCX_MEMTYPE_CACHE=<value>``,
        ``not in this UCX`` or ``no UCX loaded``.
    """
    chosen = os.environ.get("UCX_MEMTYPE_CACHE")
    if chosen is not None:
        return f"left to UCX_MEMTYPE_CACHE={chosen}"
    base = _mapped("libucs.so")
    if base is None:
        return "no UCX loaded"
    ucs = ctypes.CDLL(base)  # the library already loaded: the same handle
    if ucs.ucs_global_opts_set_value(b"MEMTYPE_CACHE", b"n") != 0:
        return "not in this UCX"
    return "off"


def memtype_cache() -> str | None:
    """The loaded UCX's memory-type cache setting (``try``, ``n``...), or None without UCX or the option."""
    base = _mapped("libucs.so")
    if base is None:
        return None
    value = ctypes.create_string_buffer(32)
    if ctypes.CDLL(base).ucs_global_opts_get_value(b"MEMTYPE_CACHE", value, len(value)) != 0:
        return None
    return value.value.decode()


def cuda_support() -> str | None:
    """Why the UCC loaded here cannot carry CUDA memory, or None where it can. Loads the binding.

    UCC needs its CUDA memory and execution components (``lib/ucc/libucc_mc_cuda``,
    ``libucc_ec_cuda``), and a team layer for device memory: tl/nccl, or tl/ucp
    over a UCX with CUDA transports (``ucx/libuct_cuda`` beside the ``libucp``
    loaded; the MPI wheels bundle a UCX without them).
    """
    found = status()
    if not found.available:
        return found.reason
    components = os.path.join(os.path.dirname(found.library or ""), "ucc")
    missing = [name for name in ("libucc_mc_cuda.so", "libucc_ec_cuda.so") if not _exists(components, name)]
    if missing:
        return (
            f"the UCC loaded ({found.library}) was built without CUDA (no {' or '.join(missing)} in {components}): "
            "build UCC with --with-cuda (tests/build_ucc.sh --cuda shows how)"
        )
    ucx_cuda = found.ucx is not None and _exists(os.path.join(os.path.dirname(found.ucx), "ucx"), "libuct_cuda.so")
    if not ucx_cuda and not _exists(components, "libucc_tl_nccl.so"):
        return (
            f"the UCX loaded ({found.ucx}) has no CUDA transports (no ucx/libuct_cuda.so beside it) and UCC has no "
            "tl/nccl: put a CUDA-enabled UCX (the libucx-cu12/cu13 wheels' libucx/lib) first on LD_LIBRARY_PATH"
        )
    return None


def _exists(directory: str, name: str) -> bool:
    """Whether ``directory`` holds ``name`` or a versioned file of it (``name.1``...)."""
    try:
        return any(entry == name or entry.startswith(name + ".") for entry in os.listdir(directory))
    except OSError:
        return False


def built() -> bool:
    """Whether this installation carries the binding (without loading it)."""
    from importlib.util import find_spec

    return find_spec("hpccomm._ucc") is not None


def status() -> UCCStatus:
    """Whether UCC is usable here: version and library paths, or why not. Loads the binding."""
    try:
        binding = load()
    except UCCUnavailableError as exc:
        return UCCStatus(False, None, None, None, str(exc))
    version = binding.ffi.string(binding.lib.ucc_get_version_string()).decode()
    return UCCStatus(True, version, _mapped("libucc.so"), _mapped("libucp.so"), None)
