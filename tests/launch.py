"""Launch rank scripts under a real MPI launcher, with a hard time limit.

Every multi-rank test goes through :func:`run_ranks`, which starts
``hpccomm-run -n N python tests/ranks/<script>.py`` in a new session, or
``<launcher> -n N python ...`` when ``HPCCOMM_TEST_LAUNCHER`` names another
launcher (CI runs the collective and failure tests once more under the MPI
library's own ``mpirun``/``mpiexec``, e.g.
``HPCCOMM_TEST_LAUNCHER="mpirun --oversubscribe --bind-to none"``), or
:func:`run_launcher`, for any launcher command (tests/nodes.py). A run
that outlives its limit is killed, launcher and ranks (which the launcher may
start in sessions of their own), by PID: only processes this helper started.
The test then fails, so a hang can never run into CI's time limit.

Where ``RANK_JOB_LOGS`` names a directory, each job's output is also written
there as it comes, one file a job (:func:`_job_log`): tests/gpu/acceptance.sh
sets it for its pytest passes, so that the ranks' reports and stacks outlive a
pytest ended at its limit.

A launcher that outlives all of its ranks by :data:`STUCK_LAUNCHER_S` is
killed too, and the run reports it (``launcher_stuck``) with the time its last
rank ended: Debian's Open MPI 4.1.4 ``mpirun`` sometimes never reaps ranks that
ended through ``MPI_Abort`` while it was already ending the job for another
rank's non-zero exit (1 run in 15 of ``test_failures``' exit cases, seen here);
it is left blocked on a futex beside its zombie ranks. Tests of how fast a job
ends judge the ranks, which is what hpccomm controls.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import pytest

RANKS_DIR = Path(__file__).parent / "ranks"
DEFAULT_LIMIT_S = 120
FAIL_FAST_S = 10.0  # every rank ends within this long after one rank fails
#: A launcher still running this long after every rank it started has ended is stuck (the module docstring).
STUCK_LAUNCHER_S = 10.0
POLL_S = 0.5
#: How long a hung run's ranks get to print their stacks before they are killed.
STACKS_WAIT_S = 2.0
#: Names a directory where every rank job's output is also written, as it comes (:func:`_job_log`).
JOB_LOGS_ENV = "RANK_JOB_LOGS"
#: The first line of such a file, before the job's pytest item (tests/gpu/targets.py reads it).
JOB_HEADER = "rank job of "
#: The hierarchical path forced onto every size, in 64-byte chunks (1 KiB slots): many chunks and pieces.
HIER_EVERYWHERE = {"HPCCOMM_ALGO": "hier", "HPCCOMM_SHM_MIN_BYTES": "1", "HPCCOMM_SHM_SLOT_BYTES": "1024"}
#: hpccomm-run of the environment under test.
HPCCOMM_RUN = [os.path.join(os.path.dirname(sys.executable), "hpccomm-run")]
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
#: The world size at which CI runs a scenario in every environment (odd: it catches bugs that powers of 2 hide).
EVERYWHERE_SIZE = 3


def world_sizes(*sizes: int) -> list:
    """``sizes`` as pytest parameters for ``nprocs``; each but :data:`EVERYWHERE_SIZE` marked ``size_variant``.

    A scenario at another world size runs the same hpccomm code on the same
    MPI and torch calls, in other shapes (a lone rank, a power of 2, more
    ranks): CI runs those in its first environment only (.ci/run), and the
    scenario at :data:`EVERYWHERE_SIZE` in every environment.
    """
    return [pytest.param(n, marks=size_marks(n)) for n in sizes]


def size_marks(nprocs: int) -> tuple:
    """The marks of a scenario's run on ``nprocs`` ranks: ``size_variant`` unless :data:`EVERYWHERE_SIZE`.

    For parameters that carry more than the size (see :func:`world_sizes`).
    """
    return () if nprocs == EVERYWHERE_SIZE else (pytest.mark.size_variant,)


def skip_unless_ci(message: str) -> None:
    """Skip the test, saying ``message``; in CI (``CI=true``) fail it instead: there every test must run."""
    if IN_CI:
        pytest.fail(message + " -- CI=true, so this is a failure, not a skip", pytrace=False)
    pytest.skip(message)


def default_launcher() -> list[str]:
    """``HPCCOMM_TEST_LAUNCHER`` split into words, else :data:`HPCCOMM_RUN`."""
    named = os.environ.get("HPCCOMM_TEST_LAUNCHER", "").strip()
    return shlex.split(named) if named else list(HPCCOMM_RUN)


@dataclass
class RankRun:
    """What a launch produced."""

    returncode: int
    output: str
    timed_out: bool
    #: When (time.time()) the last rank was seen ended, if the launcher then outlived its ranks by
    #: STUCK_LAUNCHER_S and was killed (returncode is then -9); else None.
    ranks_ended_at: float | None = field(default=None, kw_only=True)

    @property
    def launcher_stuck(self) -> bool:
        """Whether the launcher outlived all of its ranks and was killed."""
        return self.ranks_ended_at is not None

    def lines(self, prefix: str) -> list[str]:
        """Output lines starting with ``prefix``."""
        return [line for line in self.output.splitlines() if line.startswith(prefix)]


def run_ranks(
    nprocs: int,
    script: str,
    *args: str,
    env: dict[str, str] | None = None,
    limit_s: float = DEFAULT_LIMIT_S,
    launcher: Sequence[str] | None = None,
    python: str = sys.executable,
    stacks_on_timeout: bool = True,
) -> RankRun:
    """Run ``tests/ranks/<script>`` on ``nprocs`` ranks and return its result.

    Args:
        nprocs: number of ranks.
        script: file name under tests/ranks.
        args: arguments for the script.
        env: extra environment variables for the ranks.
        limit_s: wall-clock limit; past it the run is killed and timed_out set.
        launcher: the launcher's command words (default: :func:`default_launcher`).
        python: the interpreter as the command names it (a bare ``python3``
            tests how the launcher resolves it).
        stacks_on_timeout: see :func:`run_launcher`.
    """
    words = list(launcher) if launcher is not None else default_launcher()
    return run_launcher([*words, "-n", str(nprocs)], script, *args, env=env, limit_s=limit_s, python=python,
                        stacks_on_timeout=stacks_on_timeout)


def run_launcher(
    launcher: Sequence[str],
    script: str,
    *args: str,
    env: dict[str, str] | None = None,
    limit_s: float = DEFAULT_LIMIT_S,
    python: str = sys.executable,
    stacks_on_timeout: bool = True,
) -> RankRun:
    """Run ``launcher ... python tests/ranks/<script> args`` in a new session, killed past ``limit_s``.

    Args:
        launcher: the launcher and its options, up to the program.
        script: file name under tests/ranks.
        args: arguments for the script.
        env: extra environment variables for the launcher and ranks.
        limit_s: wall-clock limit; past it the run is killed and timed_out set.
        python: the interpreter as the command names it.
        stacks_on_timeout: past ``limit_s``, first send the ranks SIGUSR1 and
            wait :data:`STACKS_WAIT_S` (a script that registers
            ``faulthandler`` for it, as every rankcheck script does, prints
            every thread's stack; one that does not just ends), then kill.
            False only to kill at once.
    """
    command = [*launcher, python, str(RANKS_DIR / script), *args]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    log = _job_log(script, command)
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE if log is None else log[0], stderr=subprocess.STDOUT, text=True,
        env=full_env, start_new_session=True,
    )

    def output_of(piped: str | None) -> str:
        if log is None:
            return piped or ""
        log[0].close()
        return log[1].read_text(errors="replace").split("\n", 1)[1]  # less the header

    deadline = time.monotonic() + limit_s
    watch = _RankWatch(proc.pid, str(RANKS_DIR / script))
    while True:
        try:
            # communicate() may be called again after a timeout without losing output.
            output, _ = proc.communicate(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
            return RankRun(proc.returncode, output_of(output), False)
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() >= deadline:
            ranks = _descendants(proc.pid)
            hung = _describe([proc.pid, *ranks])
            if stacks_on_timeout:
                _signal_ranks(ranks, str(RANKS_DIR / script), signal.SIGUSR1)
                time.sleep(STACKS_WAIT_S)
            output = output_of(_kill(proc, ranks))
            return RankRun(proc.returncode, f"{output}\nstill running at the {limit_s:.0f} s limit:\n{hung}", True)
        ended_at = watch.all_ended_at()
        if ended_at is not None and time.time() - ended_at >= STUCK_LAUNCHER_S:
            hung = _describe([proc.pid])
            output = output_of(_kill(proc, _descendants(proc.pid)))
            note = (f"\nthe launcher was still running {STUCK_LAUNCHER_S:.0f} s after its last rank ended "
                    f"(killed):\n{hung}")
            return RankRun(proc.returncode, output + note, False, ranks_ended_at=ended_at)


def _job_log(script: str, command: Sequence[str]) -> tuple[TextIO, Path] | None:
    """Where a rank job writes, as it runs, where :data:`JOB_LOGS_ENV` names a directory; else None (a pipe).

    The file's first line names the job: the pytest item that runs it (``PYTEST_CURRENT_TEST``), else the
    script, then the command. The GPU acceptance run ends a whole ``pytest`` at its limit: what its rank jobs
    wrote into pytest's memory went with it, the failed checks' HUNG lines and stacks included.
    """
    directory = os.environ.get(JOB_LOGS_ENV)
    if not directory:
        return None
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    item = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0] or script
    path = folder / f"{len(list(folder.glob('*.log'))) + 1:03d}-{Path(script).stem}.log"
    sink = path.open("w", encoding="utf-8")
    sink.write(f"{JOB_HEADER}{item} ({shlex.join(command)})\n")
    sink.flush()
    return sink, path


class _RankWatch:
    """Tells when every rank process a launcher started has ended.

    Ranks are the descendants running ``script`` whose children do not run it too (``hpccomm-run``
    and ``mpiexec`` name the script on their command lines as well). A rank counts as ended once it
    is gone or a zombie (ended, not yet reaped by its parent).
    """

    def __init__(self, launcher_pid: int, script: str):
        self.launcher_pid = launcher_pid
        self.script = script
        self.parent_of: dict[int, int] = {}  # every descendant seen running the script -> its parent
        self.ended_since: float | None = None

    def all_ended_at(self) -> float | None:
        """When the ranks were first seen all ended (None while any runs, or before any was seen)."""
        for pid in _descendants(self.launcher_pid):
            if pid not in self.parent_of and self.script in _cmdline(pid):
                try:
                    self.parent_of[pid] = int(_stat(pid)[1])
                except (OSError, IndexError, ValueError):
                    continue
        ranks = set(self.parent_of) - set(self.parent_of.values())
        if not ranks or any(_running(pid) for pid in ranks):
            self.ended_since = None
        elif self.ended_since is None:
            self.ended_since = time.time()
        return self.ended_since


def _cmdline(pid: int) -> str:
    """The process's command line, words joined by spaces ('' once it has ended)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _running(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        return _stat(pid)[0] != "Z"
    except (OSError, IndexError):
        return False


def _signal_ranks(pids: list[int], script: str, signum: int) -> None:
    """Send ``signum`` to those of ``pids`` that run ``script`` (``python <script> ...``, not a launcher naming it)."""
    for pid in pids:
        words = _cmdline(pid).split(" ")
        if len(words) > 1 and words[1] == script:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass


def _kill(proc: subprocess.Popen, ranks: list[int]) -> str:
    """SIGKILL the launcher's session and ``ranks`` (which may run in sessions of their own); its output."""
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in ranks:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    output, _ = proc.communicate()
    return output


def _stat(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name: state, parent PID, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _descendants(root: int) -> list[int]:
    """PIDs of every process descended from ``root``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            parent = int(_stat(entry)[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, frontier = [], [root]
    while frontier:
        kids = children.get(frontier.pop(), [])
        found += kids
        frontier += kids
    return found


def _describe(pids: list[int]) -> str:
    """One line per live process: PID, state, the kernel function it sleeps in, command line.

    Says, of a hang, whether the ranks were still alive (and blocked where) or only the launcher.
    """
    lines = []
    for pid in pids:
        try:
            state = _stat(pid)[0]
            waits_in = Path(f"/proc/{pid}/wchan").read_text() or "-"
            command = _cmdline(pid)
        except (OSError, IndexError):
            continue  # ended meanwhile
        lines.append(f"  pid {pid} state {state} in {waits_in}: {command.strip()[:160]}")
    return "\n".join(lines) or "  (none: every process had ended)"


def assert_all_ranks_ok(run: RankRun, nprocs: int, tag: str = "OK") -> None:
    """Fail unless the run exited 0 in time and every rank printed ``<tag> rank=<r>``."""
    assert not run.timed_out, f"ranks timed out:\n{run.output[-6000:]}"
    assert run.returncode == 0, f"ranks failed (exit {run.returncode}):\n{run.output[-6000:]}"
    # Searched in the whole output, not line by line: MPICH's Hydra forwards each rank's writes as they
    # come, so two ranks' "OK rank=1" and "OK rank=0" can share a line before their newlines arrive, and a
    # line of prose before its newline ("...without overlapping computeOK rank=0"). Not inside another
    # marker, whose names are capitals and underscores ("SOAK_OK rank=0").
    seen = set(re.findall(rf"(?<![A-Z_]){re.escape(tag)} rank=(\d+)", run.output))
    assert seen == {str(r) for r in range(nprocs)}, f"missing '{tag}' from some ranks:\n{run.output[-6000:]}"


def ready_time(run: RankRun) -> float:
    """The latest ``READY ... t=<time>`` stamp the ranks printed."""
    stamps = [float(line.split("t=")[1]) for line in run.lines("READY")]
    assert stamps, f"ranks never got ready:\n{run.output[-4000:]}"
    return max(stamps)


def check_failed_fast(run: RankRun, mode: str, evidence: list[str]) -> None:
    """Fail unless the run failed (non-zero) within FAIL_FAST_S of its ranks' READY lines, saying ``evidence``."""
    ended = run.ranks_ended_at or time.time()
    assert not run.timed_out, f"job hung after rank 1 failed ({mode}):\n{run.output[-4000:]}"
    assert run.returncode != 0, f"launcher exited 0 although rank 1 failed:\n{run.output[-4000:]}"
    took = ended - ready_time(run)
    assert took < FAIL_FAST_S, f"job took {took:.1f}s to end after the failure"
    assert "UNEXPECTED" not in run.output, f"a rank went on as if rank 1 had not failed:\n{run.output[-4000:]}"
    for fragment in evidence:
        assert fragment in run.output, f"output does not say {fragment!r}:\n{run.output[-4000:]}"
    if mode.startswith("sigkill"):
        lowered = run.output.lower()
        # The launcher names the signal, unless a peer noticed the killed rank first (a race, seen
        # in the hierarchical case, more often under load): Open MPI aborts the job naming the peer
        # whose TCP connection dropped ("unexpectedly disconnected", or the send's "Connection
        # reset by peer"); MPICH over UCX aborts the rank whose single-copy read of the killed
        # rank's memory (process_vm_readv) failed with "No such process".
        causes = ("signal 9", "killed", "exit code: 9", "peer process has unexpectedly disconnected",
                  "connection reset by peer", "no such process")
        assert any(cause in lowered for cause in causes), run.output[-4000:]
