"""Rank failures and stuck collectives; usage: failures.py <mode> [timeout_s].

Rank 1 misbehaves in the way <mode> names while the others run an
all_reduce that needs it:
    raise: an uncaught exception.
    exit3: sys.exit(3).
    sigkill: os.kill(os.getpid(), SIGKILL).
    raise-all: every rank raises an uncaught exception at once (run under
          hpccomm-run --ft: two ranks' MPI_Abort at once deadlocked prterun);
          each call of MPI_Abort says MPI_ABORT first.
    abort-hangs: an uncaught exception whose MPI_Abort never returns (made
          to sleep in C holding the GIL, as mpi4py's Abort holds it): hpccomm's
          backstop must still end the rank, and so the job.
    sigkill-inside: a hierarchical all_reduce (HPCCOMM_ALGO=hier) that
          rank 1 leaves half done: it SIGKILLs itself at the moment it would
          post its first inter-node stage, its node-local reduce-scatter done,
          so every other rank is inside the collective and needs it (its node
          peer for the node-local all-gather, its inter-node peer for the
          all-reduce). A fixed point, not a count of polls: however far
          polls went, they once let rank 1 finish its share under load.
    skip: rank 1 skips one all_reduce but stays alive; the others must time
          out with a clear error, then all destroy and exit without hanging.
    abort: rank 1 skips an async all_reduce on a subgroup; the others abort the
          subgroup: the pending work fails at once, later calls raise, exit is clean.
    barrier: only rank 0 enters a barrier with its own 0.5 s timeout, on a
          group whose timeout is 300 s: it must time out after 0.5 s.
    late: rank 2 gives its part of a gather to rank 1 and leaves the job;
          rank 0 joins the gather 2 s later. Rank 1 must complete it with
          everyone's data: rank 0 left having done its part (a slow rank is not
          a failed one, however long after the departure it arrives).
    relay: 6 ranks, goodbyes over the tree (HPCCOMM_GOODBYE_TREE_FROM): rank 5
          sends rank 3 one message and leaves while ranks 0 and 1, the only
          path from it to ranks 2-4 in the tree, are busy outside hpccomm (their
          relay threads must pass its record on): rank 2 waits for a message it
          never sent (not its partner: the record alone tells), rank 3 for a
          second one (its partner: its own goodbye tells), rank 4 in an
          all_reduce on a group of ranks 4 and 5; each fails, naming rank 5.
    relay-dead: 6 ranks, fault-tolerant mode, goodbyes over the tree: rank 5
          leaves without joining an all_reduce of ranks 0 and 2-5 that the
          others wait in; rank 1, its only tree neighbour, dies (SIGKILL) as
          it takes rank 5's record in, before passing it on. Rank 5, lingering,
          must send its record round the dead rank (to rank 0), and each
          waiting rank fail, naming rank 5.
    p2p: rank 0 (which also serves the job's store) sends rank 1 one
          message and leaves; rank 1 then receives twice: the first completes
          with rank 0's data, the second fails at once naming rank 0, which
          left without sending it.
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import os
import signal
import sys
import time
from datetime import timedelta

mode = sys.argv[1]
timeout_s = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
import hpccomm  # noqa: E402,F401
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from hpccomm.work import CommTimeoutError  # noqa: E402
from rankcheck import say  # noqa: E402

dist.init_process_group("hpccomm", timeout=timedelta(seconds=timeout_s))
rank, size = dist.get_rank(), dist.get_world_size()
if mode == "relay-dead" and rank == 1:  # before the all_reduce below, which rank 5 cannot leave before
    from hpccomm import failure

    take_news = failure._take_news

    def dying(batch, source):
        if any(peer == 5 for peer, _record in batch):  # rank 5's record, not yet passed on
            say(f"DIED rank={rank} t={time.time():.3f}")
            os.kill(os.getpid(), signal.SIGKILL)
        return take_news(batch, source)
    failure._take_news = dying
t = torch.ones(4)
dist.all_reduce(t)  # everyone is up
say(f"READY rank={rank} t={time.time():.3f}")

if rank == 1 and mode == "raise":
    raise ValueError("rank 1 fails on purpose")
if rank == 1 and mode == "exit3":
    sys.exit(3)
if rank == 1 and mode == "abort-hangs":
    import ctypes

    import hpccomm.failure

    class _HangingWorld:
        @staticmethod
        def Abort(code: int) -> None:
            ctypes.PyDLL(None).sleep(3600)  # PyDLL: the call keeps the GIL

    hpccomm.failure.mpi = lambda: type("_MPI", (), {"COMM_WORLD": _HangingWorld})
    raise ValueError("rank 1 fails on purpose; its MPI_Abort hangs")
if mode == "raise-all":
    import hpccomm.failure

    world = hpccomm.failure.mpi().COMM_WORLD

    class _SayingWorld:
        @staticmethod
        def Abort(code: int) -> None:
            say(f"MPI_ABORT rank={rank}")
            world.Abort(code)

    hpccomm.failure.mpi = lambda: type("_MPI", (), {"COMM_WORLD": _SayingWorld})
    raise ValueError(f"rank {rank} fails on purpose")
if rank == 1 and mode == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "sigkill-inside":
    big = torch.ones(4 << 20)
    if rank == 1:
        from hpccomm.transports.hierarchical import InterStage

        InterStage.start = lambda stage: os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(big)
    say(f"UNEXPECTED rank={rank}: all_reduce completed without rank 1")

if mode == "skip":
    start = time.monotonic()
    if rank != 1:
        try:
            dist.all_reduce(t)
            say(f"UNEXPECTED rank={rank}: all_reduce completed")
        except dist.DistBackendError as exc:  # what torch's NCCL raises on a timeout
            assert isinstance(exc, CommTimeoutError), type(exc)
            say(f"TIMEOUT rank={rank} after={time.monotonic() - start:.2f} msg={exc}")
    else:
        time.sleep(timeout_s + 2)  # alive but absent: the others must time out, not see an exit
    dist.destroy_process_group()
    say(f"EXITED rank={rank}")
    sys.exit(0)

if mode == "abort":
    group = dist.new_group(list(range(size)))
    if rank != 1:
        work = dist.all_reduce(torch.ones(4), group=group, async_op=True)
        time.sleep(0.5)
        start = time.monotonic()
        group.abort()
        try:
            work.wait()
            say(f"UNEXPECTED rank={rank}: aborted work completed")
        except RuntimeError as exc:
            say(f"ABORTED rank={rank} after={time.monotonic() - start:.2f} msg={exc}")
        try:
            dist.all_reduce(torch.ones(1), group=group)
            say(f"UNEXPECTED rank={rank}: call on an aborted group worked")
        except RuntimeError as exc:
            say(f"REFUSED rank={rank} msg={exc}")
    dist.barrier()  # the world group is unaffected
    dist.destroy_process_group()
    say(f"EXITED rank={rank}")
    sys.exit(0)

if mode == "barrier":
    group = dist.new_group(list(range(size)), timeout=timedelta(seconds=300))
    if rank == 0:
        start = time.monotonic()
        try:
            dist.barrier(group=group, timeout=timedelta(seconds=0.5))
            say(f"UNEXPECTED rank={rank}: barrier completed without the others")
        except CommTimeoutError as exc:
            say(f"TIMEOUT rank={rank} after={time.monotonic() - start:.2f} msg={exc}")
    dist.destroy_process_group(group)
    dist.barrier()  # the world group is unaffected
    dist.destroy_process_group()
    say(f"EXITED rank={rank}")
    sys.exit(0)

if mode == "late":
    parts = [torch.empty(4) for _ in range(size)] if rank == 1 else None
    if rank == 0:
        time.sleep(2.0)  # twice the grace a clock once gave the departed rank 2
    start = time.monotonic()
    dist.gather(torch.full((4,), float(rank)), parts, dst=1)
    if rank == 1:
        got = [int(part[0]) for part in parts]
        say(f"GATHERED rank={rank} after={time.monotonic() - start:.2f} got={got}")
    say(f"EXITED rank={rank}")
    sys.exit(0)

if mode == "relay":
    busy_s = 6.0
    from hpccomm import failure

    say(f"TREE rank={rank} neighbours={failure._news.neighbours if failure._news else None}")
    group = dist.new_group([4, 5])
    if rank == 5:
        dist.send(torch.full((4,), 5.0), dst=3)
        say(f"LEFT rank={rank} t={time.time():.3f}")
    elif rank in (0, 1):
        time.sleep(busy_s)  # the news passes through these ranks, busy outside hpccomm
    else:
        buf = torch.zeros(4)
        try:
            if rank == 3:
                dist.recv(buf, src=5)
                say(f"RECEIVED rank={rank} value={buf[0]:.0f}")
            if rank in (2, 3):
                dist.recv(buf, src=5)
            else:
                dist.all_reduce(buf, group=group)
            say(f"UNEXPECTED rank={rank}: completed without rank 5")
        except hpccomm.PeerExitedError as exc:
            say(f"GONE rank={rank} t={time.time():.3f} busy_s={busy_s} msg={exc}")
    say(f"EXITED rank={rank}")
    sys.exit(0)

if mode == "relay-dead":
    from hpccomm import failure

    say(f"TREE rank={rank} neighbours={failure._news.neighbours if failure._news else None}")
    group = dist.new_group([0, 2, 3, 4, 5])
    if rank == 5:
        say(f"LEFT rank={rank} t={time.time():.3f}")
    elif rank == 1:
        time.sleep(60)  # busy outside hpccomm: its relay thread takes the news in (and dies: above)
    else:
        try:
            dist.all_reduce(torch.zeros(4), group=group)
            say(f"UNEXPECTED rank={rank}: completed without rank 5")
        except hpccomm.PeerExitedError as exc:
            say(f"GONE rank={rank} t={time.time():.3f} msg={exc}")
    say(f"EXITED rank={rank}")
    sys.exit(0)

if mode == "p2p":
    if rank == 0:
        dist.send(torch.full((4,), 7.0), dst=1)
    elif rank == 1:
        time.sleep(1.5)  # rank 0 has left by now
        first = torch.zeros(4)
        dist.recv(first, src=0)
        say(f"RECEIVED rank={rank} value={first[0]:.0f}")
        start = time.monotonic()
        try:
            dist.recv(first, src=0)
            say(f"UNEXPECTED rank={rank}: a second message arrived")
        except hpccomm.PeerExitedError as exc:
            say(f"GONE rank={rank} after={time.monotonic() - start:.3f} msg={exc}")
    say(f"EXITED rank={rank}")
    sys.exit(0)

dist.all_reduce(t)  # rank 1 never arrives
say(f"UNEXPECTED rank={rank}: all_reduce completed without rank 1")
