"""Lightning's Trainer on hpccomm: DDPStrategy(process_group_backend="hpccomm") under an MPI launcher.

Lightning finds the ranks through its MPIEnvironment (mpi4py); the trained
parameters must equal single-process training's. Usage: lightning_ddp.py
"""

from __future__ import annotations

import hpccomm  # noqa: F401
import lightning as L
import torch
import torch.distributed as dist
import training
from lightning.pytorch.strategies import DDPStrategy
from mpi4py import MPI
from rankcheck import say

SIZE = MPI.COMM_WORLD.Get_size()


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = training.make_model()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=training.LR)


module = Regression()
# Lightning's own sampler shuffles the training data; this one hands out rows in order.
data = training.dataset(SIZE)
sampler = torch.utils.data.DistributedSampler(data, num_replicas=SIZE, rank=MPI.COMM_WORLD.Get_rank(), shuffle=False)
loader = torch.utils.data.DataLoader(data, batch_size=training.ROWS_PER_RANK, sampler=sampler)
trainer = L.Trainer(
    strategy=DDPStrategy(process_group_backend="hpccomm"),
    accelerator="cpu",
    devices=SIZE,
    num_nodes=1,
    max_epochs=1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    use_distributed_sampler=False,
)
trainer.fit(module, loader)
assert type(trainer.strategy.cluster_environment).__name__ == "MPIEnvironment", trainer.strategy.cluster_environment
assert dist.get_backend() == "hpccomm" and dist.get_world_size() == SIZE
training.assert_close([p.detach() for p in module.net.parameters()], SIZE, "Lightning DDP")
say(f"OK rank={dist.get_rank()}")
