"""hpccomm's own host work per staged CUDA call, measured on the CPU with a device that costs nothing.

    hpccomm-run -n 1 python benchmarks/staged_host_cost.py [--iters N] [--rounds R] [--profile N]
    mkdir -p /tmp/cg && PYTHONHASHSEED=0 setarch "$(uname -m)" -R valgrind --tool=callgrind \\
        --dump-before=getpgrp --callgrind-out-file=/tmp/cg/out \\
        $VENV/bin/python benchmarks/staged_host_cost.py --callgrind /tmp/cg/out --iters 500   # instructions

On a GPU a blocking 4-byte ``dist.all_reduce`` of a CUDA tensor through host
memory costs its staging floor (``benchmarks/cuda_staging_floor.py``: the
events, stream waits and copies of the :class:`~hpccomm.transports.device_ops.DeviceOps`
seam, with no communication) plus hpccomm's own Python work per call. This
script measures the second on any machine: the default group's route for
host tensors is swapped, for the staged cases, for the chain a CUDA tensor
takes on a GPU with UCC (``BySize`` -> ``HostStagedTransport`` -> the MPI
transport on host buffers), over :class:`FreeOps`, a DeviceOps whose events
complete at once and whose copies are plain ``copy_``. The real shell
(ProcessGroup on torch <= 2.13, Backend on >= 2.14), front, Work and
transports run as on a GPU; only the device's own cost is gone. Cases, one
rank, timed interleaved (a round of ``--iters`` calls of each in turn, the
median over ``--rounds`` rounds, us per call):

* ``floor sequence``: :func:`cuda_staging_floor.staged_round_trip` over
  FreeOps, "join": the floor benchmark's sequence (here nearly all Python);
* ``torch floor``: ``dist.all_reduce`` on a backend that does nothing
  (``per_call.nothing_group``): torch's own cost per call;
* ``raw MPI``: mpi4py's ``Iallreduce`` in place plus its ``Test``;
* ``hpccomm cpu``: ``dist.all_reduce`` of a host tensor (the MPI path);
* ``hpccomm staged``: the same call through the staged chain;
* the chain cut at each layer: ``front.allreduce`` called directly, then
  ``BySize``, ``HostStagedTransport`` and ``MPITransport`` each posting the
  all-reduce and completing it with ``complete_inline``, as the front does a
  blocking call, and ``complete_inline`` alone on a Pending already done;
* ``FreeOps.host_buffer``: the host buffer the staged path allocates per
  call (pinned, on a GPU), which the floor sequence allocates once: its own
  line in the table, apart from the staged transport's Python;
* ``front, meta tensor`` against ``front, cpu tensor``: the front alone on a
  transport that does nothing, for a tensor not on the CPU (``meta``, which
  the front checks and routes as it does a CUDA one) and for a host tensor:
  what a CUDA tensor adds in the front, which the host tensors of the staged
  cases do not pay.

The differences between neighbouring cuts give the per-layer table. The
staged transport's line is net of the floor sequence, which makes two
device-seam calls more than a blocking staged call (its landing's event,
current stream and wait, against the staged call's capture check), so it
reads a little low. ``--callgrind PREFIX``, under
callgrind as above, runs each case once for ``--iters`` calls between two
calls of ``getpgrp`` (callgrind dumps a profile part before each) and prints
the same table in instructions per call, from the parts' totals:
deterministic (with hash randomisation and address randomisation off, as
above), where timings on a shared machine are not.
``--profile N`` then runs N staged calls under cProfile and prints the
functions by their own time.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks

import hpccomm  # noqa: E402, F401
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from cuda_staging_floor import staged_round_trip  # noqa: E402
from hpccomm import world  # noqa: E402
from hpccomm.config import cuda_staged_limits  # noqa: E402
from hpccomm.groups import front_of  # noqa: E402
from hpccomm.registration import BACKEND_SHAPE  # noqa: E402
from hpccomm.transports import Transport  # noqa: E402
from hpccomm.transports.device_gated import BySize  # noqa: E402
from hpccomm.transports.host_staged import HostStagedTransport  # noqa: E402
from hpccomm.transports.mpi import MPITransport  # noqa: E402
from hpccomm.transports.mpi_types import cached_reduction  # noqa: E402
from hpccomm.work import complete_inline  # noqa: E402
from per_call import nothing_group  # noqa: E402
from torch._C._distributed_c10d import AllreduceOptions  # noqa: E402

_STREAM, _GATE, _SIDE, _EVENT = object(), object(), object(), object()


class FreeOps:
    """A :class:`~hpccomm.transports.device_ops.DeviceOps` that costs next to nothing.

    One caller's stream, one gate and one side stream that run everything at once:
    events have completed when recorded, copies are ``copy_`` on the host.
    """

    def current_stream(self) -> Any:
        return _STREAM

    def side_stream(self) -> Any:
        return _SIDE

    def gate_stream(self) -> Any:
        return _GATE

    def record(self, stream: Any) -> Any:
        return _EVENT

    def wait_event(self, stream: Any, event: Any) -> None:
        pass

    def query(self, event: Any) -> bool:
        return True

    def host_buffer(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.empty(tensor.shape, dtype=tensor.dtype)

    def copy(self, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], stream: Any) -> None:
        for dst, src in pairs:
            dst.copy_(src)

    def call_on(self, stream: Any, queue_work: Callable[[], None]) -> None:
        queue_work()

    def bind_thread(self) -> None:
        pass

    def check_can_stage(self, op: str) -> None:
        pass

    def keep_out_of_captures(self) -> None:
        pass


class NoDevice(Transport):
    """The device-memory side of ``BySize``: a 4-byte collective never reaches it."""


class Completed:
    """A Pending whose communication has completed."""

    def test(self) -> bool:
        return True

    def finish(self) -> None:
        pass


class Nothing(Transport):
    """A transport whose all-reduce is done when posted: the front's own cost, alone."""

    def allreduce(self, tensors: Sequence[torch.Tensor], reduction: Any) -> Completed:
        return Completed()


