"""Which transport serves which device: ``HPCCOMM_TRANSPORT`` against what is installed.

``auto`` (the default) routes host tensors to MPI and, where torch sees a
GPU, CUDA tensors through host memory (``staged``:
:mod:`~hpccomm.transports.host_staged`; UCC on device memory is not built
yet). ``ucc`` forces UCC for host tensors too: testable on any machine, and
usable where UCC's host collectives beat MPI. The choice is logged once per
process (logger ``hpccomm``, level INFO), with UCC's version and library
paths when UCC serves a device.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..config import settings

if TYPE_CHECKING:
    from ..ucc import UCCStatus

_logger = logging.getLogger("hpccomm")

#: The devices each transport can carry today (``staged`` only where torch sees a GPU: see _serves).
_SERVES = {"mpi": ("cpu",), "ucc": ("cpu",), "staged": ("cuda",)}
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


def wants_ucc() -> bool:
    """Whether some device is routed to UCC (so UCC must be loaded before MPI starts)."""
    return any(name == "ucc" and device in _serves("ucc") for device, name in settings.transports)


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
        name = next((c for c in candidates if device in _serves(c) and (wanted != "auto" or _usable(c, ucc))), None)
        if name is None:
            notes.append(f"{device} -> none ({_why_none(device, wanted)})")
            continue
        if name == "ucc":
            _require_ucc(device, ucc)
        chosen[device] = name
        notes.append(f"{device} -> {name}{_details(name, ucc)}")
    _logger.info("hpccomm transports: %s", "; ".join(notes))
    _routes = chosen
    return chosen


def _usable(name: str, ucc: UCCStatus | None) -> bool:
    return name != "ucc" or (ucc is not None and ucc.available)


def _require_ucc(device: str, ucc: UCCStatus | None) -> None:
    assert ucc is not None
    if not ucc.available:
        raise RuntimeError(f"hpccomm: HPCCOMM_TRANSPORT routes {device} tensors to UCC, but {ucc.reason}")


def _details(name: str, ucc: UCCStatus | None) -> str:
    if name != "ucc" or ucc is None:
        return ""
    return f" (UCC {ucc.version}: {ucc.library}; UCX: {ucc.ucx})"


def _why_none(device: str, wanted: str) -> str:
    if device == "cuda" and not _cuda_available():
        return "torch sees no CUDA device"
    if device == "cuda" and wanted == "ucc":
        return "UCC's CUDA path is not built yet; HPCCOMM_TRANSPORT=cuda:staged moves CUDA tensors through host memory"
    return f"{wanted} does not carry {device} tensors"
