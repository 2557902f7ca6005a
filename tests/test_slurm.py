"""The slurm/ templates, run for real on a two-node Slurm cluster started on this machine.

tests/slurm/cluster.sh brings up munge, slurmctld and two slurmd ("n1", "n2", each in its own
UTS + mount namespace, so MPI sees two hosts) in a temporary directory and always tears them
down. Every template is submitted with sbatch, with this interpreter's environment
(``sys.prefix``) as the job's Python environment, running slurm/check_job.py, which asserts
world size, node count, an allreduce and DDP itself and prints ``CHECK ... OK`` lines; the tests
here check the job state and exit code, those lines, and the per-rank ``RANKINFO`` lines. One
more job runs tests/ranks/hierarchical.py (every hierarchical collective, HSDP) on both nodes.

Whichever MPI mpi4py loads in this environment (an Open MPI or MPICH wheel, or a system MPI
mpi4py was built against) is the one tested: CI runs the suite once per MPI. Missing Slurm skips
the module outside CI and fails it in CI (CI=true); tests/slurm/install_deps.sh installs it.

Jobs run in LANES lanes (sbatch --dependency=singleton on a lane's job name), so at most that
many run at once, and their time limits are tests/load.py deadlines: counted from the moment a
job is seen running, in quiet seconds that pass more slowly while the machine is overloaded
(three runs in a row once timed out here with the load at 30-40 on 2 cores).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import venv
import warnings
from pathlib import Path

import mpi_library
import pytest
from launch import HIER_EVERYWHERE, RANKS_DIR, skip_unless_ci
from load import Deadline, stretch

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "slurm"
WORKLOAD = TEMPLATES / "check_job.py"
# Every hierarchical op x dtype x reduce op, topology and HSDP (tests/test_hierarchical.py runs it
# on fake nodes), here as a user's job on the cluster's two nodes.
HIERARCHICAL = RANKS_DIR / "hierarchical.py"
CLUSTER_SH = REPO / "tests" / "slurm" / "cluster.sh"

# Bounds, in quiet seconds (tests/load.py). Every job of the module is submitted at once; at
# most LANES run at a time (a job takes ~15-40 s on 2 cores when the machine is quiet).
LANES = 2
UP_TIMEOUT_S = 90
DOWN_TIMEOUT_S = 90
JOB_TIMEOUT_S = 300          # from the job's start to a final state, per job
PENDING_TIMEOUT_S = 900      # from submission to the job's start (the jobs ahead in its lane)
SUBMIT_TIMEOUT_S = 60
# Slurm's own bound on a job, in minutes: the partition's maximum; the deadlines above come first.
SLURM_TIME_LIMIT_MIN = 30
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}

# Slurm 22.05's pmi2 plugin parses a PMI-1 request from ONE read() of the task's socket (its
# source says "TODO: read until newline"). MPICH's PMI-1 client puts its UCX address in ~1 KB
# lines; when such a line arrives in two pieces, slurmstepd logs this, drops the request and the
# ranks wait in MPI_Init forever. Seen in 2 of about 30 MPICH jobs on this busy 2-core machine
# (never with Open MPI, which uses PMIx). Not an hpccomm or template fault: such a job is
# resubmitted once, with a warning.
SLURM_PMI1_RACE = "mpi/pmi2: value not properly terminated in client request"

# Open MPI under srun --mpi=pmix across nodes: a rank still inside MPI_Init (which hpccomm calls
# when it starts MPI) can take a message from ranks that have finished it (as MPI allows) before
# the library is ready to match it, and crash (open-mpi/ompi#12495). Seen with the 5.0.11 wheel
# (a segfault in ob1's matching, mca_pml_ob1_recv_frag_callback_match at address 0xe0, inside
# ompi_mpi_init; the hpccomm_run template, once in about ten runs in a day) and with Debian's
# 4.1.4 (a segfault at address 0 whose backtrace ends at the signal frame; multi_node_gpu, once in
# a landing CI, in a job where no rank had connected to the store yet). check_job.py prints a
# STARTED line on each rank once MPI is up, so such a crash shows as a process that Open MPI
# reports crashed ("[host:pid] *** Process received signal ***") with no STARTED line. Such a
# job is resubmitted once, with a warning; a second crash fails the test.
OPENMPI_CRASHED = re.compile(r"^\[([\w.-]+):(\d+)\] \*\*\* Process received signal \*\*\*", re.M)
STARTED = re.compile(r"^STARTED rank=\d+ host=(\S+) pid=(\d+)$", re.M)


def _crashed_while_starting_mpi(output: str) -> bool:
    """Whether every process Open MPI reports crashed had not printed its STARTED line yet."""
    def processes(pattern):
        return {(host.split(".")[0], pid) for host, pid in pattern.findall(output)}

    crashed = processes(OPENMPI_CRASHED)
    return bool(crashed) and not crashed & processes(STARTED)


def _launch_race(output: str) -> str | None:
    """Which known start-up failure of the MPI stack (not of hpccomm) ``output`` shows, if any."""
    if SLURM_PMI1_RACE in output:
        return "Slurm's PMI-1 read race"
    if _crashed_while_starting_mpi(output):
        return "a crash inside Open MPI's start-up"
    return None


# The cluster: 2 nodes, 8 CPUs and 2 fake GPUs each (CPUs above the real core count are fine:
# the jobs are tiny, and 8 lets all jobs of the module run at the same time).
NODES = 2
CPUS_PER_NODE = 8
GPUS_PER_NODE = 2

# template -> (extra sbatch options, check_job.py arguments, expected nodes, ranks per node)
GOOD_JOBS = {
    "single_node": ([], ["--world-size", "2", "--nodes", "1"], 1, 2),
    "multi_node_gpu": ([], ["--world-size", "4", "--nodes", "2", "--gpu-binding", "per-rank"],
                       2, 2),
    "multi_node_cpu": ([], ["--world-size", "4", "--nodes", "2", "--gpu-binding", "none"], 2, 2),
    "mpirun": ([], ["--world-size", "4", "--nodes", "2"], 2, 2),
    "hpccomm_run": ([], ["--world-size", "4", "--nodes", "2"], 2, 2),
}
ALL_TEMPLATES = sorted(p.stem for p in TEMPLATES.glob("*.sbatch"))


# ----------------------------------------------------------------------------------------------
# Prerequisites
# ----------------------------------------------------------------------------------------------
def _missing_prerequisites() -> list[str]:
    missing = [t for t in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "unshare",
                           "nsenter", "ip")
               if shutil.which(t, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None]
    if os.geteuid() != 0:
        missing.append("root (the cluster needs unshare, mount and mknod)")
    return missing


def _require_cluster_prerequisites() -> None:
    missing = _missing_prerequisites()
    if not missing:
        return
    skip_unless_ci("Slurm test cluster cannot start, missing: " + ", ".join(missing)
                   + " (run tests/slurm/install_deps.sh as root)")


# ----------------------------------------------------------------------------------------------
# The cluster
# ----------------------------------------------------------------------------------------------
class Cluster:
    def __init__(self, state: Path, env: dict[str, str], jobs_dir: Path):
        self.state = state
        self.env = env          # environment for sbatch/scontrol (and so for the jobs)
        self.jobs_dir = jobs_dir

    def run(self, args, timeout=SUBMIT_TIMEOUT_S, env=None, **kw):
        """A Slurm client command, inside the cluster's private network namespace."""
        return subprocess.run(["nsenter", f"--net={self.env['NETNS']}", "--", *args],
                              env=env or self.env, cwd=self.jobs_dir, capture_output=True,
                              text=True, timeout=timeout, **kw)

    def submit(self, template: str, *args: str, lane: int = 0, sbatch_opts=(), env=None) -> str:
        """sbatch a template in a lane (one job of a lane runs at a time); returns the job id.
        Asserts the submission succeeded."""
        cmd = ["sbatch", "--parsable", f"--output={self.jobs_dir}/{template}-%j.out",
               f"--job-name=hpccomm-test-lane{lane}", "--dependency=singleton",
               f"--time={SLURM_TIME_LIMIT_MIN}", *sbatch_opts,
               str(TEMPLATES / f"{template}.sbatch"), *args]
        res = self.run(cmd, env=env)
        assert res.returncode == 0, f"sbatch {template} failed: {res.stderr}"
        return res.stdout.strip().split(";")[0]

    def job_info(self, job_id: str) -> dict[str, str]:
        for attempt in range(3):
            # scontrol was once killed by SIGPIPE mid-query (its socket to a busy
            # slurmctld closed), and once got no answer in 30 s from a slurmctld
            # starved of CPU; a query can be repeated, an error cannot.
            try:
                res = self.run(["scontrol", "-o", "show", "job", job_id], timeout=30 * stretch())
            except subprocess.TimeoutExpired:
                if attempt == 2:
                    raise
                continue
            if res.returncode >= 0:
                break
            time.sleep(1)
        assert res.returncode == 0, f"scontrol show job {job_id}: {res.stderr}"
        return dict(re.findall(r"(\w+)=(\S*)", res.stdout))

    def wait(self, job_id: str, pending: Deadline) -> dict[str, str]:
        """Poll until the job reaches a final state; past its deadline (``pending`` until it
        starts, JOB_TIMEOUT_S from then on) cancel it and fail. A job hit by Slurm's PMI-1
        read race (see SLURM_PMI1_RACE) hangs in MPI_Init: cancel it at once (the caller
        resubmits)."""
        deadline = pending
        while True:
            info = self.job_info(job_id)
            if info.get("JobState") in TERMINAL_STATES:
                return info
            if info.get("JobState") != "PENDING" and deadline is pending:
                deadline = Deadline(JOB_TIMEOUT_S)
            if SLURM_PMI1_RACE in _read(info.get("StdOut")):
                self.run(["scancel", job_id], timeout=30)
                while info.get("JobState") not in TERMINAL_STATES:
                    time.sleep(0.5)
                    info = self.job_info(job_id)
                return info
            if deadline.expired():
                self.run(["scancel", job_id], timeout=30)
                pytest.fail(f"job {job_id} still {info.get('JobState')} after "
                            f"{deadline.describe()} (reason {info.get('Reason')}); output so far:\n"
                            + _read(info.get("StdOut")), pytrace=False)
            time.sleep(0.5)