def staged_chain(comm: Any) -> Transport:
    """What a group's CUDA tensors go through on a GPU with UCC (``ucc_cuda.cuda_transport``), on FreeOps."""
    staged = HostStagedTransport(MPITransport(comm), FreeOps())
    return BySize(staged, NoDevice(), cuda_staged_limits())


def timed_interleaved(
    cases: dict[str, tuple[Callable[[], Any], Callable[[], Any]]], iters: int, rounds: int
) -> dict[str, float]:
    """Per case ``(setup, call)``, the median over ``rounds`` of the mean time per ``call`` (us).

    The cases take turns each round, so the machine's load falls on all alike;
    ``setup`` runs, untimed, before each turn.
    """
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(rounds + 1):
        for name, (setup, call) in cases.items():
            setup()
            start = time.perf_counter()
            for _ in range(iters):
                call()
            if round_:  # the first round warms up
                samples[name].append((time.perf_counter() - start) / iters * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def counted(cases: dict[str, tuple[Callable[[], Any], Callable[[], Any]]], iters: int, prefix: str) -> dict[str, float]:
    """Per case, instructions per call, under ``valgrind --tool=callgrind --dump-before=getpgrp``.

    Each case's ``iters`` calls (after as many to warm up) run between two
    calls of ``getpgrp``, before each of which callgrind dumps the part since
    the last: the second one's part is the case's. ``prefix`` is callgrind's
    ``--callgrind-out-file``: part ``n`` is ``PREFIX.n``.
    """
    parts: dict[str, int] = {}
    marks = 0
    for name, (setup, call) in cases.items():
        setup()
        for _ in range(iters):
            call()
        os.getpgrp()
        for _ in range(iters):
            call()
        os.getpgrp()
        marks += 2
        parts[name] = marks
    return {name: _part_total(f"{prefix}.{part}") / iters for name, part in parts.items()}


def _part_total(path: str) -> int:
    for line in Path(path).read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"{path}: no totals line (run under callgrind with --dump-before=getpgrp)")


