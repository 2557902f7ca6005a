"""Runtime settings, read from the environment once.

Every knob hpccomm understands lives here, so a reader (and the README's
configuration table) has one place to look. Values are read when this module
is first imported; tests that need other values set the environment before
launching the ranks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _flag(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class Config:
    """Settings that shape hpccomm's behaviour.

    Attributes:
        debug: ``HPCCOMM_DEBUG=1`` (or ``TORCH_DISTRIBUTED_DEBUG=DETAIL``):
            before each collective, check across ranks that every rank called
            the same op with matching dtype, sizes and root.
        progress_thread: ``HPCCOMM_PROGRESS_THREAD=0`` disables the
            background thread that drives asynchronous operations; they then
            progress only while some rank thread waits on MPI.
    """

    debug: bool
    progress_thread: bool


def _read() -> Config:
    return Config(
        debug=_flag("HPCCOMM_DEBUG")
        or os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL",
        progress_thread=_flag("HPCCOMM_PROGRESS_THREAD", default=True),
    )


settings: Config = _read()
