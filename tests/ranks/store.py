"""The job's store served over MPI (hpccomm/store.py); usage: store.py <mode>.

Modes:
    operations: every store operation, called from Python and through torch's C++ PrefixStore,
        as TCPStore answers it; timeouts; many threads at once; a 4 MiB value; then 200 rounds
        of sets, waits, gets parked before their set and adds from 3 threads on every rank.
    users: what uses the store: gloo groups beside hpccomm, monitored_barrier, destroy and
        re-init (a new table each time), a group after init.
    sockets: init, a collective and store operations; prints the TCP sockets this rank listens on.
    plain: the same count in a job of mpi4py alone (the baseline: MPI's own transports).
    after-rank0: rank 0 leaves right after init, its store's clock sped up 1000-fold (a bound on how
        long it serves at exit would pass in milliseconds); the others, once rank 0's goodbye is
        here, still set, get, add and exchange keys through the store it serves.
    rank0-dies: fault-tolerant mode; rank 0 SIGKILLs itself after init; the others shrink,
        run a collective and a new group, then their next store operation raises DistStoreError
        naming rank 0, well before the store's timeout.
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import os
import signal
import sys
import threading
import time
from datetime import timedelta

mode = sys.argv[1]
if mode == "plain":
    from mpi4py import MPI
    from rankcheck import listening_socket_inodes

    MPI.COMM_WORLD.Barrier()
    print(f"SOCKETS rank={MPI.COMM_WORLD.rank} listening={len(listening_socket_inodes())}", flush=True)
    MPI.COMM_WORLD.Barrier()
    sys.exit(0)

import hpccomm  # noqa: F401,E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from rankcheck import default_store, listening_socket_inodes, say  # noqa: E402

from hpccomm.store import MPIStore  # noqa: E402


def expect_timeout(call, seconds: float) -> None:
    started = time.monotonic()
    try:
        call()
    except dist.DistStoreError as error:
        waited = time.monotonic() - started
        assert "timed out" in str(error), error
        assert seconds * 0.9 <= waited < seconds + 5, f"timed out after {waited:.2f} s, not {seconds}"
        return
    raise AssertionError("no timeout")


def operations(rank: int, size: int) -> None:
    store = default_store()
    assert isinstance(store, MPIStore), type(store)
    prefixed = dist.PrefixStore("p/", store)  # torch's C++ Store calls the methods below from C++
    for name, s in (("py", store), ("cpp", prefixed)):
        s.set(f"{name}/set/{rank}", f"value{rank}")
        s.wait([f"{name}/set/{r}" for r in range(size)])  # every rank's set, seen by every rank
        assert [s.get(f"{name}/set/{r}") for r in range(size)] == [f"value{r}".encode() for r in range(size)]
        assert s.check([f"{name}/set/{r}" for r in range(size)]) and not s.check([f"{name}/never"])
        assert s.add(f"{name}/count", rank + 1) > 0
        s.multi_set([f"{name}/multi/{rank}/a", f"{name}/multi/{rank}/b"], [b"a", "b"])
        assert s.multi_get([f"{name}/multi/{rank}/a", f"{name}/multi/{rank}/b"]) == [b"a", b"b"]
        s.append(f"{name}/append/{rank}", b"x")
        s.append(f"{name}/append/{rank}", b"yz")
        assert s.get(f"{name}/append/{rank}") == b"xyz"
        # compare_set as TCPStore: a missing key with a non-empty expected value is left unset.
        assert s.compare_set(f"{name}/cas/{rank}", b"old", b"new") == b"old"
        assert not s.check([f"{name}/cas/{rank}"])
        assert s.compare_set(f"{name}/cas/{rank}", b"", b"first") == b"first"
        assert s.compare_set(f"{name}/cas/{rank}", b"wrong", b"second") == b"first"
        assert s.compare_set(f"{name}/cas/{rank}", b"first", b"second") == b"second"
        s.set(f"{name}/gone/{rank}", b"1")
        assert s.delete_key(f"{name}/gone/{rank}") and not s.delete_key(f"{name}/gone/{rank}")
        # One rank waits for a key another sets later: get waits, the set releases it.
        if rank == 0:
            assert s.get(f"{name}/late") == b"late"
        elif rank == size - 1:
            time.sleep(0.3)
            s.set(f"{name}/late", b"late")
        s.add(f"{name}/done", 1)
        s.wait([f"{name}/late"])
    # add: every rank's amounts, once each, and from many threads at once.
    threads = [threading.Thread(target=lambda: [store.add("threads", 1) for _ in range(50)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.add("threads-done", 1)
    while int(store.get("threads-done")) < size:
        time.sleep(0.01)
    assert int(store.get("threads")) == 200 * size, store.get("threads")
    assert int(store.get("py/count")) == size * (size + 1) // 2
    big = bytes(range(256)) * (16 << 10)  # 4 MiB
    if rank == size - 1:
        store.set("big", big)
    assert store.get("big") == big
    store.set("not-a-number", b"x")
    try:
        store.add("not-a-number", 1)
        raise AssertionError("add on a non-integer value succeeded")
    except dist.DistStoreError as error:
        assert "not an integer" in str(error), error
    assert store.num_keys() > 0
    # Timeouts: the store's, set_timeout's, and wait's own; the store answers again afterwards.
    store.set_timeout(timedelta(seconds=1))
    expect_timeout(lambda: store.get("never"), 1.0)
    expect_timeout(lambda: prefixed.get("never"), 1.0)
    expect_timeout(lambda: store.wait(["never"], timedelta(seconds=0.5)), 0.5)
    expect_timeout(lambda: store.multi_get(["big", "never"]), 1.0)
    assert store.get("big") == big
    assert store.clone() is store


def rounds(rank: int, size: int, count: int = 200) -> None:
    """The server's races, looped: parked gets released by another rank's set, adds from threads."""
    store = default_store()
    store.set_timeout(timedelta(seconds=60))
    for i in range(count):
        store.set(f"r{i}/{rank}", str(i * size + rank))
        store.wait([f"r{i}/{r}" for r in range(size)])
        got = store.multi_get([f"r{i}/{r}" for r in range(size)])
        assert got == [str(i * size + r).encode() for r in range(size)], (i, got)
        if rank == i % size:
            assert store.get(f"late{i}") == b"x"  # usually parked before the set below arrives
        elif rank == (i + 1) % size:
            store.set(f"late{i}", b"x")
        threads = [threading.Thread(target=lambda: [store.add(f"c{i}", 1) for _ in range(5)]) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        dist.barrier()
        assert int(store.get(f"c{i}")) == 15 * size, (i, store.get(f"c{i}"))


def users(rank: int, size: int) -> None:
    for round_ in range(3):
        store = default_store()
        assert isinstance(store, MPIStore), type(store)
        # A key of an earlier init is not seen by a later one (each rendezvous has a table of its own).
        assert not store.check(["round"]), f"round {round_}: the previous init's key leaked"
        dist.barrier()
        store.set("round", str(round_))
        gloo = dist.new_group(backend="gloo")
        t = torch.full((4,), float(rank))
        dist.all_reduce(t, group=gloo)
        assert t.tolist() == [float(sum(range(size)))] * 4
        dist.monitored_barrier(gloo, timeout=timedelta(seconds=30))
        sub = dist.new_group([0, size - 1])
        if rank in (0, size - 1):
            u = torch.ones(2)
            dist.all_reduce(u, group=sub)
            assert u.tolist() == [2.0, 2.0]
        dist.barrier()
        dist.destroy_process_group()
        if round_ < 2:
            dist.init_process_group("hpccomm")


class _FastClock:
    """Time as hpccomm.store sees it on rank 0 in after-rank0: a second lasts a millisecond."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def monotonic(self) -> float:
        return self._start + (time.monotonic() - self._start) * 1000

    sleep = staticmethod(time.sleep)


