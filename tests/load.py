"""Time limits that hold on a shared, overloaded machine.

A :class:`Deadline` counts "quiet seconds": wall time divided by how
oversubscribed the CPUs are (the 1-minute load average over the core count,
at least 1). On a quiet machine it is a plain wall-clock limit; with the load
at 30-40 on 2 cores (seen here while other jobs ran) it stretches, so a slow
job is not taken for a hung one. The stretch is capped at :data:`MAX_STRETCH`,
so a real hang still fails in bounded time.
"""

from __future__ import annotations

import os
import time

#: A limit lasts at most this many times its length in wall time.
MAX_STRETCH = 8.0


def stretch() -> float:
    """How much slower than on a quiet machine time-bound work runs now (1 to MAX_STRETCH)."""
    cores = len(os.sched_getaffinity(0)) or 1
    return min(MAX_STRETCH, max(1.0, os.getloadavg()[0] / cores))


class Deadline:
    """A limit in quiet seconds; poll :meth:`expired` often (the load is sampled at each call).

    Args:
        limit_s: the limit on a quiet machine.
    """

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._quiet_s = 0.0
        self._last = self._started = time.monotonic()

    def used(self) -> float:
        """Quiet seconds used so far."""
        now = time.monotonic()
        self._quiet_s += (now - self._last) / stretch()
        self._last = now
        return self._quiet_s

    def wall(self) -> float:
        """Wall-clock seconds since the deadline was set."""
        return time.monotonic() - self._started

    def expired(self) -> bool:
        """True once :attr:`limit_s` quiet seconds have passed."""
        return self.used() > self.limit_s

    def describe(self) -> str:
        """E.g. '300 s (412 s of wall time at load factor 1.4)'."""
        return f"{self.limit_s:.0f} s ({self.wall():.0f} s of wall time, load factor now {stretch():.1f})"
