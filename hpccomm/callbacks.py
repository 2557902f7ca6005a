"""Where futures are settled when the progress thread completes their work.

torch runs a future's callbacks (``then``, ``add_done_callback``) on the
thread that settles it. A callback may post more work and wait for it (DDP's
PowerSGD hook does), and the progress thread is what completes work nobody
else drives: a callback running there would wait on itself forever, past any
timeout. So the progress thread never settles a future itself; it hands the
settlement to a :class:`CallbackRunner` thread, and a new runner thread starts
whenever every existing one is busy, so a callback that blocks never holds up
the future it waits for.

A future settled by a thread that drives its own work (``wait()``,
``is_completed()``, or ``get_future()`` without a progress thread) runs its
callbacks there, as torch's other backends do: that thread can block in a
callback without stopping progress.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
import traceback
from collections.abc import Callable

from . import own_threads

#: Runner threads at most; past that, settlements queue for the next free one.
MAX_RUNNER_THREADS = 64


class CallbackRunner:
    """A pool of daemon threads that grows whenever all its threads are busy.

    Threads stay once started (idle ones cost nothing), so a program that
    blocks in at most N callbacks at once holds N + 1 threads.
    """

    def __init__(self, max_threads: int = MAX_RUNNER_THREADS) -> None:
        self._max_threads = max_threads
        self._tasks: collections.deque[Callable[[], None]] = collections.deque()
        lock = threading.Lock()
        self._ready = threading.Condition(lock)  # a task was queued
        self._quiet = threading.Condition(lock)  # a task ended
        self._threads = 0
        self._idle = 0  # threads waiting for a task
        self._running = 0  # tasks being run

    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task`` on a runner thread, starting one if none is free."""
        with self._ready:
            self._tasks.append(task)
            # Every queued task needs a thread that is not inside a callback.
            if self._idle >= len(self._tasks) or self._threads >= self._max_threads:
                self._ready.notify()
                return
            self._threads += 1
        threading.Thread(target=self._serve, name="hpccomm-callbacks", daemon=True).start()

    def _serve(self) -> None:
        while True:
            with self._ready:
                self._idle += 1
                while not self._tasks:
                    self._ready.wait()
                self._idle -= 1
                task = self._tasks.popleft()
                self._running += 1
            try:
                own_threads.ready()  # a callback may wait on device work here
                task()
            except Exception:  # torch hands callback errors to the chained future; anything else is ours
                sys.stderr.write("hpccomm: settling a future failed:\n" + traceback.format_exc())
            finally:
                with self._ready:
                    self._running -= 1
                    self._quiet.notify_all()

    def quiesce(self, timeout_s: float) -> bool:
        """Wait until no task is queued or running; True if that happened in time."""
        deadline = time.monotonic() + timeout_s
        with self._quiet:
            while self._tasks or self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._quiet.wait(left)
        return True


_runner: CallbackRunner | None = None
_runner_lock = threading.Lock()


def runner() -> CallbackRunner:
    """The process-wide runner, created on first use."""
    global _runner
    if _runner is None:
        with _runner_lock:
            if _runner is None:
                _runner = CallbackRunner()
    return _runner
