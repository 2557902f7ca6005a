"""tests/launch.py itself: a run past its limit is killed, and says where each rank was."""

from __future__ import annotations

import time

import pytest
from launch import _cmdline, _running, run_ranks

pytestmark = pytest.mark.one_environment

#: Far more than the launcher and two bare interpreters need to start (well under a second here).
LIMIT_S = 10
#: How long a SIGKILLed rank may take to be gone: the kill is sent before run_ranks returns, not awaited.
GONE_WITHIN_S = 10


def _alive(pid: int) -> bool:
    """Whether ``pid`` is still a live (not zombie) hang.py rank, not a later process given its number."""
    return _running(pid) and "hang.py" in _cmdline(pid)


def test_a_run_past_its_limit_prints_every_ranks_stack_and_leaves_no_rank():
    run = run_ranks(2, "hang.py", limit_s=LIMIT_S)
    assert run.timed_out, run.output[-4000:]
    pids = [int(line.split("pid=")[1]) for line in run.lines("READY")]
    assert len(pids) == 2, run.output[-4000:]
    # faulthandler's dump, one per rank, down to the function the rank waits in.
    assert run.output.count(" in waiting_forever") == 2, run.output[-4000:]
    assert f"still running at the {LIMIT_S} s limit" in run.output
    give_up = time.monotonic() + GONE_WITHIN_S
    while any(map(_alive, pids)) and time.monotonic() < give_up:
        time.sleep(0.1)
    assert not any(map(_alive, pids)), pids
