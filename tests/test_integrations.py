"""DDP and FSDP2 parity with single-process training; DeviceMesh; functional collectives; DTensor."""

import pytest
from launch import assert_all_ranks_ok, run_ranks, world_sizes


@pytest.mark.parametrize("nprocs", world_sizes(2, 3, 4))
def test_ddp_fsdp2_devicemesh_functional(nprocs):
    run = run_ranks(nprocs, "integrations.py", limit_s=300)
    assert_all_ranks_ok(run, nprocs)
