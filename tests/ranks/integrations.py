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
import training
from rankcheck import check, run_all
from training import full_params, fully_sharded, make_model

dist.init_process_group("hpccomm")
RANK, SIZE = dist.get_rank(), dist.get_world_size()


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return training.batches(SIZE)


def assert_close(params: list[torch.Tensor], what: str) -> None:
    training.assert_close(params, SIZE, what)


def train_ddp(model: torch.nn.Module) -> list[torch.Tensor]:
    """Train a DDP-wrapped copy of make_model() on this rank's rows; return its parameters."""
    training.train(model, RANK, SIZE)
    return [p.detach().clone() for p in model.parameters()]


@check
def ddp_matches_single_process_training() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(make_model(), bucket_cap_mb=0.0001)  # tiny buckets: several async all_reduces per step
    assert_close(train_ddp(model), "DDP")


@check
def compiled_ddp_matches_single_process_training() -> None:
    # torch.compile sees hpccomm's methods when DDP's C++ calls them (buffer broadcasts):
    # they must run, not be traced. The default DDP optimizer splits the graph per bucket.
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch._dynamo.reset()
    model = DDP(make_model())
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=training.LR)
    for x, y in batches():
        opt.zero_grad()
        torch.nn.functional.mse_loss(compiled(x[RANK::SIZE]), y[RANK::SIZE]).backward()
        opt.step()
    assert_close([p.detach() for p in model.parameters()], "compiled DDP")


@check
def ddp_powersgd_hook_matches_gloo() -> None:
    # PowerSGD's future callbacks post all-reduces and wait on them.
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    from torch.nn.parallel import DistributedDataParallel as DDP

    results = []
    for group in (dist.group.WORLD, dist.new_group(backend="gloo")):
        model = DDP(make_model(), process_group=group)
        state = powerSGD.PowerSGDState(process_group=group, matrix_approximation_rank=1, start_powerSGD_iter=2)
        model.register_comm_hook(state, powerSGD.powerSGD_hook)
        results.append(train_ddp(model) + train_ddp(model))  # 6 steps: PowerSGD from the third
    for got, want in zip(*results):
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), f"PowerSGD: hpccomm differs from gloo by {(got - want).abs().max()}"


@check
def ddp_fp16_compression_hook_matches_gloo() -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    results = []
    for group in (dist.group.WORLD, dist.new_group(backend="gloo")):
        model = DDP(make_model(), process_group=group)
        model.register_comm_hook(group, default_hooks.fp16_compress_hook)
        results.append(train_ddp(model))
    # Sums of float16 gradients in another order round differently: compare within float16's precision.
    for got, want in zip(*results):
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-3), f"fp16 hook: hpccomm differs from gloo by {(got - want).abs().max()}"


@check
def zero_redundancy_optimizer_matches_single_process_training() -> None:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(make_model())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=training.LR)
    for x, y in batches():
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[RANK::SIZE]), y[RANK::SIZE]).backward()
        opt.step()
    assert_close([p.detach() for p in model.parameters()], "ZeroRedundancyOptimizer")


@check
def fsdp2_fully_shard_matches_single_process_training() -> None:
    model = fully_sharded()
    training.train(model, RANK, SIZE)
    assert_close(full_params(model), "FSDP2")


@check
def hsdp_on_hpccomms_node_mesh_matches_single_process_training() -> None:
    mesh = hpccomm.init_device_mesh("cpu")  # one node: (1, SIZE)
    assert tuple(mesh.mesh.shape) == (1, SIZE) and mesh.mesh_dim_names == ("node", "local")
    model = fully_sharded(mesh)
    training.train(model, RANK, SIZE)
    assert_close(full_params(model), "HSDP")


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
