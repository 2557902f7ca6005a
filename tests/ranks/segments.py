"""The shared-memory segment files this process left in /dev/shm.

hpccomm names each segment's file ``hpccomm-<creator's pid>-<random>`` and
removes the name once every rank has mapped it (hpccomm/transports/shm.py).
A file with this process's pid may still be there from an earlier process
with the same pid that was killed while it made one (pids are reused: a CI
run goes through the 32768 of this machine's pid space many times); only the
files that appeared since this module was imported are this process's.
Import it before ``init_process_group``.
"""

from __future__ import annotations

import os

_SHM_DIR = "/dev/shm"


def _named_for_this_process() -> set[str]:
    prefix = f"hpccomm-{os.getpid()}-"
    return {name for name in os.listdir(_SHM_DIR) if name.startswith(prefix)}


_BEFORE = _named_for_this_process()


def left_behind() -> list[str]:
    """The segment files this process made whose names are still in /dev/shm."""
    return sorted(_named_for_this_process() - _BEFORE)
