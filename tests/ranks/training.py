"""A tiny training job and its single-process reference, for parity checks of DDP, FSDP2 and HSDP.

Every rank sees the same global batches and trains on rows ``rank::size`` of
each; after :data:`STEPS` SGD steps its parameters must equal those of one
process trained on the whole batches.
"""

from __future__ import annotations

import torch

STEPS = 3


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batches(size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same global batches on every rank of ``size``; rank r trains on rows r::size."""
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4 * size, 8, generator=g), torch.randn(4 * size, 4, generator=g)) for _ in range(STEPS)]


def train(model: torch.nn.Module, rank: int, size: int) -> None:
    """:data:`STEPS` SGD steps of ``model`` on rows ``rank::size`` of each batch (all rows: rank 0 of 1)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches(size):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rank::size]), y[rank::size]).backward()
        opt.step()


def assert_close(params: list[torch.Tensor], size: int, what: str) -> None:
    """Fail unless ``params`` equal those of one process trained on the whole batches of ``size`` ranks."""
    reference = make_model()
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in batches(size):
        opt.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        opt.step()
    for got, want in zip(params, reference.parameters()):
        assert torch.allclose(got, want.detach(), atol=1e-5, rtol=1e-4), f"{what}: max diff {(got - want).abs().max()}"


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
