"""Per-call cost at 2 ranks: hpccomm against raw mpi4py and torch's own floor, in one job.

Usage: ``hpccomm-run -n 2 python benchmarks/per_call.py [--iters N] [--rounds R] [--profiler] [--pending K,...]``

Back to back, 4-byte float32 messages: the all_reduce time, and send/recv's
one-way time (half a ping-pong), each the median of rounds of N calls; for
hpccomm through ``torch.distributed``, for raw mpi4py on hpccomm's own MPI,
and torch's floor: ``dist.all_reduce`` on a Python backend that does nothing
(its own shell for the installed torch, as hpccomm's), so whatever torch
itself costs per call is measured in the same minute. The figure of merit
is (hpccomm - raw mpi4py) / floor: how many of torch's own per-call costs
hpccomm adds on top of MPI. The do-nothing backend's send/recv one-way time
(``dist.send`` then ``dist.recv``, nothing sent) shows how much of a one-way
trip is torch's own, in floors.

``--profiler`` adds the all_reduce of hpccomm and of the floor again inside a
``torch.profiler`` session on the CPU, without and with ``record_shapes``:
what recording a trace costs per call, hpccomm's spans (hpccomm/profiling.py)
beside torch's own events.

``--pending K,...`` adds hpccomm's send/recv one-way time again with K
receives posted beforehand that nobody waits on (their sends come after the
round): what asynchronous work left in flight costs a rank's blocking calls,
which move it between their own polls while the progress thread stays off
(``HPCCOMM_PROGRESS_THREAD=0``: no thread at all); docs/measurements.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import contextlib

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile
from hpccomm import world
from hpccomm.registration import BACKEND_SHAPE
from hpccomm.work import COMPLETED

#: The tags of ``--pending``'s receives, clear of the ping-pong's (tag 0).
PENDING_TAG = 1000


def nothing_group(rank: int, size: int) -> Any:
    """A group of a backend whose every all_reduce, send and recv returns a completed Work at once."""
    if BACKEND_SHAPE:
        from torch._C._distributed_c10d import Backend as Base
    else:
        Base = dist.ProcessGroup

    class Nothing(Base):  # type: ignore[misc, valid-type]
        def allreduce(self, tensors: Any, opts: Any = None) -> dist.Work:
            return COMPLETED

        def send(self, tensors: Any, dst: int, tag: int) -> dist.Work:
            return COMPLETED

        def recv(self, tensors: Any, src: int, tag: int) -> dist.Work:
            return COMPLETED

        def getBackendName(self) -> str:
            return "nothing"

    # torch >= 2.14 reads these off a Python Backend (and recurses where one is missing).
    for flag in ("supports_splitting", "supports_coalescing", "supports_shrinking", "_supports_time_estimate",
                 "supports_abort_hooks", "supports_reconfigure", "supports_window"):
        setattr(Nothing, flag, property(lambda self: False))

    dist.Backend.register_backend("nothing", lambda opts, _: Nothing(opts.group_rank, opts.group_size),
                                  extended_api=True, devices=["cpu"])
    return dist.new_group(list(range(size)), backend="nothing")


def timed(fn: Any, iters: int, rounds: int, per_call_divisor: int = 1) -> float:
    """Median over ``rounds`` of the time per call of ``fn`` (us), after a warm-up round."""
    samples = []
    for round_ in range(rounds + 1):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        if round_:
            samples.append((time.perf_counter() - start) / iters / per_call_divisor * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--profiler", action="store_true", help="also time all_reduce under torch.profiler")
    parser.add_argument("--pending", default="", metavar="K,...",
                        help="also time hpccomm's send/recv with K receives in flight that nobody waits on")
    args = parser.parse_args()
    pending = [int(count) for count in args.pending.split(",") if count]
    if any(count < 1 for count in pending):
        parser.error(f"--pending: counts of receives must be positive, got {args.pending!r}")
    dist.init_process_group("hpccomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    assert size == 2, "run on 2 ranks"
    comm = world.members().Dup()  # the ranks (MPI_COMM_WORLD, less any spares)
    nothing = nothing_group(rank, size)
    t, out = torch.ones(1), torch.zeros(1)
    a, b = t.numpy(), out.numpy()
    peer = 1 - rank

    def ping_pong(send: Any, recv: Any) -> Any:
        """One round trip: rank 0 sends first, rank 1 answers."""
        first, second = (send, recv) if rank == 0 else (recv, send)
        return lambda: (first(), second())

    raw_ping = ping_pong(lambda: comm.Send(a, dest=peer), lambda: comm.Recv(b, source=peer))
    hpc_ping = ping_pong(lambda: dist.send(t, dst=peer), lambda: dist.recv(out, src=peer))
    floor_ping = ping_pong(lambda: dist.send(t, dst=peer, group=nothing), lambda: dist.recv(out, src=peer, group=nothing))

    cases = {
        "raw all_reduce": (lambda: comm.Allreduce(a, b), 1),
        "hpccomm all_reduce": (lambda: dist.all_reduce(t), 1),
        "floor all_reduce": (lambda: dist.all_reduce(t, group=nothing), 1),
        "raw send/recv one-way": (raw_ping, 2),
        "hpccomm send/recv one-way": (hpc_ping, 2),
        "floor send/recv one-way": (floor_ping, 2),
    }

    @contextlib.contextmanager
    def in_flight(count: int) -> Any:
        """``count`` receives posted for the block and left to hpccomm; matched after it, then waited on."""
        works = [dist.irecv(torch.zeros(1), src=peer, tag=PENDING_TAG + i) for i in range(count)]
        yield
        works += [dist.isend(torch.ones(1), dst=peer, tag=PENDING_TAG + i) for i in range(count)]
        for work in works:
            work.wait()

    # What a case runs inside, where not nothing: the receives in flight, the profiler.
    around: dict[str, Any] = {}
    for count in pending:
        name = f"hpccomm send/recv, {count} pending"
        cases[name] = cases["hpccomm send/recv one-way"]
        around[name] = lambda count=count: in_flight(count)
    if args.profiler:
        for who in ("hpccomm", "floor"):
            for shapes in (False, True):
                name = f"{who} all_reduce, profiler{' +shapes' if shapes else ''}"
                cases[name] = cases[f"{who} all_reduce"]
                around[name] = lambda shapes=shapes: profile(activities=[ProfilerActivity.CPU], record_shapes=shapes)
    results = {}
    for name, (fn, divisor) in cases.items():
        comm.Barrier()
        with around.get(name, contextlib.nullcontext)():
            results[name] = timed(fn, args.iters, args.rounds, divisor)
    if rank == 0:
        floor = results["floor all_reduce"]
        print(f"# torch {torch.__version__}, hpccomm as a {'Backend' if BACKEND_SHAPE else 'ProcessGroup'}; "
              f"median of {args.rounds} rounds of {args.iters} calls, us")
        for name, value in results.items():
            print(f"{name:28s} {value:8.2f}")
        for op in ("all_reduce", "send/recv one-way"):
            above = results[f"hpccomm {op}"] - results[f"raw {op}"]
            print(f"{op:28s} (hpccomm - raw) / floor = {above / floor:.2f}")
        # torch's own share of a one-way trip (a send and a receive call), in floors.
        print(f"{'send/recv one-way':28s} floor send/recv / floor = {results['floor send/recv one-way'] / floor:.2f}")
        for count in pending:
            ratio = results[f"hpccomm send/recv, {count} pending"] / results["hpccomm send/recv one-way"]
            print(f"{'send/recv one-way':28s} with {count} pending: {ratio:.2f}x the time without")
        for shapes in ("", " +shapes") if args.profiler else ():
            added = results[f"hpccomm all_reduce, profiler{shapes}"] - results["hpccomm all_reduce"]
            torchs = results[f"floor all_reduce, profiler{shapes}"] - floor
            print(f"{'profiler' + shapes:28s} adds {added:.2f} us to hpccomm's all_reduce, {torchs:.2f} us to the floor's")
    comm.Free()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
