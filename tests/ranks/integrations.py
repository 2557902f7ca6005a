"""What runs on top of the backend: DDP, FSDP2, DeviceMesh, functional collectives.

DDP and FSDP2 are checked for parity with single-process training on the
concatenated batch: after a few steps every rank's parameters must equal the
reference model's.
"""

from __future__ import annotations

import sys

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from rankcheck import check, run_all

dist.init_process_group("hpccomm")
RANK, SIZE = dist.get_rank(), dist.get_world_size()
STEPS = 3


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same global batches on every rank; rank r trains on rows r::SIZE."""
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4 * SIZE, 8, generator=g), torch.randn(4 * SIZE, 4, generator=g)) for _ in range(STEPS)]


def reference_params() -> list[torch.Tensor]:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches():
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def assert_close(params: list[torch.Tensor], what: str) -> None:
    for got, want in zip(params, reference_params()):
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), f"{what}: max diff {(got - want).abs().max()}"


@check
def ddp_matches_single_process_training() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(make_model(), bucket_cap_mb=0.0001)  # tiny buckets: several async all_reduces per step
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches():
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[RANK::SIZE]), y[RANK::SIZE]).backward()
        opt.step()
    assert_close([p.detach() for p in model.parameters()], "DDP")


@check
def fsdp2_fully_shard_matches_single_process_training() -> None:
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches():
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[RANK::SIZE]), y[RANK::SIZE]).backward()
        opt.step()
    full = [p.full_tensor().detach() for p in model.parameters()]
    assert_close(full, "FSDP2")


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
