"""torch's flight recorder for hpccomm: each rank's record written out when the job fails.

From torch 2.15 the flight recorder is on for every backend torch does not
know to record itself, hpccomm included: a hook on the process group records
each operation as it is issued (``FlightRecorderHook`` in c10d's
hooks/FlightRecorderHook.hpp) into a ring buffer per backend, here the one
named ``hpccomm``. What torch leaves to the backend is the dump: NCCL writes
its record when its watchdog sees a timeout and asks every other rank to
write theirs, so that ``python -m torch.distributed.flight_recorder.fr_trace``
can line up the ranks' records and name the rank that never joined a
collective. torch runs a backend's abort hooks on failure for the same
purpose, but reads ``supportsAbortHooks`` only from C++ backends.

hpccomm writes the record of this rank (:func:`write`; a later write replaces
an earlier one) where NCCL would, and with torch's own knobs:

* when one of its operations times out (:func:`hpccomm.work.timeout_error`);
* when the rank ends the job over an uncaught exception, after which the rank
  asks every other rank to write theirs and waits until they have
  (:mod:`hpccomm.failure`);
* when another rank asks it to.

It writes to ``<TORCH_FR_DUMP_TEMP_FILE><rank>`` (torch's writer, rank = world
rank), and only where that variable (or its older name
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``) is set: unlike NCCL, hpccomm does not
write into ``/tmp`` unasked. ``TORCH_FR_BUFFER_SIZE=0`` (the recorder off) or
``TORCH_FR_DUMP_ON_TIMEOUT=0`` turns writing off. The record's entries read
"scheduled", never "completed": a Python backend cannot push completions to
torch's hook, which retires each entry as its call returns; an operation that
never ended stays unretired.
"""

from __future__ import annotations

import os
import sys
import threading

__all__ = ["enabled", "write", "wait_s", "describe"]

#: The recorder's buffer, the dump switch and the dump's bound, each under torch's name and its older NCCL one.
_BUFFER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
_ON_FAILURE = ("TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_NCCL_DUMP_ON_TIMEOUT")
_FILE = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
_WAIT_MS = ("TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC")
#: torch's default bound on one dump on the failure path (``TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC``).
_DEFAULT_WAIT_MS = 15_000

_lock = threading.Lock()


def _first(names: tuple[str, ...]) -> str | None:
    """The value of the first of ``names`` that is set, as torch reads its paired knobs."""
    return next((os.environ[name] for name in names if os.environ.get(name)), None)


def _torch_records() -> bool:
    """Whether this torch records a Python backend's operations (torch >= 2.15's hook, and its dump by backend)."""
    import torch.distributed as dist

    return hasattr(dist.distributed_c10d, "_maybe_attach_flight_recorder")


def _state() -> tuple[bool, bool, str | None]:
    """(recorder on, writing on failure on, file prefix) as torch's knobs set them."""
    buffer = _first(_BUFFER)
    try:
        recording = buffer is None or int(buffer) > 0
    except ValueError:
        recording = False
    on_failure = (_first(_ON_FAILURE) or "1").strip().lower() not in ("0", "false", "no", "off")
    return recording, on_failure, _first(_FILE)


def enabled() -> bool:
    """Whether a failure writes this rank's record: torch records hpccomm's operations, and a file is named."""
    recording, on_failure, prefix = _state()
    return recording and on_failure and prefix is not None and _torch_records()


def describe() -> str:
    """One line for ``hpccomm info``: whether torch records hpccomm's operations, and where a failure writes them."""
    import torch

    recording, on_failure, prefix = _state()
    if not _torch_records():
        return f"torch {torch.__version__} records no operation of a Python backend (from torch 2.15): none written"
    if not recording:
        return "off (TORCH_FR_BUFFER_SIZE=0)"
    if not on_failure:
        return "records hpccomm's operations; not written on failure (TORCH_FR_DUMP_ON_TIMEOUT=0)"
    if prefix is None:
        return "records hpccomm's operations; written on failure once TORCH_FR_DUMP_TEMP_FILE names a file prefix"
    return f"records hpccomm's operations; written on failure to {prefix}<rank>"


def wait_s() -> float:
    """How long a rank that asked the others for their records waits for them: torch's bound on one dump."""
    try:
        return int(_first(_WAIT_MS) or _DEFAULT_WAIT_MS) / 1000
    except ValueError:
        return _DEFAULT_WAIT_MS / 1000


def write(rank: int | None = None) -> bool:
    """Write this rank's record to ``<TORCH_FR_DUMP_TEMP_FILE><rank>``, replacing an earlier one.

    Args:
        rank: this process's world rank (names the file, as torch's writer
            does); default: its rank in ``MPI_COMM_WORLD``.

    Returns:
        True where the record is written; False where writing is off or
        failed (said on stderr).
    """
    if not enabled():
        return False
    with _lock:
        try:
            from torch._C._distributed_c10d import _dump_fr_trace_file

            if rank is None:
                from .world import identity

                rank = identity().rank
            _dump_fr_trace_file(rank, backend="hpccomm")
        except Exception as exc:  # noqa: BLE001 -- on a failure path: say so, never raise
            print(f"hpccomm: rank {rank}: writing the flight recorder failed: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            return False
        return True
