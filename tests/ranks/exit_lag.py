"""Rank program of benchmarks/exit_lag.py: how soon the others learn that a rank left without its part.

Usage: exit_lag.py [MODE]. Rank 1 leaves (``sys.exit(3)``) as the others enter an all-reduce (MODE
``collective``) or a receive from it (``p2p``); each other rank prints ``LAG rank=R s=S``, the seconds from
rank 1's exit to its own ``PeerExitedError`` (wall clocks of one machine).
"""

from __future__ import annotations

import sys
import time

import hpccomm
import torch
import torch.distributed as dist

mode = sys.argv[1] if len(sys.argv) > 1 else "collective"
dist.init_process_group("hpccomm")
rank = dist.get_rank()
stamp = torch.zeros(1, dtype=torch.float64)
dist.all_reduce(torch.ones(1))
if rank == 1:
    stamp[0] = time.time()
dist.broadcast(stamp, src=1)  # everyone knows when rank 1 leaves: right after this
if rank == 1:
    sys.exit(3)
try:
    if mode == "p2p" and rank == 0:
        dist.recv(torch.zeros(1), src=1)
    else:
        dist.all_reduce(torch.ones(1))
    print(f"UNEXPECTED rank={rank}: completed without rank 1", flush=True)
except hpccomm.PeerExitedError:
    print(f"LAG rank={rank} s={time.time() - float(stamp[0]):.4f}", flush=True)
