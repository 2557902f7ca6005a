"""Rendezvous and identity; usage: rendezvous.py <mode>.

Modes:
    private-store: no MASTER_ADDR: the store served over MPI; the rendezvous opens no listening socket.
    master-addr: MASTER_ADDR/MASTER_PORT set by the user: torch's TCPStore.
    wrong-rank / wrong-world-size: a user value that disagrees with MPI.
    singleton: run without a launcher: a world of one.
    file-store-ends / file-store-aborts: HPCCOMM_STORE=file; the job ends, or rank 1 raises and aborts it.
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import os
import sys

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from mpi4py import MPI

from hpccomm.store import MPIStore
from rankcheck import default_store, listening_socket_inodes, say

mode = sys.argv[1]
rank, size = MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size


if mode in ("wrong-rank", "wrong-world-size"):
    kwargs = {"rank": rank + 1, "world_size": size} if mode == "wrong-rank" else {"world_size": size + 1}
    try:
        dist.init_process_group("hpccomm", **kwargs)
    except ValueError as exc:
        wrong = kwargs["rank"] if mode == "wrong-rank" else kwargs["world_size"]
        right = rank if mode == "wrong-rank" else size
        assert str(wrong) in str(exc) and str(right) in str(exc), exc
        say(f"REJECTED rank={rank}: {exc}")
        sys.exit(0)
    sys.exit(f"rank {rank}: init accepted a wrong {mode}")

hpccomm.identity()  # starts MPI, whose own transports may listen (MPICH's netmod does)
listening_before = listening_socket_inodes()
dist.init_process_group("hpccomm")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == size
store = default_store()
if mode == "private-store":
    assert isinstance(store, MPIStore), type(store)
    opened = listening_socket_inodes() - listening_before
    assert not opened, "the rendezvous opened a listening TCP socket"
elif mode == "master-addr":
    assert isinstance(store, dist.TCPStore), type(store)
    assert store.port == int(os.environ["MASTER_PORT"])
elif mode == "singleton":
    assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
elif mode.startswith("file-store"):
    assert isinstance(store, dist.FileStore), type(store)
    assert os.path.exists(store.path), store.path
    say(f"STORE-FILE rank={rank} {store.path}")
    dist.barrier()  # every rank has said where its store is
    if mode == "file-store-aborts" and rank == 1:
        raise RuntimeError("rank 1 fails on purpose")  # fail-fast aborts the job: no rank's destructor runs
    dist.barrier()
store.set(f"key{rank}", b"v")  # the store works for torch and other backends
assert store.get(f"key{rank}") == b"v"
dist.destroy_process_group()
say(f"OK rank={rank} mode={mode} store={type(store).__name__}")
