"""Fault-tolerant mode: ranks die, the survivors agree on which, shrink and go on.

Usage: fault_tolerance.py <when> <victims>, under ``hpccomm-run --ft`` (or
with HPCCOMM_FT=1 and no ULFM, where init must refuse):
    between: the victims SIGKILL themselves between two all_reduces.
    mid-async: the victims post an async all_reduce of 64 MiB, then SIGKILL
        themselves at once, their share unsent; the survivors' matching
        all_reduce needs them.
    exit: as between, but the survivors exit once they have caught
        PeerFailure, without shrinking: the job must still end cleanly.
    during-agreement: the first victim dies between two all_reduces; the
        second never calls the all_reduce and dies while the others are
        agreeing on the failure: they must agree on both.
    relay-dies: over the tree of stops (HPCCOMM_GOODBYE_TREE_FROM=2, 6
        ranks, victims 1,2): rank 2 dies between two all_reduces; rank 1,
        inside the tree (rank 5's only neighbour), takes part in the next one,
        and so does rank 4, 1 s late: its stop is the last, and rank 0 has
        every other and is in the shrink when it passes rank 4's on. Rank 1
        dies as rank 4's stop reaches it, before passing it on: rank 5 must
        get it from rank 0's relaying thread, walking round rank 1.
<victims>: comma-separated ranks (e.g. "1" or "1,2").

Each survivor checks: its next all_reduce raises hpccomm.PeerFailure naming
exactly the victims; dist.shrink_group makes a default group of the
survivors, renumbered; collectives on it give right values; DDP rebuilt on it
trains. Prints "FAILED rank=R took=S at=T" and "OK rank=R" (original rank);
each victim prints "DIED rank=R at=T" just before it kills itself (T:
time.time(), one clock for the fake nodes too), so that the test measures how
long after the death each survivor had its PeerFailure.
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import os
import signal
import sys
import time

import hpccomm
import torch
import torch.distributed as dist

when, victims = sys.argv[1], [int(v) for v in sys.argv[2].split(",")]
dist.init_process_group("hpccomm")
RANK, SIZE = dist.get_rank(), dist.get_world_size()
relay = when == "relay-dies" and RANK == victims[0]
if relay:
    from hpccomm.fault_tolerance.stop_points import StopPoints

    take = StopPoints._take

    def dies_as_a_stop_arrives(self, news, source):
        news = list(news)
        if source is not None and any(rank == 4 for rank, _ in news):
            print(f"DIED rank={RANK} at={time.time():.6f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        take(self, news, source)

    StopPoints._take = dies_as_a_stop_arrives
t = torch.ones(4)
dist.all_reduce(t)
assert t.tolist() == [SIZE] * 4, t

# Made before the barrier: beside a CPU-bound process on 2 cores, a victim once took 9-22 s from the barrier
# to its post (a 0.1 s sleep and filling 64 MiB), and died that much later than the survivors' all_reduce.
big = torch.ones(1 << 24) if when == "mid-async" else None  # 64 MiB a rank: 4 GiB at 64 ranks, only where used
dist.barrier()

if RANK in victims and not relay:
    # A rank may leave the barrier before the others have seen it complete: let them.
    time.sleep(0.1)
    if when == "mid-async":
        dist.all_reduce(big, async_op=True)
    if when == "during-agreement" and RANK == victims[1]:
        time.sleep(0.5)  # the others are past their failed all_reduce, inside the agreement
    print(f"DIED rank={RANK} at={time.time():.6f}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

protected = dist.group.WORLD._get_backend(torch.device("cpu"))._transports["cpu"]
transport = protected.inner
taken_before = sum(getattr(transport, "taken", {}).values())
start = time.monotonic()
try:
    if when == "mid-async":
        dist.all_reduce(big, async_op=True).wait()
    else:
        time.sleep(0.4)  # the victims die first
        if when == "relay-dies" and RANK == 4:
            time.sleep(1.0)  # the last to stop
        dist.all_reduce(torch.ones(4))
    print(f"UNEXPECTED rank={RANK}: the all_reduce completed without the dead ranks", flush=True)
    sys.exit(1)
except hpccomm.PeerFailure as failure:
    took, at = time.monotonic() - start, time.time()
    # Which path the failed collective took: flat MPI, the node's shared memory, or hierarchical.
    aware = sum(getattr(transport, "taken", {}).values()) > taken_before
    print(f"PATH rank={RANK} {transport.path if aware else 'flat'}", flush=True)
    assert failure.failed_ranks == victims, (failure.failed_ranks, victims)
    print(f"FAILED rank={RANK} took={took:.3f} at={at:.6f} failed={failure.failed_ranks}", flush=True)
    stops = protected.recovery._stops
    print(f"STOPS rank={RANK} tree={int(stops._book is not None)} sent={stops.sent} received={stops.received} "
          f"relayed={stops.relayed}",
          flush=True)
    failed = failure.failed_ranks
if when == "exit":
    print(f"OK rank={RANK} exiting without a shrink", flush=True)
    sys.exit(0)

# Every later operation of the failed group fails the same way, at once.
try:
    dist.broadcast(torch.ones(2), src=0)
    raise AssertionError("a broadcast on the failed group completed")
except hpccomm.PeerFailure as again:
    assert again.failed_ranks == failed, again.failed_ranks

start = time.monotonic()
dist.shrink_group(failed)
shrink_s = time.monotonic() - start
survivors = [r for r in range(SIZE) if r not in victims]
new_rank, new_size = dist.get_rank(), dist.get_world_size()
assert new_size == len(survivors) and new_rank == survivors.index(RANK), (new_rank, new_size)

x = torch.full((3,), float(new_rank + 1))
dist.all_reduce(x)
assert x.tolist() == [new_size * (new_size + 1) / 2] * 3, x
# hpccomm's world follows torch's renumbering: identity, the torchrun variables, topology, new groups.
ident = hpccomm.identity()
assert (ident.rank, ident.world_size) == (new_rank, new_size), ident
assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == (str(new_rank), str(new_size)), os.environ["RANK"]
assert hpccomm.topology().size == new_size and hpccomm.topology().rank == new_rank, hpccomm.topology()
pair = dist.new_group([0, new_size - 1])
y = torch.tensor([float(RANK)])
if new_rank in (0, new_size - 1):
    dist.all_reduce(y, group=pair)
    assert y.item() == survivors[0] + survivors[-1], y
mesh = dist.init_device_mesh("cpu", (new_size,))
z = torch.ones(2)
dist.all_reduce(z, group=mesh.get_group())
assert z.tolist() == [float(new_size)] * 2, z
b = torch.full((2,), float(new_rank))
dist.broadcast(b, src=new_size - 1)
assert b.tolist() == [new_size - 1.0] * 2, b
gathered = [torch.zeros(1) for _ in range(new_size)]
dist.all_gather(gathered, torch.tensor([float(RANK)]))
assert [int(g) for g in gathered] == survivors, gathered

# DDP rebuilt on the survivors' group: one step, parameters equal everywhere afterwards.
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
torch.manual_seed(100 + new_rank)
loss = model(torch.randn(4, 8)).square().sum()
loss.backward()
torch.optim.SGD(model.parameters(), lr=0.1).step()
weights = model.module.weight.detach().clone()
everyone = [torch.zeros_like(weights) for _ in range(new_size)]
dist.all_gather(everyone, weights)
assert all(torch.equal(w, weights) for w in everyone), "replicas differ after a DDP step on the shrunk group"

print(f"OK rank={RANK} shrink={shrink_s:.3f}", flush=True)
dist.destroy_process_group()
