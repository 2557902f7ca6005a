"""MPI start-up as hpccomm does it, or as a program that starts MPI itself does.

Modes:
  hpccomm     hpccomm starts MPI (thread level MULTIPLE); an async all_reduce completes.
  serialized  the program starts MPI with MPI_THREAD_SERIALIZED before hpccomm: hpccomm
              must say so once (rank 0) and still complete async work when waited on.
"""

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import sys

mode = sys.argv[1]
if mode == "serialized":
    import mpi4py

    mpi4py.rc.thread_level = "serialized"
    from mpi4py import MPI  # noqa: F401  (starts MPI, before hpccomm can)

import hpccomm  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from rankcheck import say  # noqa: E402

dist.init_process_group("hpccomm")
rank, size = dist.get_rank(), dist.get_world_size()
tensor = torch.ones(4) * (rank + 1)
dist.all_reduce(tensor, async_op=True).wait()
assert tensor.tolist() == [size * (size + 1) / 2] * 4, tensor
say(f"OK rank={rank} thread_level={hpccomm.identity().thread_level}")
dist.destroy_process_group()
