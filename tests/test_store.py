"""The job's store served over MPI (hpccomm/store.py): what torch asks of a store, and no listening socket.

Every operation is checked against what torch's TCPStore answers, from Python
and through torch's C++ PrefixStore (as gloo and group creation call it), with
timeouts and many threads at once, then 200 rounds of the server's races
(gets parked before their set, adds from 3 threads on every rank); then what
uses the store: gloo groups
beside hpccomm, ``monitored_barrier``, destroy and re-init; and ranks that use
the store after rank 0 has left (rank 0 serves on at exit for as long as they
run, bounded by no clock). Across two fake
nodes (tests/nodes.py) whose host names resolve only on their own node (to
127.0.1.1, as Debian writes it), a job starts and ends, and each rank holds no
more listening TCP sockets than the same rank of a job of mpi4py alone under
the same launcher: MPI's own transports listen, hpccomm adds none. A dead
rank 0 in fault-tolerant mode is in tests/test_fault_tolerance.py.
"""

from __future__ import annotations

import re

import pytest
from launch import assert_all_ranks_ok, run_ranks
from nodes import run_on_nodes


@pytest.mark.parametrize("mode", ["operations", "users", "after-rank0"])
def test_the_store_answers_as_torch_expects(mode):
    run = run_ranks(3, "store.py", mode)
    assert_all_ranks_ok(run, 3)


def listening(output: str) -> dict[int, int]:
    return {int(rank): int(count) for rank, count in re.findall(r"SOCKETS rank=(\d+) listening=(\d+)", output)}


def test_across_nodes_no_rank_listens_more_than_mpi_and_no_name_must_resolve():
    plain = run_on_nodes((2, 2), "store.py", "plain", own_name_only=True)
    assert plain.returncode == 0 and not plain.timed_out, plain.output[-4000:]
    job = run_on_nodes((2, 2), "store.py", "sockets", own_name_only=True)
    assert_all_ranks_ok(job, 4)
    baseline, ours = listening(plain.output), listening(job.output)
    assert sorted(baseline) == sorted(ours) == [0, 1, 2, 3], (baseline, ours)
    assert all(ours[rank] <= baseline[rank] for rank in ours), f"hpccomm job {ours}, mpi4py alone {baseline}"
