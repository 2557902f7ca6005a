"""hpccomm's own threads, and what each must do before it serves a transport.

The progress thread (:mod:`hpccomm.progress`) and the callback runners
(:mod:`hpccomm.callbacks`) run transport code on threads the user never
made. Some of that code needs the thread prepared first: on CUDA, a thread in
the default ("global") stream-capture mode that queries an event or allocates
pinned memory while any other thread captures a CUDA graph in that mode
(``torch.cuda.graph``'s default) is refused, and the capture is broken
(PyTorch's NCCL watchdog met this, pytorch/pytorch#104487 and #148594). A
transport adds what its device needs (:func:`add_setup`); each of hpccomm's
threads calls :func:`ready` before it polls or settles work, which runs there,
once, every setup added since that thread last looked. The caller's own
threads are never changed. This module imports nothing of hpccomm.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

_setups: list[Callable[[], None]] = []
_lock = threading.Lock()
#: Per thread: how many of ``_setups`` it has run.
_done = threading.local()


def add_setup(setup: Callable[[], None]) -> None:
    """Have every hpccomm thread run ``setup`` once, on itself, before it next serves a transport.

    Args:
        setup: a thread-level preparation; one equal to a setup already added is not added again.
    """
    with _lock:
        if setup not in _setups:
            _setups.append(setup)


def ready() -> None:
    """Run, on the calling thread (one of hpccomm's), the setups it has not run yet.

    A setup that fails is reported once and not run again on this thread: the
    thread goes on unprepared, as it was before the setup was added.
    """
    done = getattr(_done, "count", 0)
    if done == len(_setups):
        return
    with _lock:
        pending = _setups[done:]
    for setup in pending:
        try:
            setup()
        except Exception as exc:
            sys.stderr.write(f"hpccomm: thread {threading.current_thread().name}: {setup!r} failed: {exc}\n")
    _done.count = done + len(pending)
