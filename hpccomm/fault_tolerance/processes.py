"""The processes of a group's ranks on this node: whether each runs, and ending one agreed failed.

An operation waiting in shared memory calls no MPI, so it learns of a dead
rank of its node from the process itself (:meth:`~.agreement.Recovery.watch`);
a rank the survivors agreed failed but whose process still runs (stopped, or
hung) is ended (:func:`fence`), checked to be the same process by its start
time, not a reused pid.
"""

from __future__ import annotations

import os
import signal


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name ([] once it has gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return []


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def started_at(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot), or '' once it has gone: tells a reused pid."""
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else ""


def fence(pid: int, started: str) -> None:
    """SIGKILL the process of a rank agreed failed, if it still runs (stopped or hung) as that same process.

    Excluded by the survivors, it must not go on acting (a stopped rank that
    resumes), and the launcher waits for it before the job can end.
    """
    if started and started_at(pid) == started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
