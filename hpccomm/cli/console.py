"""What the command-line tools show while they run: rank 0's output, a progress bar, a clean stop.

Only rank 0 prints. Result lines go to stdout as they are measured; the
progress bar goes to stderr, redrawn in place at most a few times a second and
wiped before each result line, so the two never share a line.

Ctrl-C (SIGINT) or SIGTERM asks the run to stop: the tools finish the round
in progress, the ranks agree at the next round boundary (one tiny MPI
all-reduce, outside the timed calls) and every rank stops together, so rank 0
can print and save what was measured. A second signal acts as usual. Open
MPI's ``mpirun`` forwards Ctrl-C as SIGTERM and kills the ranks ~0.25 s later,
which may be too soon for that round: :class:`StopSignal` therefore calls
``on_first`` at once, in the signal handler, to save what is measured so far.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

_REDRAW_S = 0.25
_BAR_WIDTH = 30


class Console:
    """Rank 0's stdout lines and stderr progress bar.

    Args:
        enabled: this rank prints (rank 0).
        progress: draw the progress bar.
        total: the number of steps the bar counts to.
    """

    def __init__(self, enabled: bool, progress: bool, total: int) -> None:
        self._enabled = enabled
        self._progress = enabled and progress and total > 0
        self._total = max(total, 1)
        self._done = 0
        self._drawn = False
        self._last_draw = 0.0
        self._started = time.monotonic()

    def line(self, text: str = "") -> None:
        """Print one line of results (rank 0 only)."""
        if not self._enabled:
            return
        self._wipe()
        print(text, flush=True)

    def advance(self, label: str, steps: int = 0) -> None:
        """Redraw the bar (at most every 0.25 s), ``steps`` further on, showing ``label``.

        Args:
            label: what is being measured now.
            steps: steps completed since the last call.
        """
        self._done += steps
        if not self._progress:
            return
        now = time.monotonic()
        if now - self._last_draw < _REDRAW_S and steps == 0:
            return
        self._last_draw = now
        filled = _BAR_WIDTH * min(self._done, self._total) // self._total
        elapsed = now - self._started
        bar = "#" * filled + "." * (_BAR_WIDTH - filled)
        text = f"\r[{bar}] {self._done}/{self._total} {elapsed:5.0f} s  {label}"
        sys.stderr.write(text[:100] + "\x1b[K")
        sys.stderr.flush()
        self._drawn = True

    def _wipe(self) -> None:
        if self._drawn:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self._drawn = False

    def close(self) -> None:
        """Remove the bar."""
        self._wipe()


class StopSignal:
    """SIGINT / SIGTERM handling: note the request, let the ranks agree to stop between rounds.

    Args:
        on_first: called once, inside the handler of the first signal (save
            results there: a launcher may kill the ranks soon after).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, on_first: Callable[[], None] | None = None) -> None:
        self.on_first = on_first
        self._previous: dict[int, Any] = {}
        self.requested: str | None = None
        self.agreed = False

    def install(self) -> None:
        """Catch the signals (main thread only)."""
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        """Give the signals back to their previous handlers."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: Any) -> None:
        self.requested = signal.Signals(signum).name
        self.restore()  # a second signal acts as usual
        os.write(2, f"\nhpccomm bench: {self.requested}: stopping after this round\n".encode())
        if self.on_first is not None:
            self.on_first()

    def should_stop(self, comm: Any, MPI: Any) -> bool:
        """True on every rank once any rank was asked to stop. Collective: call at the same point on all ranks."""
        if not self.agreed:
            self.agreed = bool(comm.allreduce(1 if self.requested else 0, op=MPI.MAX))
        return self.agreed