def _read(path) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except (OSError, TypeError):
        return f"<no output file {path}>"


def _job_env(cluster_env: dict[str, str]) -> dict[str, str]:
    """What sbatch gets, and so (sbatch exports the caller's environment) what the jobs get."""
    env = {k: v for k, v in os.environ.items()
           # An outer Slurm job's variables would leak into ours and confuse srun/mpirun.
           if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMIX_", "PMI_"))}
    env.update(cluster_env)
    env.update({
        "HPCCOMM_VENV": sys.prefix,
        "PATH": f"{sys.prefix}/bin:{env.get('PATH', '')}:/usr/sbin:/sbin",
        # The jobs run as root here, on two nodes. (The cluster's network namespace has only
        # loopback, so MPI needs no interface settings.)
        **mpi_library.openmpi_env(),
    })
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Start the two-node cluster for this module; always tear it down."""
    _require_cluster_prerequisites()
    base = tmp_path_factory.mktemp("slurm")
    state, jobs = base / "state", base / "jobs"
    state.mkdir()
    jobs.mkdir()
    log_path = base / "cluster.log"
    env = dict(os.environ, CPUS_PER_NODE=str(CPUS_PER_NODE), GPUS_PER_NODE=str(GPUS_PER_NODE))
    with open(log_path, "w") as log:
        # stdin is a pipe: cluster.sh serve tears down when it closes, so even a pytest that is
        # SIGKILLed leaves nothing running. Own session: a Ctrl-C aimed at pytest does not hit
        # the daemons before our teardown runs.
        proc = subprocess.Popen(["bash", str(CLUSTER_SH), "serve", str(state)],
                                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    try:
        deadline = Deadline(UP_TIMEOUT_S)
        while not (state / "ready").exists():
            if proc.poll() is not None:
                pytest.fail(f"cluster.sh exited ({proc.returncode}) during bring-up:\n"
                            + log_path.read_text(), pytrace=False)
            if deadline.expired():
                pytest.fail(f"cluster not up after {deadline.describe()}:\n"
                            + log_path.read_text(), pytrace=False)
            time.sleep(0.1)
        cluster_env = dict(line.split("=", 1) for line in
                           (state / "env").read_text().splitlines() if "=" in line)
        yield Cluster(state, _job_env(cluster_env), jobs)
    finally:
        _teardown(proc, state, log_path)


def _teardown(proc: subprocess.Popen, state: Path, log_path: Path) -> None:
    proc.stdin.close()  # EOF: cluster.sh cancels jobs, stops the daemons by PID
    try:
        proc.wait(timeout=DOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # The script died before finishing: stop what it recorded.
        subprocess.run(["bash", str(CLUSTER_SH), "down", str(state)], timeout=DOWN_TIMEOUT_S)
    # Nothing we started may survive.
    survivors = []
    pids = state / "pids"
    for line in (pids.read_text().splitlines() if pids.exists() else []):
        name, pid = line.split()
        if Path(f"/proc/{pid}").exists() and _comm(pid) in ("munged", "slurmctld", "slurmd"):
            survivors.append(f"{name}={pid}")
    assert not survivors, (f"daemons left running after teardown: {survivors}\n"
                           + log_path.read_text())


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


# ----------------------------------------------------------------------------------------------
# All jobs are submitted together, then each test waits for its own.
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def flavour():
    return mpi_library.family()


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory):
    """A Python environment without hpccomm (nor anything else)."""
    path = tmp_path_factory.mktemp("no-hpccomm") / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(path)
    return path


@pytest.fixture(scope="module")
def jobs(cluster, bare_venv):
    """Submit every job of the module at once, in lanes: {name: [job id, pending deadline,
    resubmit]}."""
    submitted = {}

    def submit(name, *args, **kw):
        lane = len(submitted) % LANES

        def again():
            return cluster.submit(*args, lane=lane, **kw)
        submitted[name] = [again(), Deadline(PENDING_TIMEOUT_S), again]

    for template, (opts, args, _, _) in GOOD_JOBS.items():
        submit(template, template, str(WORKLOAD), *args, sbatch_opts=opts)
    # Bad input: must end at once, FAILED, with a clear message.
    submit("missing_script", "multi_node_cpu", str(cluster.jobs_dir / "no_such_script.py"))
    submit("no_hpccomm", "multi_node_cpu", str(WORKLOAD),
           env=dict(cluster.env, HPCCOMM_VENV=str(bare_venv)))
    # The hierarchical checker through the CPU template (2 nodes x 2 ranks), the hierarchical
    # path forced onto every size in many chunks.
    submit("hierarchical", "multi_node_cpu", str(HIERARCHICAL), env=dict(cluster.env, **HIER_EVERYWHERE))
    # The wrong PMI plugin starts 4 singleton worlds that would all "succeed": the workload's
    # own assertions must turn that into a failed job.
    submit("wrong_plugin", "multi_node_cpu", str(WORKLOAD), "--world-size", "4", "--nodes", "2",
           env=dict(cluster.env, HPCCOMM_SRUN_MPI="none"))
    return submitted


def _finished(cluster, jobs, name):
    job_id, pending, resubmit = jobs[name]
    info = cluster.wait(job_id, pending)
    out = _read(info.get("StdOut"))
    race = _launch_race(out)
    if race:
        warnings.warn(f"job {job_id} ({name}) hit {race}; resubmitting once")
        job_id = resubmit()
        jobs[name][:2] = [job_id, Deadline(PENDING_TIMEOUT_S)]
        info = cluster.wait(job_id, jobs[name][1])
        out = _read(info.get("StdOut"))
    return info, out


def _rankinfo(output: str) -> list[dict[str, str]]:
    return [dict(re.findall(r"(\w+)=(\S+)", line)) for line in output.splitlines()
            if line.startswith("RANKINFO ")]


def test_every_template_is_tested():
    assert sorted(GOOD_JOBS) == ALL_TEMPLATES


# The crash of a landing CI run (Debian's Open MPI 4.1.4, multi_node_gpu), as the job printed it.
_CRASH_41 = """hpccomm-slurm: job 2 on n[1-2]: 4 ranks on 2 nodes, 1 GPU(s) per rank, srun --mpi=pmix (openmpi)
[n2:30339] *** Process received signal ***
[n2:30339] Signal: Segmentation fault (11)
[n2:30339] Signal code: Address not mapped (1)
[n2:30339] Failing at address: (nil)
[n2:30339] [ 0] /lib/x86_64-linux-gnu/libc.so.6(+0x3c050)[0x7f0beae5a050]
[n2:30339] *** End of error message ***
srun: error: n2: task 3: Segmentation fault
"""


@pytest.mark.parametrize("started, start_up_crash", [
    ([], True),                                               # no rank had MPI up
    ([("n1", 30001), ("n2", 30338)], True),                   # others had, the crashed one not
    ([("n1", 30001), ("n2", 30339)], False),                  # the crashed rank was past start-up
    ([("n1", 30339)], True),                                  # same pid, other node
])
def test_a_crash_is_blamed_on_mpi_start_up_only_before_the_rank_started(started, start_up_crash):
    lines = "".join(f"STARTED rank={r} host={host} pid={pid}\n" for r, (host, pid) in enumerate(started))
    output = _CRASH_41.replace("[n2:30339] *** Process received signal", lines + "[n2:30339] *** Process received signal", 1)
    assert (_launch_race(output) is not None) == start_up_crash
    assert _launch_race(lines) is None  # no crash at all


@pytest.mark.parametrize("template", sorted(GOOD_JOBS))
def test_template_runs_checks(cluster, jobs, flavour, template):
    _, args, nodes, per_node = GOOD_JOBS[template]
    world = nodes * per_node
    info, out = _finished(cluster, jobs, template)
    where = f"\n--- job output ({info.get('StdOut')}) ---\n{out}"
    assert info["JobState"] == "COMPLETED", info["JobState"] + where
    assert info["ExitCode"] == "0:0", info["ExitCode"] + where

    # The workload's own verdicts.
    for name in ("world_size", "nodes", "env", "allreduce", "ddp"):
        assert re.search(rf"^CHECK {name} .* OK$", out, re.M), f"no 'CHECK {name} ... OK'{where}"
    assert f"CHECK world_size world_size={world} expected={world} OK" in out, where
    assert "CHECK ddp steps=3 " in out, where
    assert "ALL CHECKS OK" in out, where
    assert "FAIL" not in out, where

    # And our own reading of where the ranks ran.
    ranks = _rankinfo(out)
    assert sorted(int(r["rank"]) for r in ranks) == list(range(world)), where
    hosts = {r["host"] for r in ranks}
    assert len(hosts) == nodes and hosts <= {"n1", "n2"}, where
    for host in hosts:
        on_host = [r for r in ranks if r["host"] == host]
        assert len(on_host) == per_node, where
        assert sorted(int(r["local_rank"]) for r in on_host) == list(range(per_node)), where
        cvds = [r["CUDA_VISIBLE_DEVICES"] for r in on_host]
        if template == "multi_node_gpu":
            # Each local rank its own fake GPU.
            assert "<unset>" not in cvds and len(set(cvds)) == per_node, where
            assert "CHECK gpu_binding" in out, where
        elif template == "multi_node_cpu":
            assert set(cvds) <= {"<unset>", ""}, where

    # The launcher matched the MPI wheel in this environment.
    if template in ("single_node", "multi_node_gpu", "multi_node_cpu"):
        plugin = "pmix" if flavour == "openmpi" else "pmi2"
        assert f"srun --mpi={plugin} ({flavour})" in out, where
    elif template == "mpirun":
        # The launcher of the MPI mpi4py loads, wherever it lives (venv, /usr/bin, a module).
        launcher = re.search(rf"nodes, (\S+) \({flavour}\), ", out)
        assert launcher and mpi_library.launcher_runs_library(launcher.group(1)), where
    elif template == "hpccomm_run":
        plugin = "pmix" if flavour == "openmpi" else "pmi2"
        assert f"hpccomm-run ({flavour}): srun" in out and f"--mpi={plugin}" in out, where


def _assert_failed_fast(info, out, exit_code, message):
    where = f"\n--- job output ({info.get('StdOut')}) ---\n{out}"
    assert info["JobState"] == "FAILED", info["JobState"] + where
    assert info["ExitCode"] == f"{exit_code}:0", info["ExitCode"] + where
    assert message in out, where
    assert "RANKINFO" not in out, "ranks were started" + where
    h, m, s = (int(x) for x in info["RunTime"].split(":")[-3:])
    assert h * 3600 + m * 60 + s <= 15 * stretch(), f"took {info['RunTime']} to fail{where}"


def test_hierarchical_collectives_on_two_nodes(cluster, jobs):
    info, out = _finished(cluster, jobs, "hierarchical")
    where = f"\n--- job output ({info.get('StdOut')}) ---\n{out}"
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", info["JobState"] + where
    assert "LAYOUT nodes=2 ranks_per_node=2,2 hierarchical=True" in out, where
    # Each of the 4 ranks ran every check (its topology check compares with the hostnames).
    finished = re.findall(r"^OK rank=(\d+) checks=(\d+)$", out, re.M)
    assert sorted(int(rank) for rank, _ in finished) == [0, 1, 2, 3], where
    assert len({checks for _, checks in finished}) == 1, where
    assert "FAIL" not in out, where


def test_missing_script_fails_at_once(cluster, jobs):
    info, out = _finished(cluster, jobs, "missing_script")
    _assert_failed_fast(info, out, 2, "hpccomm-slurm: ERROR: script '")
    assert "no_such_script.py' not found" in out


def test_environment_without_hpccomm_fails_at_once(cluster, jobs, bare_venv):
    info, out = _finished(cluster, jobs, "no_hpccomm")
    _assert_failed_fast(info, out, 3, f"Python environment {bare_venv} lacks hpccomm")


def test_wrong_pmi_plugin_is_caught_by_the_workload(cluster, jobs):
    info, out = _finished(cluster, jobs, "wrong_plugin")
    where = f"\n--- job output ---\n{out}"
    assert info["JobState"] == "FAILED" and info["ExitCode"] != "0:0", info["JobState"] + where
    assert "ALL CHECKS OK" not in out, where
    # Every rank found itself alone (Open MPI 5, MPICH), or MPI refused to start without a PMI
    # server (Open MPI 4: "OMPI was not built with SLURM's PMI support", then an error in
    # MPI_Init_thread), or the workload crashed.
    signs = ("CHECK world_size world_size=1 expected=4 FAIL", "check_job.py crashed",
             "An error occurred in MPI_Init")
    assert any(sign in out for sign in signs), where


@pytest.mark.parametrize("template", ALL_TEMPLATES)
@pytest.mark.parametrize("case", ["missing_script", "no_hpccomm"])
def test_template_rejects_bad_input_outside_slurm(tmp_path, bare_venv, template, case):
    """The preflight needs no cluster: run each template with bash directly."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    if case == "missing_script":
        env["HPCCOMM_VENV"] = sys.prefix
        args, code, message = [str(tmp_path / "nope.py")], 2, "not found"
    else:
        env["HPCCOMM_VENV"] = str(bare_venv)
        args, code, message = [str(WORKLOAD)], 3, "lacks hpccomm"
    t0 = time.monotonic()
    res = subprocess.run(["bash", str(TEMPLATES / f"{template}.sbatch"), *args], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == code, res.stdout + res.stderr
    assert "hpccomm-slurm: ERROR:" in res.stderr and message in res.stderr, res.stderr
    assert time.monotonic() - t0 < 30 * stretch()


def test_template_without_environment_or_script_fails(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("HPCCOMM_VENV", "VIRTUAL_ENV", "CONDA_PREFIX", "HPCCOMM_SCRIPT")}
    res = subprocess.run(["bash", str(TEMPLATES / "single_node.sbatch"), str(WORKLOAD)], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "no Python environment" in res.stderr, res.stderr
    env["HPCCOMM_VENV"] = sys.prefix
    res = subprocess.run(["bash", str(TEMPLATES / "single_node.sbatch")], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "no script given" in res.stderr, res.stderr


@pytest.mark.parametrize("opts", [
    ["--nodes=3"],
    ["--nodes=2", f"--gpus-per-node={GPUS_PER_NODE + 1}"],
    ["--nodes=1", f"--ntasks-per-node={CPUS_PER_NODE + 1}"],
], ids=["nodes", "gpus", "cpus"])
def test_oversized_job_fails_at_submit(cluster, opts):
    before = set(cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split())
    t0 = time.monotonic()
    res = cluster.run(["sbatch", "--parsable", "--output=/dev/null", *opts,
                       str(TEMPLATES / "multi_node_cpu.sbatch"), str(WORKLOAD)])
    assert res.returncode != 0, f"sbatch accepted an impossible job: {res.stdout}"
    assert "Batch job submission failed" in res.stderr, res.stderr
    assert time.monotonic() - t0 < 30 * stretch()
    # ... and nothing was queued.
    after = set(cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split())
    assert after <= before
