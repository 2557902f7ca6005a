"""How a job ends: usage: lifecycle.py <mode>.

Modes:
    no-destroy: use the group, then exit without destroy_process_group.
    pending-async: exit with async work posted but never waited on.
    destroy: the orderly way.
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import sys

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from rankcheck import say

mode = sys.argv[1]
dist.init_process_group("hpccomm")
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.ones(1 << 12)
dist.all_reduce(t)
assert t[0].item() == size
if mode == "pending-async":
    works = [dist.all_reduce(torch.ones(1 << 14), async_op=True) for _ in range(8)]
elif mode == "destroy":
    dist.destroy_process_group()
say(f"EXITING rank={rank} mode={mode}")
