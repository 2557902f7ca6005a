"""A tiny check runner for rank scripts: run named checks, report, exit non-zero on failure.

Each rank runs every check, prints ``FAIL rank=<r> <name>: <error>`` for
each failure and finally ``OK rank=<r> checks=<n>`` or exits 1, which the
pytest side (tests/launch.py) reads.

A hang gets a name: ``RANKCHECK_LIMIT_S`` bounds each check; past it the rank
prints ``HUNG rank=<r> <name> after <s> s; top frame: <file>:<line> in
<function>`` (the main thread's innermost Python frame: for a hang inside a
C call, the line that made it), then every thread's stack, and exits with
status 3, so a GPU run goes on to its next part with the cause named
(tests/gpu/targets.py lists these lines). Any rank also prints every
thread's stack on SIGUSR1 (tests/launch.py sends it to a run past its limit).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable

_checks: list[tuple[str, Callable[[], None]]] = []
#: Exit status of a rank whose check outlived RANKCHECK_LIMIT_S.
HUNG_EXIT = 3

faulthandler.register(signal.SIGUSR1, all_threads=True)


def say(line: str) -> None:
    """Print one marker line in a single write, so launchers never interleave it with another rank's."""
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


def check(fn: Callable[[], None]) -> Callable[[], None]:
    """Register ``fn`` as a check."""
    _checks.append((fn.__name__, fn))
    return fn


def top_frame(thread_id: int) -> str:
    """``file:line in function`` of a thread's innermost Python frame."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return "no Python frame"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


class Watchdog:
    """Past ``limit_s`` of one check: name it and its top frame, print every stack, end the rank (the module docstring)."""

    def __init__(self, rank: int, name: str, limit_s: float) -> None:
        self._rank, self._name, self._limit_s = rank, name, limit_s
        self._main = threading.get_ident()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"rankcheck-watchdog {name}", daemon=True)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        # faulthandler's own C thread as a backstop, should a C call hold the GIL so the watchdog cannot run.
        faulthandler.dump_traceback_later(self._limit_s + 10, exit=True)
        return self

    def __exit__(self, *exc: object) -> None:
        faulthandler.cancel_dump_traceback_later()
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        if self._done.wait(self._limit_s):
            return
        say(f"HUNG rank={self._rank} {self._name} after {self._limit_s:g} s; top frame: {top_frame(self._main)}")
        faulthandler.dump_traceback(all_threads=True)
        sys.stderr.flush()
        os._exit(HUNG_EXIT)


def run_all(rank: int, only: str | None = None) -> None:
    """Run the registered checks (those whose name contains ``only``) and exit.

    Each check is bounded by ``RANKCHECK_LIMIT_S`` where it is set (:class:`Watchdog`);
    ``RANKCHECK_REPEAT=N`` runs the selection N times over (a timing loop in one job).
    An ``only`` that no check's name contains fails: a renamed check must not
    turn a job that selects it (the GPU acceptance run's diagnoses) into a pass.
    """
    if only and not any(only in name for name, _ in _checks):
        say(f"FAIL rank={rank} {only}: no check's name contains {only!r}")  # the FAIL line tests/gpu/targets.py reads
        sys.exit(1)
    failures = 0
    ran = 0
    limit_s = float(os.environ.get("RANKCHECK_LIMIT_S", "0"))
    repeat = int(os.environ.get("RANKCHECK_REPEAT", "1"))
    for name, fn in _checks * repeat:
        if only and only not in name:
            continue
        ran += 1
        try:
            if limit_s > 0:
                with Watchdog(rank, name, limit_s):
                    fn()
            else:
                fn()
        except Exception as exc:  # reported, then the run fails
            failures += 1
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            say(f"FAIL rank={rank} {name}: {detail}")
            if os.environ.get("RANKCHECK_TRACE"):
                traceback.print_exc()
    if failures:
        say(f"FAILED rank={rank} failures={failures} of {ran}")
        sys.exit(1)
    say(f"OK rank={rank} checks={ran}")


def expect_error(kind: type[BaseException], fragment: str, fn: Callable[[], object]) -> BaseException:
    """Call ``fn``; it must raise ``kind`` with ``fragment`` in the message."""
    try:
        fn()
    except kind as exc:
        assert fragment in str(exc), f"{kind.__name__} without {fragment!r}: {exc}"
        return exc
    raise AssertionError(f"expected {kind.__name__} containing {fragment!r}, nothing raised")


def listening_socket_inodes() -> set[str]:
    """Inodes of TCP sockets in LISTEN state that this process holds open."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    listening.add(fields[9])
    return mine & listening


def default_store() -> "dist.Store":
    """The store under the default group's PrefixStores."""
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store
