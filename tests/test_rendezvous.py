"""Identity and rendezvous from MPI: no MASTER_ADDR needed, user values honoured or checked."""

import concurrent.futures
import os
import socket
import subprocess
import sys

import pytest
from launch import RANKS_DIR, assert_all_ranks_ok, run_ranks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_private_store_and_no_listening_socket():
    run = run_ranks(3, "rendezvous.py", "private-store")
    assert_all_ranks_ok(run, 3)


def test_two_jobs_on_one_node_at_once():
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: run_ranks(2, "rendezvous.py", "private-store"), range(2)))
    for run in runs:
        assert_all_ranks_ok(run, 2)


@pytest.mark.parametrize("ending", ["ends", "aborts"])
def test_the_file_store_leaves_no_file_however_the_job_ends(ending):
    """Regression: a job on the FileStore (no MPI_THREAD_MULTIPLE, or HPCCOMM_STORE=file) that fail-fast aborted
    left its hpccomm-store-* file in the temporary directory: the launcher ends the ranks before any destructor."""
    run = run_ranks(2, "rendezvous.py", f"file-store-{ending}", env={"HPCCOMM_STORE": "file"})
    assert not run.timed_out, run.output[-4000:]
    if ending == "ends":
        assert_all_ranks_ok(run, 2)
    else:
        assert run.returncode != 0 and "uncaught RuntimeError: rank 1 fails on purpose; aborting the job" in run.output, \
            run.output[-4000:]
    paths = {line.split()[-1] for line in run.lines("STORE-FILE")}
    assert len(paths) == 1 and len(run.lines("STORE-FILE")) == 2, run.output[-4000:]
    (path,) = paths
    assert not os.path.exists(path), f"the job {ending} and left its store's file {path}"


def test_master_addr_and_port_are_honoured():
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    run = run_ranks(2, "rendezvous.py", "master-addr", env=env)
    assert_all_ranks_ok(run, 2)


@pytest.mark.parametrize("mode", ["wrong-rank", "wrong-world-size"])
def test_user_identity_that_disagrees_with_mpi_is_a_value_error(mode):
    run = run_ranks(2, "rendezvous.py", mode)
    assert run.returncode == 0 and not run.timed_out, run.output[-4000:]
    assert len(run.lines("REJECTED")) == 2, run.output[-4000:]


def test_plain_python_is_a_world_of_one():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "PMIX", "MASTER_"))}
    proc = subprocess.run(
        [sys.executable, str(RANKS_DIR / "rendezvous.py"), "singleton"],
        capture_output=True, text=True, timeout=120, env=env, cwd=RANKS_DIR,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK rank=0 mode=singleton" in proc.stdout
