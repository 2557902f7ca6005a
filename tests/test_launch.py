"""tests/launch.py itself: a run past its limit is killed, and says where each rank was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch import JOB_HEADER, JOB_LOGS_ENV, _cmdline, _descendants, _running, run_ranks

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


def test_a_job_log_keeps_what_the_ranks_wrote_though_the_process_that_launched_them_is_killed(tmp_path):
    # The GPU acceptance run ends a whole pytest at its limit: the ranks' reports and stacks, held in pytest's
    # memory, went with it. With RANK_JOB_LOGS they are in a file as they come.
    launcher = subprocess.Popen(
        [sys.executable, "-c", "from launch import run_ranks; run_ranks(2, 'hang.py', limit_s=60)"],
        cwd=Path(__file__).parent, env={**os.environ, JOB_LOGS_ENV: str(tmp_path)}, start_new_session=True,
    )
    give_up = time.monotonic() + 60
    try:
        while time.monotonic() < give_up:
            logs = list(tmp_path.glob("*.log"))
            if logs and logs[0].read_text(errors="replace").count("READY") == 2:
                break
            time.sleep(0.1)
        processes = _descendants(launcher.pid)
    finally:
        launcher.kill()  # as the acceptance run's limit does: no time to write anything
        launcher.wait()
    for pid in processes:  # the rank job runs in a session of its own
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    [log] = tmp_path.glob("*.log")
    header, body = log.read_text(errors="replace").split("\n", 1)
    assert header.startswith(JOB_HEADER + "tests/test_launch.py::" + "test_a_job_log_keeps"), header
    assert "hang.py" in header, header
    assert body.count("READY") == 2, body


def test_with_a_job_log_a_run_reports_the_same_output(tmp_path, monkeypatch):
    monkeypatch.setenv(JOB_LOGS_ENV, str(tmp_path))
    run = run_ranks(2, "hang.py", limit_s=LIMIT_S)
    assert run.timed_out and run.output.count(" in waiting_forever") == 2, run.output[-4000:]
    [log] = tmp_path.glob("*.log")
    body = log.read_text(errors="replace").split("\n", 1)[1]
    assert run.output.startswith(body) and body.count(" in waiting_forever") == 2, (body[-2000:], run.output[-2000:])
