"""Rank program of benchmarks/scale_cost.py: what one rank of an N-rank job costs, counted where countable.

Prints one line a rank, ``COST rank=R key=value ...``:
- ``mpi_start_s``: ``hpccomm.identity()`` (MPI_Init, the node and control communicators, host discovery);
- ``init_s``: ``init_process_group("hpccomm")`` and a first barrier, after that;
- ``init_store_ops``: the store operations this rank asked for during init;
- ``group_store_ops``, ``group_s``: the same, and the time, of one ``dist.new_group`` of every rank;
- ``served``: (rank 0) the store operations its server answered, for the whole job, init and group;
- ``goodbye_receives``: the fail-fast receives posted on this rank (none: goodbyes are probed for);
- ``goodbye_sends``: the goodbyes of its own this rank will send at exit (over the tree, from
  ``HPCCOMM_GOODBYE_TREE_FROM`` ranks: its record to each tree neighbour and its counts to each partner; the
  batches of news it passes on are counted by benchmarks/scale_soak.py); ``goodbye_bytes``: the largest one, pickled;
- ``departed_us``: this thread's CPU time for one fail-fast check (``failure.abandoned`` for an all-reduce on the
  group of every rank, as a waiting operation makes it every few polls), the median of 5 batches of 200;
- ``probe_us``: the same for one raw ``MPI_Iprobe`` from any source (mpi4py), the MPI progress any check pays;
- ``rss_mib``: the resident memory this rank added from before MPI started to after the group;
- ``fds``, ``threads``: the file descriptors this process holds (sockets included) and its threads, after the group;
- in fault-tolerant mode (``hpccomm-run --ft``), for the group: ``stop_receives``, the receives its stop points
  keep posted (:mod:`hpccomm.fault_tolerance.stop_points`), and ``stop_look_us``, this thread's CPU time for one
  look for stops (what a waiting operation does every 10 ms), the median of 5 batches of 200.

Usage: scale_cost.py [hpccomm | gloo PORT]. With ``gloo``, the same job (rank and size from MPI) makes torch's
Gloo group instead, through a TCPStore on 127.0.0.1:PORT served by rank 0 (what torch's own rendezvous does),
and prints the times, memory, descriptors and threads (hpccomm's counts do not apply).
Times are wall seconds on an oversubscribed machine (the slowest rank is the job's); counts and CPU time do not
depend on the load.
"""

from __future__ import annotations

import os
import pickle
import statistics
import sys
import time

import hpccomm
import hpccomm.failure as failure
import hpccomm.ledger as ledger
import hpccomm.store as store
import torch
import torch.distributed as dist


def _threads() -> int:
    """This process's threads, the native ones (MPI's, torch's, Gloo's) included."""
    return len(os.listdir("/proc/self/task"))


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


asked = [0]
served = [0]
call, serve = store._Channel.call, store._Server._serve


def counted_call(self, *args, **kwargs):
    asked[0] += 1
    return call(self, *args, **kwargs)


def counted_serve(self, *args, **kwargs):
    served[0] += 1
    return serve(self, *args, **kwargs)


store._Channel.call = counted_call
store._Server._serve = counted_serve

before = rss_mib()
t0 = time.perf_counter()
hpccomm.identity()
t1 = time.perf_counter()
backend = sys.argv[1] if len(sys.argv) > 1 else "hpccomm"
if backend == "gloo":
    me = hpccomm.identity()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=me.rank,
                            world_size=me.world_size)
else:
    dist.init_process_group("hpccomm")
dist.barrier()
t2 = time.perf_counter()
rank, size = dist.get_rank(), dist.get_world_size()
init_ops = asked[0]
group = dist.new_group(list(range(size)))
dist.barrier(group=group)
t3 = time.perf_counter()
group_ops = asked[0] - init_ops
receives = 0  # nothing is posted for goodbyes: each check probes for one from any rank
direct, record = failure.goodbye() if failure._control is not None else ([], None)
# over the tree: its record to each neighbour, its counts to each partner
sends = len(direct) + (len(failure._news.neighbours) if record is not None else 0)
largest = max([0] + [len(pickle.dumps(message)) for message in [record, *(message for _, message in direct)] if message])
book = ledger._ledgers[-1] if ledger._ledgers else None  # the group just made, of every rank (none with Gloo)


def cpu_us(call) -> float:
    """This thread's CPU time for one ``call()``, in us: the median of 5 batches of 200."""
    batches = []
    for _ in range(5):
        c0 = time.thread_time()
        for _ in range(200):
            call()
        batches.append((time.thread_time() - c0) / 200 * 1e6)
    return statistics.median(batches)


departed_us = 0.0 if book is None else cpu_us(lambda: failure.abandoned(book, "all_reduce", -1, book.collectives))
probe_us = 0.0
if failure._control is not None:
    any_source = failure.mpi().ANY_SOURCE
    probe_us = cpu_us(lambda: failure._control.Iprobe(any_source, 9999))  # a tag nothing uses
recovery = getattr(group._get_backend(torch.device("cpu")), "_recovery", None) if backend != "gloo" else None
dist.barrier()
grown = rss_mib() - before
if backend == "gloo":
    receives = sends = -1  # hpccomm's fail-fast does not serve a Gloo group
fields = {
    "mpi_start_s": f"{t1 - t0:.3f}", "init_s": f"{t2 - t1:.3f}", "init_store_ops": init_ops,
    "group_store_ops": group_ops, "group_s": f"{t3 - t2:.3f}", "goodbye_receives": receives,
    "goodbye_sends": sends, "goodbye_bytes": largest, "departed_us": f"{departed_us:.2f}",
    "probe_us": f"{probe_us:.2f}", "rss_mib": f"{grown:.1f}",
    "fds": len(os.listdir("/proc/self/fd")), "threads": _threads(),
}
if recovery is not None:
    fields["stop_receives"] = len(getattr(recovery._stops, "_inbox", ()))  # posted per peer before 2026-11-29
    fields["stop_look_us"] = f"{cpu_us(recovery._stops.poll):.2f}"
if rank == 0:
    fields["served"] = served[0]
print(f"COST rank={rank} " + " ".join(f"{key}={value}" for key, value in fields.items()), flush=True)
dist.destroy_process_group()