def report(r: dict[str, float]) -> None:
    """The cases, then the staged call's layers: differences between neighbouring cuts of the chain."""
    for name, value in r.items():
        print(f"{name:28s} {value:10.2f}")
    layers = {
        "torch (dist.all_reduce -> shell)": r["hpccomm staged"] - r["front.allreduce, staged"],
        "front (checks, route, reduction, launch)": r["front.allreduce, staged"] - r["BySize, staged"],
        "BySize": r["BySize, staged"] - r["HostStagedTransport"],
        "HostStagedTransport (own)": r["HostStagedTransport"] - r["MPITransport"] - r["floor sequence"]
        - r["FreeOps.host_buffer"],
        "MPITransport (own)": r["MPITransport"] - r["raw MPI"] - r["complete_inline"],
        "work.complete_inline": r["complete_inline"],
        "raw MPI": r["raw MPI"],
        "device ops (floor sequence)": r["floor sequence"],
        "host buffer, one per call (device seam)": r["FreeOps.host_buffer"],
    }
    own = sum(layers[name] for name in ("front (checks, route, reduction, launch)", "BySize",
                                        "HostStagedTransport (own)", "MPITransport (own)", "work.complete_inline"))
    print("\n| layer of the staged call | per call |\n|---|---|")
    for name, value in layers.items():
        print(f"| {name} | {value:.2f} |")
    print(f"| **whole call** | {r['hpccomm staged']:.2f} |")
    print(f"| hpccomm's own (front to MPITransport, host buffer apart) | {own:.2f} |")
    print(f"| staged - floor | {r['hpccomm staged'] - r['floor sequence']:.2f} |")
    print(f"| staged / floor | {r['hpccomm staged'] / r['floor sequence']:.2f} |")
    cpu_own = r["hpccomm cpu"] - r["torch floor"] - r["raw MPI"]
    print(f"| cpu: hpccomm's own (cpu - torch floor - raw MPI) | {cpu_own:.2f} |")
    extra = r["front, meta tensor"] - r["front, cpu tensor"]
    print(f"| front: a CUDA-like (meta) tensor's extra | {extra:.2f} |")
    print(f"| **hpccomm's own, for a device tensor** (own + that extra) | {own + extra:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="then profile N staged calls")
    parser.add_argument("--callgrind", metavar="PREFIX", help="count instructions (run under callgrind: see above)")
    args = parser.parse_args()
    dist.init_process_group("hpccomm")
    assert dist.get_world_size() == 1, "run on one rank"
    MPI = world.mpi()
    front = front_of(dist.group.WORLD)
    cpu_route = front._transports["cpu"]
    nothing = nothing_group(0, 1)
    t = torch.ones(1)
    opts = AllreduceOptions()
    opts.asyncOp = False  # blocking, as dist.all_reduce makes it (the default is asynchronous)
    red = cached_reduction("all_reduce", opts.reduceOp, t.dtype)

    # Each cut of the chain on communicators of its own: the whole chain, its staged transport, its MPI transport.
    chain = staged_chain(MPI.COMM_WORLD.Dup())
    staged = staged_chain(MPI.COMM_WORLD.Dup()).staged
    host = MPITransport(MPI.COMM_WORLD.Dup())
    comm = MPI.COMM_WORLD.Dup()
    buf = (MPI.buffer.fromaddress(t.data_ptr(), t.nbytes), MPI.FLOAT)

    def route(transport: Transport) -> None:
        front._transports["cpu"] = front._cpu_transport = transport

    def all_reduce() -> None:
        dist.all_reduce(t)

    def front_call() -> None:
        front.allreduce([t], opts)

    label = ("all_reduce", front, 0, None, 0)

    def blocking(transport: Transport) -> Callable[[], None]:
        """The transport's all-reduce, completed as the front completes a blocking call."""
        return lambda: complete_inline(transport.allreduce([t], red), label, 60.0)

    done = Completed()

    # The front alone, on a transport that does nothing: a tensor not on the CPU (meta, as CUDA) against one that is.
    meta = torch.ones(1, device="meta")
    front._transports["meta"] = Nothing()
    idle = Nothing()

    free = FreeOps()
    floor = staged_round_trip(t, free, "join")
    keep = lambda: route(cpu_route)  # noqa: E731
    staged_route = lambda: route(chain)  # noqa: E731
    cases: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "floor sequence": (keep, floor),
        "torch floor": (keep, lambda: dist.all_reduce(t, group=nothing)),
        "raw MPI": (keep, lambda: comm.Iallreduce(MPI.IN_PLACE, buf, MPI.SUM).Test()),
        "hpccomm cpu": (keep, all_reduce),
        "hpccomm staged": (staged_route, all_reduce),
        "front.allreduce, staged": (staged_route, front_call),
        "BySize, staged": (keep, blocking(chain)),
        "HostStagedTransport": (keep, blocking(staged)),
        "MPITransport": (keep, blocking(host)),
        "FreeOps.host_buffer": (keep, lambda: free.host_buffer(t)),
        "complete_inline": (keep, lambda: complete_inline(done, label, 60.0)),
        "front, meta tensor": (keep, lambda: front.allreduce([meta], opts)),
        "front, cpu tensor": (lambda: route(idle), front_call),
    }
    if args.callgrind:
        results, unit = counted(cases, args.iters, args.callgrind), "instructions"
        how = "callgrind"
    else:
        results, unit = timed_interleaved(cases, args.iters, args.rounds), "us"
        how = f"median of {args.rounds} interleaved rounds of {args.iters} calls"
    route(cpu_route)
    del front._transports["meta"]
    shell = "Backend" if BACKEND_SHAPE else "ProcessGroup"
    print(f"# torch {torch.__version__}, hpccomm as a {shell}; 4 B, 1 rank; {how}; {unit} per call")
    report(results)

    if args.profile:
        route(chain)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.profile):
            all_reduce()
        profiler.disable()
        route(cpu_route)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(40)
    comm.Free()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
