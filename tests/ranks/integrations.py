"""What runs on top of the backend: DDP, FSDP2, DeviceMesh, functional collectives.

DDP, FSDP2 and HSDP (on hpccomm's node mesh) are checked for parity with single-process training on the
concatenated batch: after a few steps every rank's parameters must equal the
reference model's.
"""

from __future__ import annotations

import sys

import hpccomm
import torch
import torch.distributed as dist
from rankcheck import check, run_all
from training import assert_close, full_params, fully_sharded, make_model, train

dist.init_process_group("hpccomm")
RANK, SIZE = dist.get_rank(), dist.get_world_size()


@check
def ddp_matches_single_process_training() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(make_model(), bucket_cap_mb=0.0001)  # tiny buckets: several async all_reduces per step
    train(model, RANK, SIZE)
    assert_close([p.detach() for p in model.parameters()], SIZE, "DDP")


@check
def fsdp2_fully_shard_matches_single_process_training() -> None:
    model = fully_sharded()
    train(model, RANK, SIZE)
    assert_close(full_params(model), SIZE, "FSDP2")


@check
def hsdp_on_hpccomms_node_mesh_matches_single_process_training() -> None:
    mesh = hpccomm.init_device_mesh("cpu")  # one node: (1, SIZE)
    assert tuple(mesh.mesh.shape) == (1, SIZE) and mesh.mesh_dim_names == ("node", "local")
    model = fully_sharded(mesh)
    train(model, RANK, SIZE)
    assert_close(full_params(model), SIZE, "HSDP")


@check
def device_mesh_2d_groups() -> None:
    from torch.distributed.device_mesh import init_device_mesh

    if SIZE % 2:
        mesh = init_device_mesh("cpu", (SIZE,), mesh_dim_names=("dp",))
        t = torch.ones(1)
        dist.all_reduce(t, group=mesh.get_group("dp"))
        assert t.item() == SIZE
        return
    mesh = init_device_mesh("cpu", (SIZE // 2, 2), mesh_dim_names=("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    t = torch.tensor([float(RANK)])
    dist.all_reduce(t, group=tp)
    pair = RANK - RANK % 2
    assert t.item() == pair + pair + 1, f"tp all_reduce gave {t.item()}"
    t = torch.tensor([float(RANK)])
    dist.all_reduce(t, group=dp)
    assert t.item() == sum(r for r in range(SIZE) if r % 2 == RANK % 2)


@check
def functional_all_reduce() -> None:
    import torch.distributed._functional_collectives as funcol

    t = torch.full((3,), float(RANK + 1))
    out = funcol.all_reduce(t, "sum", dist.group.WORLD)
    assert torch.equal(out, torch.full((3,), float(SIZE * (SIZE + 1) // 2)))


@check
def functional_all_gather_and_reduce_scatter() -> None:
    import torch.distributed._functional_collectives as funcol

    t = torch.full((2,), float(RANK))
    out = funcol.all_gather_tensor(t, 0, dist.group.WORLD)
    assert torch.equal(out, torch.cat([torch.full((2,), float(r)) for r in range(SIZE)])), out
    big = torch.arange(2.0 * SIZE)
    out = funcol.reduce_scatter_tensor(big, "sum", 0, dist.group.WORLD)
    assert torch.equal(out, torch.arange(2.0 * SIZE)[2 * RANK : 2 * RANK + 2] * SIZE), out


@check
def dtensor_redistribute() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (SIZE,))
    full = torch.arange(4.0 * SIZE).view(2 * SIZE, 2)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    assert torch.equal(sharded.redistribute(mesh, [Replicate()]).to_local(), full)


run_all(RANK, sys.argv[1] if len(sys.argv) > 1 else None)
dist.destroy_process_group()
