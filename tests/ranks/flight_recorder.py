"""A desync for torch's flight recorder: rank 1 skips an all-reduce that rank 0 waits in until its timeout.

Usage: flight_recorder.py <waits|busy>

Rank 0 times out in its fifth operation, an all-reduce rank 1 never calls,
and ends the job (uncaught CommTimeoutError). Rank 1 meanwhile either waits in
a receive on a group with a longer timeout (``waits``: it writes its record
when rank 0 asks) or computes outside hpccomm (``busy``: it cannot answer).
Run with ``TORCH_FR_DUMP_TEMP_FILE`` set; tests/test_flight_recorder.py reads
the records.
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import sys
import time
from datetime import timedelta

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from rankcheck import say

mode = sys.argv[1]
dist.init_process_group("hpccomm", timeout=timedelta(seconds=2))
rank = dist.get_rank()
patient = dist.new_group([0, 1], timeout=timedelta(seconds=120))
tensor = torch.ones(8)
for _ in range(3):
    dist.all_reduce(tensor)
dist.all_gather_into_tensor(torch.empty(16), torch.ones(8))
say(f"READY rank={rank} t={time.time()}")
if rank == 0:
    dist.all_reduce(tensor)  # the fifth operation: rank 1 never calls it
elif mode == "waits":
    dist.recv(tensor, src=0, group=patient)  # what rank 0 never sends
else:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # busy in its own code, outside hpccomm
        torch.mm(torch.ones(64, 64), torch.ones(64, 64))
say(f"UNEXPECTED rank={rank}: went on")
