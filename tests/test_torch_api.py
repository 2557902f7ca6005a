"""torch's group API on hpccomm, in the shell the installed torch takes (tests/ranks/torch_api.py).

On torch >= 2.14 hpccomm is a Backend inside torch's ProcessGroup: split_group,
new_group split from a bound default group, batch_isend_irecv, any-source
receives, set_timeout, abort hooks, the flight recorder, a mixed backend
string. On torch <= 2.13 hpccomm is a ProcessGroup: ``_dist2``. And, on any
torch, ``init_process_group("hpccomm")`` without ``import hpccomm``.
"""

import os
import subprocess
import sys

import pytest
from launch import assert_all_ranks_ok, run_ranks, world_sizes


@pytest.mark.parametrize("nprocs", world_sizes(2, 3))
def test_group_api(nprocs):
    assert_all_ranks_ok(run_ranks(nprocs, "torch_api.py"), nprocs)


def test_group_api_with_a_bound_device():
    # torch then makes new groups by splitting the default group's backend.
    assert_all_ranks_ok(run_ranks(3, "torch_api.py", "--bound-device"), 3)


def test_mixed_backend_string():
    # "cpu:hpccomm,cuda:nccl" is what users write; NCCL cannot be created without a GPU,
    # so the CUDA half here is Gloo: the CPU half, hpccomm's, is the same.
    assert_all_ranks_ok(run_ranks(2, "torch_api.py", "--backend=cpu:hpccomm,cuda:gloo"), 2)


def test_init_without_importing_hpccomm():
    env = {name: "" for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    run = run_ranks(2, "discovery.py", env=env)
    assert_all_ranks_ok(run, 2)


def test_autoload_does_nothing_outside_a_launcher():
    env = {k: v for k, v in os.environ.items() if k not in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")}
    code = "import sys, torch; print('hpccomm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", out.stdout
