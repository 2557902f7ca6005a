"""Run ``python -m hpccomm bench`` in a rank; ``--corrupt-all-reduce`` first breaks hpccomm's all_reduce.

The corruption is for tests/test_bench.py only: on rank 1 every blocking
all_reduce through hpccomm gets its first element changed after it
completes, as a backend bug would, so the bench's #wrong must catch it while
Gloo and raw mpi4py, on the same tensors, stay right.
"""

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import sys

from hpccomm.cli import bench
from hpccomm.front import Front


def corrupt_all_reduce() -> None:
    real = Front.allreduce

    def broken(self, tensors, opts=None):
        work = real(self, tensors, opts)
        if self.rank() == 1:
            work.wait()
            tensors[0].view(-1)[0] += 1
        return work

    Front.allreduce = broken


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--corrupt-all-reduce"]:
        corrupt_all_reduce()
        args = args[1:]
    bench.main(args)
