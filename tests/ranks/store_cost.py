"""Rank program of benchmarks/store_cost.py; usage: store_cost.py init | ops N | compute.

init: prints ``INIT rank=R s=T``: the wall time of ``init_process_group("hpccomm")`` and a first barrier
(MPI's own start excluded: it is the same whatever the store).
compute: rank 0 times a pure-Python loop (the best of 5) while the store has nothing to do; prints
``COMPUTE s=T`` (what the store's idle server thread takes from rank 0's Python).
ops N: rank 0 (in the store's own process) and the last rank (on another node) time N sets, N gets and N
adds each, one after the other; prints ``OPS rank=R op=OP us=T`` (microseconds an operation).
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import hpccomm
import torch.distributed as dist
from rankcheck import default_store

hpccomm.identity()  # MPI started: what follows is the rendezvous alone
started = time.perf_counter()
dist.init_process_group("hpccomm")
dist.barrier()
rank, size = dist.get_rank(), dist.get_world_size()
elapsed = time.perf_counter() - started
if sys.argv[1] == "init":
    print(f"INIT rank={rank} s={elapsed:.4f} store={type(default_store()).__name__}", flush=True)
elif sys.argv[1] == "compute":
    if rank == 0:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            total = 0
            for i in range(2_000_000):
                total += i & 7
            best = min(best, time.perf_counter() - t0)
        print(f"COMPUTE s={best:.4f} store={type(default_store()).__name__}", flush=True)
else:
    store, n = default_store(), int(sys.argv[2])
    for timed in (0, size - 1):
        dist.barrier()
        if rank != timed:
            # Wait as a rank does in a rendezvous: in a store operation (not in hpccomm's barrier, whose
            # polling would compete with rank 0's server thread for the GIL).
            store.wait([f"done{timed}"], timedelta(seconds=600))
            continue
        value = b"x" * 64
        for op, call in (("set", lambda i: store.set(f"k{rank}/{i}", value)),
                         ("get", lambda i: store.get(f"k{rank}/{i}")),
                         ("add", lambda i: store.add(f"n{rank}", 1))):
            t0 = time.perf_counter()
            for i in range(n):
                call(i)
            print(f"OPS rank={rank} op={op} us={(time.perf_counter() - t0) / n * 1e6:.1f} "
                  f"store={type(store).__name__}", flush=True)
        store.set(f"done{timed}", b"1")
dist.barrier()
dist.destroy_process_group()
