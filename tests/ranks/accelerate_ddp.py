"""HF accelerate on hpccomm: create the group first, then Accelerator(cpu=True).

accelerate picks its CPU backend by name (gloo or mpi) and refuses
"hpccomm"; with the default group already created it keeps it, so DDP and
accelerate's own collectives run on hpccomm (its state still reads "gloo").
Trained parameters must equal single-process training's. Usage: accelerate_ddp.py
"""

from __future__ import annotations

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
import training
from rankcheck import say

dist.init_process_group("hpccomm")
RANK, SIZE = dist.get_rank(), dist.get_world_size()

from accelerate import Accelerator  # noqa: E402  (after the group exists)

accelerator = Accelerator(cpu=True)
assert accelerator.num_processes == SIZE and accelerator.process_index == RANK
model = training.make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=training.LR)
loader = torch.utils.data.DataLoader(training.dataset(SIZE), batch_size=training.ROWS_PER_RANK)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
if SIZE > 1:
    assert dist.get_backend(model.process_group) == "hpccomm", model.process_group
for x, y in loader:
    optimizer.zero_grad()
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()
training.assert_close([p.detach() for p in accelerator.unwrap_model(model).parameters()], SIZE, "accelerate DDP")
gathered = accelerator.gather(torch.tensor([RANK]))
assert gathered.tolist() == list(range(SIZE)), gathered
total = accelerator.reduce(torch.tensor([float(RANK)]), reduction="sum")
assert total.item() == sum(range(SIZE)), total
say(f"OK rank={RANK}")
