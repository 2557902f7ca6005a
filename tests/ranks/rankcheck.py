"""A tiny check runner for rank scripts: run named checks, report, exit non-zero on failure.

Each rank runs every check, prints ``FAIL rank=<r> <name>: <error>`` for
each failure and finally ``OK rank=<r> checks=<n>`` or exits 1, which the
pytest side (tests/launch.py) reads.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

_checks: list[tuple[str, Callable[[], None]]] = []


def say(line: str) -> None:
    """Print one marker line in a single write, so launchers never interleave it with another rank's."""
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


def check(fn: Callable[[], None]) -> Callable[[], None]:
    """Register ``fn`` as a check."""
    _checks.append((fn.__name__, fn))
    return fn


def run_all(rank: int, only: str | None = None) -> None:
    """Run the registered checks (those whose name contains ``only``) and exit."""
    failures = 0
    ran = 0
    for name, fn in _checks:
        if only and only not in name:
            continue
        ran += 1
        try:
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
