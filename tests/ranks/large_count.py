"""Element counts past MPI's 32-bit count limit (2**31 - 1): all_reduce and broadcast."""

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from rankcheck import say

dist.init_process_group("hpccomm")
rank, size = dist.get_rank(), dist.get_world_size()
n = 2**31 + 8
t = torch.ones(n, dtype=torch.uint8)
t[-1] = rank + 1
dist.all_reduce(t)
assert t[0].item() == size and t[2**31 - 1].item() == size and t[2**31 + 3].item() == size
assert t[-1].item() == sum(r + 1 for r in range(size))
t.fill_(rank)
t[-2] = 7 if rank == 0 else 0
dist.broadcast(t, src=0)
assert t[-2].item() == 7 and t[2**31].item() == 0 and t[5].item() == 0
say(f"OK rank={rank} numel={n}")
dist.destroy_process_group()
