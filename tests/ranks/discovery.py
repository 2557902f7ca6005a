"""init_process_group("hpccomm") in a program that never imports hpccomm.

torch's ``torch.backends`` entry point (run by ``import torch``) registers
hpccomm in processes an MPI launcher started, so the rendezvous is MPI's:
no RANK, MASTER_ADDR or store (tests/test_torch_api.py clears them).
"""

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import sys

import torch
import torch.distributed as dist

assert "hpccomm" not in sys.modules or "hpccomm_autoload" in sys.modules
dist.init_process_group("hpccomm")
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
assert t.tolist() == [size * (size + 1) / 2] * 4, t
assert dist.get_backend() == "hpccomm"
dist.destroy_process_group()
print(f"OK rank={rank}", flush=True)
