"""A tiny training problem shared by the integration checks, with its single-process answer.

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
