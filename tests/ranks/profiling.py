"""A short DDP run and a few other operations under torch.profiler, each rank writing its trace.

Usage: profiling.py <trace dir>

Writes ``<dir>/shapes-<rank>.json`` (``record_shapes=True``: spans with their
fields) and ``<dir>/plain-<rank>.json`` (no shapes: spans by name only), and
prints ``BEGIN rank=R outside=N inside=M``: how often hpccomm opened a span
while no profiler recorded (must be 0) and while one did. tests/test_profiling.py
reads the traces.
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import sys
import time
from pathlib import Path

import hpccomm  # noqa: F401
import hpccomm.profiling
import torch
import torch.distributed as dist
from rankcheck import say
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function

out = Path(sys.argv[1])
dist.init_process_group("hpccomm")
rank, size = dist.get_rank(), dist.get_world_size()

opened = {"inside": 0, "outside": 0}
begin = hpccomm.profiling.begin
where = "outside"


def counting_begin(*args, **kwargs):
    opened[where] += 1
    return begin(*args, **kwargs)


hpccomm.profiling.begin = counting_begin


def work(steps: int) -> None:
    """DDP's broadcast at construction and an all-reduce per backward, then one of a few other kinds."""
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        optimizer.zero_grad()
        model(torch.randn(6, 16) + rank + step).sum().backward()
        optimizer.step()
    gathered = torch.empty(3 * size)
    pending = dist.all_gather_into_tensor(gathered, torch.ones(3), async_op=True)
    with record_function("waited"):  # the operation's span ends by the time wait() returns
        pending.wait()
    pending = dist.all_reduce(torch.ones(3), async_op=True)
    with record_function("idle"):  # meanwhile the progress thread completes it, and its span ends there
        time.sleep(0.2)
    pending.wait()
    sends = [rank + 1 + peer for peer in range(size)]  # rank r sends r + 1 + p elements to p
    receives = [peer + 1 + rank for peer in range(size)]
    output = torch.empty(sum(receives))
    dist.all_to_all_single(output, torch.ones(sum(sends)), receives, sends)
    dist.broadcast(torch.ones(5), src=size - 1)
    if rank == 0:
        dist.send(torch.ones(2), dst=1)
    elif rank == 1:
        dist.recv(torch.empty(2), src=0)


work(1)  # no profiler: nothing opened
for name, shapes in (("shapes", True), ("plain", False)):
    where = "inside"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as recorded:
        work(3)
    where = "outside"
    recorded.export_chrome_trace(str(out / f"{name}-{rank}.json"))
work(1)
say(f"BEGIN rank={rank} outside={opened['outside']} inside={opened['inside']}")
say(f"OK rank={rank}")
dist.destroy_process_group()
