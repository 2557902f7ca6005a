"""What is particular to the UCC transport: routing and its log line, teams per group, 16-bit floats.

Run with HPCCOMM_TRANSPORT=ucc. Usage: ucc_transport.py [name-filter]
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import logging
import sys

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from hpccomm import ledger
from hpccomm.groups import front_of
from hpccomm.transports import ucc as ucc_transport
from rankcheck import check, run_all

records: list[str] = []


class _Collect(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        records.append(record.getMessage())


logging.getLogger("hpccomm").addHandler(_Collect())
logging.getLogger("hpccomm").setLevel(logging.INFO)

dist.init_process_group("hpccomm")
RANK, SIZE = dist.get_rank(), dist.get_world_size()


@check
def host_tensors_go_to_ucc_and_the_log_says_so_once() -> None:
    transports = front_of(dist.group.WORLD)._transports
    assert type(transports["cpu"]).__name__ == "UCCTransport", transports
    assert ("cuda" in transports) == torch.cuda.is_available(), transports
    group = dist.new_group(list(range(SIZE)))
    dist.destroy_process_group(group)
    lines = [line for line in records if line.startswith("hpccomm transports:")]
    assert len(lines) == 1, records
    assert "cpu -> ucc (UCC " in lines[0] and "libucc.so" in lines[0] and "libucp.so" in lines[0], lines[0]
    # UCC carries host memory only so far: CUDA tensors go through host memory where there is a GPU.
    cuda = "cuda -> staged" if torch.cuda.is_available() else "cuda -> none (torch sees no CUDA device)"
    assert cuda in lines[0], lines[0]


@check
def each_group_has_a_team_destroyed_with_it() -> None:
    context = ucc_transport._context
    before = len(context.teams)
    groups = [dist.new_group(list(range(SIZE))), dist.new_group(list(range(0, SIZE, 2)))]
    assert len(context.teams) == before + (2 if RANK % 2 == 0 else 1), (before, len(context.teams))
    for group in groups:
        dist.destroy_process_group(group)
    assert len(context.teams) == before, (before, len(context.teams))


@check
def sixteen_bit_floats_are_reduced_as_float32_and_rounded_once() -> None:
    # Two ties in a row: rounding after each step would give 1 + 4 units; once gives 1 + 3.
    for dtype, unit in ((torch.bfloat16, 2**-7), (torch.float16, 2**-10)):
        t = torch.full((3,), {0: 1.0, 1: 1.5 * unit, 2: 1.5 * unit}.get(RANK, 0.0), dtype=dtype)
        dist.all_reduce(t)
        exact = 1.0 + 1.5 * unit * min(SIZE - 1, 2)
        assert torch.equal(t, torch.full((3,), exact, dtype=torch.float32).to(dtype)), (dtype, t)


@check
def more_groups_than_a_goodbye_names_each_with_its_team() -> None:
    # Each group's team keeps a bootstrap ledger; with more than a goodbye names (MOST_GROUPS) made after the
    # context, the context's teardown barrier was left out of the goodbyes and the other ranks gave up on it at
    # exit (tests/test_ucc.py reads the exit: no "left the job without taking part", no failed teardown). Then
    # the world, made before them all, is named again once used: a goodbye names the groups used last.
    for _ in range(ledger.MOST_GROUPS + 6):
        group = dist.new_group(list(range(SIZE)))
        t = torch.ones(1)
        dist.all_reduce(t, group=group)
        assert t.item() == SIZE, t
        dist.destroy_process_group(group)
    world_key = front_of(dist.group.WORLD).ledger.key()
    peer = (RANK + 1) % SIZE
    assert world_key not in ledger.facts_for(peer), "the world, unused since 70 groups were made, still named"
    dist.barrier()
    assert world_key in ledger.facts_for(peer), "the world, used last, not named in a goodbye"


run_all(RANK, sys.argv[1] if len(sys.argv) > 1 else None)
dist.destroy_process_group()
