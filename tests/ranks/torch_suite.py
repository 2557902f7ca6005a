"""PyTorch's own distributed tests, run on hpccomm; usage: torch_suite.py TEST [TEST ...] | --all.

torch ships them as ``DistributedTest._DistTestBase``
(torch/testing/_internal/distributed/distributed_test.py) and runs them
through a harness that spawns the ranks itself; under an MPI launcher each
rank here builds the test case instead and runs the named tests in order,
each on a fresh default group, as torch's harness does. ``BACKEND=gloo``
makes torch pick Gloo's set of tests and expectations (hpccomm, like Gloo, is
a CPU backend with timeouts); the group itself is hpccomm's.

Prints ``RESULT rank=R test=NAME outcome=passed|failed|skipped detail=...``
per test, then ``DONE rank=R``; tests/test_torch_suite.py judges the outcomes.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import unittest
from datetime import timedelta

import hpccomm
from rankcheck import say

WORLD = hpccomm.identity()
_comm = hpccomm.world.mpi().COMM_WORLD
_temp = _comm.bcast(tempfile.mkdtemp(prefix="hpccomm-torch-suite-") if WORLD.rank == 0 else None, root=0)
if WORLD.rank == 0:
    for sub in ("barrier", "test_dir", "init_dir"):
        os.mkdir(os.path.join(_temp, sub))
_comm.Barrier()
os.environ.update(BACKEND="gloo", WORLD_SIZE=str(WORLD.world_size), TEMP_DIR=_temp)

import torch.distributed as dist  # noqa: E402  (after the environment torch's test module reads)
from torch.testing._internal.common_distributed import TEST_SKIPS  # noqa: E402
from torch.testing._internal.common_utils import TestCase  # noqa: E402
from torch.testing._internal.distributed.distributed_test import Barrier, DistributedTest  # noqa: E402


class OnHpccomm(DistributedTest._DistTestBase, TestCase):
    """One of torch's distributed tests, on this rank of the launched job."""

    rank = WORLD.rank
    world_size = str(WORLD.world_size)  # torch's harness keeps it as the env string


_SKIP_EXITS = {f"SystemExit: {skip.exit_code}": skip.message for skip in TEST_SKIPS.values()}


def run(name: str) -> tuple[str, str]:
    """Run torch's test ``name`` on a fresh hpccomm default group: (outcome, detail)."""
    _comm.Barrier()  # every rank has left the last test's file barrier before it is cleared
    if WORLD.rank == 0:
        Barrier.init()
    _comm.Barrier()
    Barrier.barrier_id = 0
    dist.init_process_group("hpccomm", timeout=timedelta(seconds=60))
    case = OnHpccomm(name)
    case._barrier()
    result = unittest.TestResult()
    case.run(result)
    case._barrier()
    if dist.is_initialized():
        dist.destroy_process_group()
    for outcomes in (result.failures, result.errors):
        if outcomes:
            lines = [line for line in outcomes[0][1].strip().splitlines() if "PYTORCH_PRINT_REPRO" not in line]
            last = lines[-1] if lines else ""
            # torch's skip decorators exit with a code its harness reads as a skip
            if last in _SKIP_EXITS:
                return "skipped", _SKIP_EXITS[last]
            if os.environ.get("RANKCHECK_TRACE"):
                print(outcomes[0][1], flush=True)
            return "failed", last
    if result.skipped:
        return "skipped", result.skipped[0][1]
    return "passed", ""


names = sorted(n for n in dir(OnHpccomm) if n.startswith("test_")) if sys.argv[1:] == ["--all"] else sys.argv[1:]
for name in names:
    outcome, detail = run(name)
    say(f"RESULT rank={WORLD.rank} test={name} outcome={outcome} detail={detail[:300]}")
_comm.Barrier()  # every rank is done with the directory
if WORLD.rank == 0:
    shutil.rmtree(_temp, ignore_errors=True)
say(f"DONE rank={WORLD.rank}")
