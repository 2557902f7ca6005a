"""Print this rank's CPU affinity: hpccomm-run must not pin a rank to one core."""

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import os

from mpi4py import MPI
from rankcheck import say

allowed = len(os.sched_getaffinity(0))
say(f"AFFINITY rank={MPI.COMM_WORLD.rank} cpus={allowed} of={os.cpu_count()}")