def main() -> None:
    dist.init_process_group("hpccomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    if mode == "operations":
        operations(rank, size)
        rounds(rank, size)
    elif mode == "users":
        users(rank, size)
        say(f"OK rank={rank} mode={mode}")
        return
    elif mode == "sockets":
        t = torch.ones(1)
        dist.all_reduce(t)
        store = default_store()
        store.set(f"k{rank}", b"v")
        store.wait([f"k{r}" for r in range(size)])
        dist.new_group([0, 1])
        print(f"SOCKETS rank={rank} listening={len(listening_socket_inodes())}", flush=True)
    elif mode == "after-rank0":
        store = default_store()
        dist.barrier()
        if rank == 0:
            hpccomm.store.time = _FastClock()
            say(f"OK rank={rank} mode={mode}")
            return
        from hpccomm import failure

        while 0 not in failure._said:  # rank 0 has reached its exit (the test's limit bounds this)
            failure._collect_goodbyes()
            time.sleep(0.01)
        time.sleep(0.5)
        store.set(f"late{rank}", str(rank))
        assert store.get(f"late{rank}") == str(rank).encode()
        assert store.add("late-count", 1) >= 1
        others = [f"late{r}" for r in range(1, size) if r != rank]
        while not store.check(others):  # polled: a parked get would expire on rank 0's sped-up clock
            time.sleep(0.01)
        assert [store.get(key) for key in others] == [key[4:].encode() for key in others]
        say(f"OK rank={rank} mode={mode}")
        return
    elif mode == "rank0-dies":
        store = default_store()
        store.set(f"k{rank}", b"v")
        dist.barrier()
        if rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        t = torch.ones(1)
        try:
            dist.all_reduce(t)
        except hpccomm.PeerFailure as failure:
            assert failure.failed_ranks == [0], failure.failed_ranks
        # The survivors go on without the store: shrink_group, collectives and new groups use none.
        dist.shrink_group([0])
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == size - 1, t
        pair = dist.new_group([0, 1])
        dist.all_reduce(t, group=pair)
        assert t.item() == 2 * (size - 1), t
        started = time.monotonic()
        try:
            store.get("never set")
            raise AssertionError("a store without its server answered")
        except dist.DistStoreError as error:
            waited = time.monotonic() - started
            assert "rank 0" in str(error) and "failed" in str(error), error
            say(f"STORE-ERROR rank={rank} after={waited:.2f}: {error}")
        say(f"OK rank={rank} mode={mode}")
        return
    dist.barrier()
    dist.destroy_process_group()
    say(f"OK rank={rank} mode={mode}")


main()
