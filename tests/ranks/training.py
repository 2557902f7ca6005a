"""A tiny training problem shared by the integration checks (DDP, FSDP2, HSDP, frameworks), with its single-process answer.

Every framework check trains make_model() for STEPS steps of SGD on the same
global batches, each rank on its share of each batch (rows rank::size, which
is also what torch's DistributedSampler hands out from dataset()), and
compares the parameters with reference_params(): one process training on the
whole batches.
"""

from __future__ import annotations

import torch

STEPS = 3
ROWS_PER_RANK = 4
LR = 0.1


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batches(size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same global batches on every rank; rank r trains on rows r::size."""
    g = torch.Generator().manual_seed(1)
    n = ROWS_PER_RANK * size
    return [(torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g)) for _ in range(STEPS)]


def dataset(size: int) -> torch.utils.data.TensorDataset:
    """batches() end to end, for frameworks that take a dataset (batch size ROWS_PER_RANK per rank)."""
    xs, ys = zip(*batches(size))
    return torch.utils.data.TensorDataset(torch.cat(xs), torch.cat(ys))


def train(model: torch.nn.Module, rank: int, size: int) -> None:
    """:data:`STEPS` SGD steps of ``model`` on rows ``rank::size`` of each batch (all rows: rank 0 of 1)."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in batches(size):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rank::size]), y[rank::size]).backward()
        opt.step()


def reference_params(size: int) -> list[torch.Tensor]:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in batches(size):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def assert_close(params: list[torch.Tensor], size: int, what: str) -> None:
    """Fail unless ``params`` equal single-process training's (to float rounding)."""
    want_all = reference_params(size)
    assert len(params) == len(want_all), f"{what}: {len(params)} parameters, expected {len(want_all)}"
    for got, want in zip(params, want_all):
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), f"{what}: max diff {(got - want).abs().max()}"


def fully_sharded(mesh: object = None) -> torch.nn.Module:
    """:func:`make_model` with ``fully_shard`` on each Linear and on the whole (over ``mesh``: 2-D is HSDP)."""
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_params(model: torch.nn.Module) -> list[torch.Tensor]:
    """A sharded (FSDP2/HSDP) model's whole parameters: its DTensors gathered."""
    return [p.full_tensor().detach() for p in model.parameters()]
