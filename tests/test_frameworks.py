"""Frameworks on top of hpccomm, unchanged: DCP, Lightning, HF accelerate.

Each trains or checkpoints under a real MPI launcher and checks results
against single-process values. A framework that is not installed skips, saying so.
"""

import importlib.util

import pytest
from launch import assert_all_ranks_ok, run_ranks, world_sizes


def needs(package: str):
    return pytest.mark.skipif(
        importlib.util.find_spec(package) is None, reason=f"{package} is not installed (pip install torch==2.15.0 '.[test]')"
    )


@pytest.mark.parametrize("nprocs", world_sizes(1, 3))
def test_dcp_save_load_async_save_and_broadcast_from_rank0(nprocs):
    assert_all_ranks_ok(run_ranks(nprocs, "dcp.py", limit_s=240), nprocs)


@needs("lightning")
@pytest.mark.parametrize("nprocs", [2])
def test_lightning_ddp_strategy(nprocs):
    assert_all_ranks_ok(run_ranks(nprocs, "lightning_ddp.py", limit_s=300), nprocs)


@needs("accelerate")
@pytest.mark.parametrize("nprocs", [2])
def test_accelerate_with_the_group_created_first(nprocs):
    assert_all_ranks_ok(run_ranks(nprocs, "accelerate_ddp.py", limit_s=300), nprocs)
