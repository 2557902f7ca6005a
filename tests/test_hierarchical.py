"""Groups that span nodes, on fake nodes of this machine (tests/nodes.py): the hierarchical path and its failures.

Every layout runs tests/ranks/hierarchical.py with the hierarchical path forced
onto every size in 64-byte chunks: topology, node and leader groups, every
hierarchical op x dtype x reduce op against locally computed values, HSDP
parity. Layouts: 2 nodes x 1, 2 and 3 ranks, 2 + 1 (flat: the hierarchy does
not apply), and 2 x 2 numbered round-robin across the nodes. After every run,
each node's private /dev/shm must be empty: nothing left by a clean exit, a
crash or an abort (after a crash, hpccomm's segments only: MPICH leaves its own
mpich_shm_* files behind when a rank is killed).
"""

import pytest
from launch import HIER_EVERYWHERE, assert_all_ranks_ok, check_failed_fast
from nodes import run_on_nodes


def limit_for(ranks: int) -> int:
    """The time limit of a whole hierarchical.py run on ``ranks`` ranks.

    6 ranks on 2 cores take about 170 s here when quiet and over 300 s in a slow phase; 4 ranks
    took from 15 s to 210 s on one machine in one day.
    """
    return max(300, 100 * ranks)


def assert_nothing_left(run, only_ours: bool = False) -> None:
    """Fail if a node's /dev/shm holds anything (with ``only_ours``: any hpccomm segment)."""
    left = {node: [n for n in names if n.startswith("hpccomm-") or not only_ours] for node, names in run.leftovers.items()}
    assert all(not names for names in left.values()), f"left in /dev/shm: {left}"


#: The other layouts check hpccomm's own arithmetic of nodes, leaders and chunks, the same under every torch
#: release and MPI: CI runs them in its first step only (.ci/run). 2 x 2 numbered round-robin (the MPI's own
#: node grouping) and the failures run wherever the suite does.
ONCE = pytest.mark.one_environment


@pytest.mark.parametrize(
    "per_node, round_robin",
    [
        pytest.param((1, 1), False, id="2x1", marks=ONCE),
        pytest.param((2, 2), False, id="2x2", marks=ONCE),
        pytest.param((3, 3), False, id="2x3", marks=ONCE),
        pytest.param((2, 1), False, id="2+1", marks=ONCE),
        pytest.param((2, 2), True, id="2x2-round-robin"),  # the MPI's own node grouping, ranks interleaved
    ],
)
def test_every_hierarchical_collective(per_node, round_robin):
    run = run_on_nodes(per_node, "hierarchical.py", round_robin=round_robin, env=HIER_EVERYWHERE,
                       limit_s=limit_for(sum(per_node)))
    assert_all_ranks_ok(run, sum(per_node))
    assert_nothing_left(run)


@ONCE
def test_algo_flat_keeps_every_collective_on_mpi():
    # The checker expects no topology-aware transport at all, and checks every result.
    run = run_on_nodes((2, 2), "hierarchical.py", env={**HIER_EVERYWHERE, "HPCCOMM_ALGO": "flat"},
                       limit_s=limit_for(4))
    assert_all_ranks_ok(run, 4)
    assert "hierarchical=False" in run.output, run.output[-4000:]


@pytest.mark.parametrize(
    "mode, evidence",
    [("sigkill-inside", ["1"]), ("exit3", ["rank(s) 1 left the job"])],
)
def test_a_rank_failing_inside_a_hierarchical_collective_ends_the_job_fast(mode, evidence):
    run = run_on_nodes((2, 2), "failures.py", mode, env={"HPCCOMM_ALGO": "hier", "HPCCOMM_SHM_MIN_BYTES": "1"}, limit_s=120)
    check_failed_fast(run, mode, evidence)
    assert_nothing_left(run, only_ours=True)


def test_abort_during_a_hierarchical_collective_leaves_nothing():
    run = run_on_nodes((2, 2), "failures.py", "abort", env={"HPCCOMM_ALGO": "hier", "HPCCOMM_SHM_MIN_BYTES": "1"},
                       limit_s=120)
    assert not run.timed_out and run.returncode == 0, run.output[-4000:]
    aborted = run.lines("ABORTED")
    assert len(aborted) == 3 and all("was aborted" in line for line in aborted), run.output[-4000:]
    assert len(run.lines("EXITED")) == 4
    assert_nothing_left(run)
