"""Monitored barriers: pass when all arrive, name who did not (Gloo's wording).

Each failure case runs on a fresh group: a rank that skipped a monitored
barrier stays one call behind on that group, as with Gloo. Needs 3+ ranks for
the failure cases. Usage: monitor.py [name-filter]
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import sys
import time
from datetime import timedelta

import hpccomm
import torch.distributed as dist
from rankcheck import check, expect_error, run_all

dist.init_process_group("hpccomm", timeout=timedelta(seconds=30))
RANK, SIZE = dist.get_rank(), dist.get_world_size()
TIMEOUT = timedelta(seconds=1)


def fresh_group() -> dist.ProcessGroup:
    return dist.new_group(list(range(SIZE)))


@check
def every_rank_arrives() -> None:
    hpccomm.monitored_barrier(timeout=TIMEOUT)
    hpccomm.monitored_barrier(timeout=2.0, wait_all_ranks=True)
    dist.group.WORLD.monitored_barrier(TIMEOUT)  # torch's tests call the group's method
    evens = list(range(0, SIZE, 2))
    group = dist.new_group(evens)
    hpccomm.monitored_barrier(group, TIMEOUT)  # non-members return at once
    dist.destroy_process_group(group)


@check
def rank_0_names_the_first_missing_rank_and_the_others_fail_too() -> None:
    if SIZE < 3:
        return
    group = fresh_group()
    start = time.monotonic()
    if RANK == 0:
        exc = expect_error(hpccomm.MonitoredBarrierError, "Rank 1 failed to pass monitoredBarrier in 1000 ms",
                           lambda: hpccomm.monitored_barrier(group, TIMEOUT))
        assert "world rank(s) 1;" in str(exc), exc
    elif RANK != 1:
        expect_error(
            RuntimeError,
            f"Rank {RANK} successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0",
            lambda: hpccomm.monitored_barrier(group, TIMEOUT),
        )
    elapsed = time.monotonic() - start
    assert RANK == 1 or 1.0 <= elapsed < 6, f"monitored barrier failed after {elapsed:.2f} s"
    dist.barrier()
    dist.destroy_process_group(group)


@check
def wait_all_ranks_names_every_missing_rank() -> None:
    if SIZE < 3:
        return
    group = fresh_group()
    if RANK == 0:
        missing = ", ".join(str(r) for r in range(1, SIZE))
        expect_error(hpccomm.MonitoredBarrierError, f"Ranks {missing} failed to pass monitoredBarrier",
                     lambda: hpccomm.monitored_barrier(group, timedelta(seconds=0.2), wait_all_ranks=True))
    dist.barrier()
    dist.destroy_process_group(group)


@check
def rank_0_with_no_time_left_says_so() -> None:
    if SIZE < 2:
        return
    group = fresh_group()
    if RANK == 0:
        expect_error(hpccomm.MonitoredBarrierError, "Rank 0 timed out in monitoredBarrier",
                     lambda: group.monitored_barrier(timedelta(seconds=0)))
    dist.barrier()
    dist.destroy_process_group(group)


@check
def a_gloo_group_is_refused_clearly() -> None:
    gloo = dist.new_group(backend="gloo")
    expect_error(ValueError, "monitored_barrier", lambda: hpccomm.monitored_barrier(gloo))
    # Gloo connects its ranks pairwise while new_group returns; a rank that destroyed the group
    # first would close a connection a slower peer is still making ("Connection closed by peer").
    dist.barrier(group=gloo)
    dist.destroy_process_group(gloo)


run_all(RANK, sys.argv[1] if len(sys.argv) > 1 else None)
dist.destroy_process_group()
