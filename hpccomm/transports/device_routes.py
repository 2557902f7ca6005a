"""Which transport serves which device: ``HPCCOMM_TRANSPORT`` against what is installed.

``auto`` (the default) routes host tensors to MPI and, where torch sees a
GPU, CUDA tensors to UCC on device memory (:mod:`~hpccomm.transports.ucc_cuda`)
where hpccomm's UCC has CUDA, else through host memory (``staged``:
:mod:`~hpccomm.transports.host_staged`); on device memory, each collective
still goes through host memory up to the size a GPU run measured it faster
there (:data:`hpccomm.config.CUDA_STAGED_MAX_BYTES`). ``auto`` sends CUDA
tensors only where a GPU run showed them correct and faster: a CUDA-aware MPI
(:mod:`~hpccomm.transports.mpi_cuda`) has never run on one (the GPU machine's
MPI is not CUDA-aware), so it serves CUDA tensors only when chosen
(``HPCCOMM_TRANSPORT=cuda:mpi``).
``ucc`` forces UCC for host tensors too: testable on any machine, and usable
where UCC's host collectives beat MPI. The choice is logged once per process
(logger ``hpccomm``, level INFO), with UCC's version and library paths when
UCC serves a device, and the size below which CUDA collectives are staged.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from ..config import cuda_staged_limits, settings

if TYPE_CHECKING:
    from ..ucc import UCCStatus

_logger = logging.getLogger("hpccomm")

#: The devices each transport can carry today (``staged`` only where torch sees a GPU: see _serves).
_SERVES = {"mpi": ("cpu", "cuda"), "ucc": ("cpu", "cuda"), "staged": ("cuda",)}
#: What ``auto`` picks per device, best first.
_AUTO = {"cpu": ("mpi",), "cuda": ("ucc", "staged")}

_routes: dict[str, str] | None = None


def _serves(name: str) -> tuple[str, ...]:
    """The devices transport ``name`` can carry in this process."""
    if "cuda" in _SERVES[name] and not _cuda_available():
        return tuple(device for device in _SERVES[name] if device != "cuda")
    return _SERVES[name]


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def devices() -> list[str]:
    """The device types some transport can carry here: those hpccomm registers with torch."""
    return sorted({device for name in _SERVES for device in _serves(name)})


def wants_ucc(only: str | None = None) -> bool:
    """Whether some device (or ``only`` that one) may be routed to UCC (so UCC must be loaded before MPI starts)."""
    for device, name in settings.transports:
        if only not in (None, device):
            continue
        if device in _serves("ucc") and (name == "ucc" or (name == "auto" and "ucc" in _AUTO[device])):
            from ..ucc.binding import built

            if name == "ucc" or built():
                return True
    return False


def load_ucc_first() -> None:
    """Load UCC, where a device is routed to it, before MPI loads its own UCX (see hpccomm.ucc.binding).

    Run by :mod:`hpccomm.world` before MPI starts (:func:`hpccomm.world.before_start`).
    Where CUDA tensors may go to UCC, also sets UCC's settings that hpccomm's choices for them need
    (:func:`~hpccomm.transports.ucc_cuda.ucc_environment`), where the user has not: ``ucc_init`` reads them at
    the first UCC context, whichever group makes it.
    """
    if wants_ucc():
        from ..ucc import UCCUnavailableError, load

        if wants_ucc("cuda"):
            from .ucc_cuda import ucc_environment

            for name, value in ucc_environment(settings.ucc_in_place, settings.ucc_triggered).items():
                os.environ.setdefault(name, value)
            if settings.ucc_triggered and os.environ.get("CUDA_MODULE_LOADING", "").upper() != "EAGER":
                _logger.warning(
                    "hpccomm: HPCCOMM_UCC_TRIGGERED=1 without CUDA_MODULE_LOADING=EAGER: a kernel launched for the "
                    "first time while UCC's executor spins on a stream may wait for it forever (docs/ucc-cuda.md)"
                )

        try:
            load()
        except UCCUnavailableError:
            pass  # building the first group says why, with the fix


def routes() -> dict[str, str]:
    """The transport name (``mpi``, ``ucc``) serving each device that has one.

    Resolved and logged on the first call; later calls return the same.

    Raises:
        RuntimeError: ``HPCCOMM_TRANSPORT`` asks for UCC and hpccomm has no
            usable UCC (the message says why and how to build it).
    """
    global _routes
    if _routes is not None:
        return _routes
    chosen: dict[str, str] = {}
    notes: list[str] = []
    ucc: UCCStatus | None = None  # asked once: it loads UCC and reads /proc/self/maps
    for device, wanted in settings.transports:
        candidates = _AUTO[device] if wanted == "auto" else (wanted,)
        if ucc is None and any(c == "ucc" and device in _serves(c) for c in candidates):
            from ..ucc import status

            ucc = status()
        usable = (
            c for c in candidates
            if device in _serves(c) and (wanted != "auto" or _usable(c, device, ucc)) and _carries(c, device)
        )
        name = next(usable, None)
        if name is None:
            notes.append(f"{device} -> none ({_why_none(device, wanted)})")
            continue
        if name == "ucc":
            _require_ucc(device, ucc)
        chosen[device] = name
        notes.append(f"{device} -> {name}{_details(name, device, ucc)}")
    _logger.info("hpccomm transports: %s", "; ".join(notes))
    _routes = chosen
    return chosen


def describe(device: str) -> str | None:
    """The transport serving ``device`` tensors and how, as the start-up log line says it; None if none does.

    Raises:
        RuntimeError: as :func:`routes`.
    """
    name = routes().get(device)
    if name is None:
        return None
    ucc = None
    if name == "ucc":
        from ..ucc import status

        ucc = status()
    return f"{name}{_details(name, device, ucc)}"


def _usable(name: str, device: str, ucc: UCCStatus | None) -> bool:
    if name != "ucc":
        return True
    return ucc is not None and ucc.available and (device != "cuda" or _ucc_cuda_missing() is None)


def _carries(name: str, device: str) -> bool:
    """Whether ``name`` can carry ``device`` tensors at all here (MPI: CUDA only where it is CUDA-aware)."""
    return name != "mpi" or device != "cuda" or _mpi_cuda_aware()


def _mpi_cuda_aware() -> bool:
    from .mpi_cuda import cuda_aware

    return cuda_aware()


def _ucc_cuda_missing() -> str | None:
    from ..ucc.binding import cuda_support

    return cuda_support()


def _require_ucc(device: str, ucc: UCCStatus | None) -> None:
    assert ucc is not None
    reason = ucc.reason if not ucc.available else _ucc_cuda_missing() if device == "cuda" else None
    if reason is not None:
        raise RuntimeError(f"hpccomm: HPCCOMM_TRANSPORT routes {device} tensors to UCC, but {reason}")


def _staged_limits() -> str:
    """Which CUDA collectives go through host memory, and up to what size, as the start-up line says it."""
    limit = settings.cuda_staged_max_bytes
    if limit is not None:
        return f"collectives up to {limit} bytes, " if limit else ""
    limits = cuda_staged_limits()
    sized = ", ".join(f"{op} {_mib(n)}" for op, n in limits.items() if n)
    always = ", ".join(op for op, n in limits.items() if n is None)
    return f"collectives up to their measured limits ({sized}; {always} at every size), "


def _mib(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes and nbytes % (1 << 20) == 0 else f"{nbytes} bytes"


def _details(name: str, device: str, ucc: UCCStatus | None) -> str:
    small = _staged_limits()
    if device == "cuda" and name == "mpi":
        return f" (CUDA-aware) on device memory, host-gated; {small}16-bit float reductions staged through host memory"
    if device == "cuda" and name == "staged":
        return " (through pinned host memory and the CPU transport)"
    if name != "ucc" or ucc is None:
        return ""
    paths = f"UCC {ucc.version}: {ucc.library}; UCX: {ucc.ucx}"
    if device != "cuda":
        return f" ({paths})"
    posting = "triggered on a stream" if settings.ucc_triggered else "host-gated"
    in_place = {"scratch": "out of place into the group's scratch", "native": "in place by UCC",
                "tuned": "in place by UCC, unpipelined"}[settings.ucc_in_place]
    return (f" on device memory, {posting}, in-place reductions {in_place}; {small}point-to-point staged "
            f"through host memory ({paths})")


def _why_none(device: str, wanted: str) -> str:
    if device == "cuda" and not _cuda_available():
        return "torch sees no CUDA device"
    if device == "cuda" and wanted == "mpi":
        return ("this MPI is not CUDA-aware (MPIX_Query_cuda_support() is 0); HPCCOMM_TRANSPORT=cuda:staged "
                "moves CUDA tensors through host memory")
    return f"{wanted} does not carry {device} tensors"
