"""Debug mode (HPCCOMM_DEBUG=1): mismatched calls raise on every rank with a table.

Usage: debug_mode.py <dtype|shape|op|root> [...]
For each argument in turn, rank 1 calls with a different <what> than the others; each mismatch must
raise on every rank and post nothing, so the group stays usable for the next one.
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import sys

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from hpccomm.debug import CollectiveMismatchError
from rankcheck import say

dist.init_process_group("hpccomm")
rank, size = dist.get_rank(), dist.get_world_size()
odd = rank == 1
for what in sys.argv[1:]:
    try:
        if what == "dtype":
            dist.all_reduce(torch.ones(4, dtype=torch.float64 if odd else torch.float32))
        elif what == "shape":
            dist.all_reduce(torch.ones(5 if odd else 4))
        elif what == "op":
            dist.all_reduce(torch.ones(4), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)
        elif what == "root":
            dist.broadcast(torch.ones(4), src=1 if odd else 0)
        say(f"UNEXPECTED rank={rank} what={what}: mismatch not detected")
    except CollectiveMismatchError as exc:
        say(f"MISMATCH rank={rank} what={what} first-line={str(exc).splitlines()[0]}")
        say(str(exc))
    t = torch.ones(2)
    dist.all_reduce(t)  # nothing was posted: the group is still usable
    assert t[0].item() == size, (what, t)
say(f"OK rank={rank}")
dist.destroy_process_group()
