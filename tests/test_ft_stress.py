"""benchmarks/ft_stress.py: how it judges a run, on lines as the rank programs print them, and on real runs.

The benchmark holds issue 32's bound (a PeerFailure within 5 s of the death)
that tests/test_fault_tolerance.py only prints: its verdicts must fail a run
whose survivors learnt too late, learnt nothing, or learnt it on another path,
whichever rank program printed the lines. The real runs (one mode ``checks``
job of each rank program, on flat MPI) check that its patterns still read
what those programs print; how long the death took to reach the survivors is
not asserted there (a speed target: the benchmark's own verdict).
"""

from __future__ import annotations

import pytest
from launch import RankRun
from scripts import REPO, load_script
from test_fault_tolerance import torch_release, ulfm_here

stress = load_script(REPO / "benchmarks" / "ft_stress.py")


def judged(mode: str, path: str, moment: str, ranks: int, victims: str, output: str, *, returncode: int = 0,
           spares: int = 0) -> "stress.Outcome":
    outcome = stress.Outcome(mode, path, moment, ranks, victims, False, spares, 1.0, "ok")
    stress.judge(outcome, RankRun(returncode, output, False), ranks, victims, spares)
    return outcome


def caught(rank: int, at: float, path: str = "flat", tree: int = 0, relayed: int = 0) -> str:
    """A survivor's lines in tests/ranks/fault_tolerance.py."""
    return (f"PATH rank={rank} {path}\nFAILED rank={rank} took=0.052 at={at:.6f} failed=[1]\n"
            f"STOPS rank={rank} tree={tree} sent=1 received=1 relayed={relayed}\nOK rank={rank} shrink=0.002\n")


def test_a_check_whose_survivors_learnt_of_the_death_on_the_path_asked_for_is_ok_with_each_lag():
    output = "DIED rank=1 at=100.000000\n" + caught(0, 100.25) + caught(2, 100.5)
    outcome = judged("checks", "flat", "between", 3, "1", output)
    assert (outcome.verdict, outcome.lags) == ("ok", [0.25, 0.5])


@pytest.mark.parametrize("output, verdict", [
    # A survivor's PeerFailure past the 5 s bound.
    ("DIED rank=1 at=100.000000\n" + caught(0, 100.2) + caught(2, 105.5), "late"),
    # A survivor that ended OK without learning of the death.
    ("DIED rank=1 at=100.000000\n" + caught(0, 100.2) + "OK rank=2 shrink=0.002\n", "wrong"),
    # The failed collective took another path than the one asked for.
    ("DIED rank=1 at=100.000000\n" + caught(0, 100.2) + caught(2, 100.2, path="node"), "wrong"),
    # An all_reduce that completed without the dead.
    ("DIED rank=1 at=100.000000\n" + caught(0, 100.2) + "UNEXPECTED rank=2: the all_reduce completed\n", "wrong"),
    # No victim's death seen: the PeerFailures are timed from none.
    (caught(0, 100.2) + caught(2, 100.2), "wrong"),
])
def test_a_check_is_late_or_wrong_where_a_survivor_learnt_too_late_nothing_or_elsewhere(output, verdict):
    assert judged("checks", "flat", "between", 3, "1", output).verdict == verdict


@pytest.mark.parametrize("ranks, victims, taken, verdict", [
    (3, "1", "flat", "ok"),  # 2 + 1 ranks: no hierarchy, flat across the two nodes
    (4, "1,2", "hier", "ok"), (4, "1,2", "flat", "wrong"),  # 2 + 2: hierarchical
])
def test_on_two_fake_nodes_a_check_must_take_the_hierarchy_where_the_nodes_are_even(ranks, victims, taken, verdict):
    dead = victims.split(",")
    output = "".join(f"DIED rank={rank} at=100.000000\n" for rank in dead)
    output += "".join(caught(rank, 100.2, path=taken) for rank in range(ranks) if str(rank) not in dead)
    assert judged("checks", "hier", "between", ranks, victims, output).verdict == verdict


@pytest.mark.parametrize("tree, relayed, verdict", [(1, 1, "ok"), (1, 0, "wrong"), (0, 1, "wrong")])
def test_a_death_as_the_stops_relay_is_checked_only_where_they_went_over_the_tree_and_rank_0_relayed(
        tree, relayed, verdict):
    deaths = "DIED rank=2 at=100.000000\nDIED rank=1 at=100.500000\n"
    output = deaths + "".join(caught(rank, 100.6, tree=tree, relayed=relayed if rank == 0 else 0)
                              for rank in (0, 3, 4, 5))
    assert judged("checks", "flat", "relay-dies", 6, "1,2", output).verdict == verdict


def test_the_stores_error_is_bounded_by_how_long_the_store_operation_took_to_fail():
    def store_error(rank: int, after: float) -> str:  # tests/ranks/store.py's lines
        return (f"STORE-ERROR rank={rank} after={after:.2f}: rank 0, the store's server, failed\n"
                f"OK rank={rank} mode=rank0-dies\n")

    ok = judged("checks", "flat", "store", 3, "0", store_error(1, 0.0) + store_error(2, 0.01))
    assert (ok.verdict, ok.lags) == ("ok", [0.0, 0.01])
    assert judged("checks", "flat", "store", 3, "0", store_error(1, 0.0) + store_error(2, 30.0)).verdict == "late"
    assert judged("checks", "flat", "store", 3, "0", store_error(1, 0.0) + "OK rank=2 mode=rank0-dies\n"
                  ).verdict == "wrong"


def test_the_training_loops_failures_still_count_their_uneven_stops_and_deaths_in_the_shrink():
    # tests/ranks/ft_training.py's lines: the PeerFailure of an operation, then of the shrink.
    output = ("DIED rank=1 at=100.000000\n"
              "FAILED rank=0 step=5 at=100.100000 in=op uneven={2: 5}\n"
              "FAILED rank=2 step=5 at=100.200000 in=op uneven={}\n"
              "DIED rank=2 at=100.300000\n"
              "FAILED rank=0 step=5 at=100.400000 in=shrink uneven=?\n"
              "OK rank=0 diff=1e-08\n")
    outcome = judged("shrink", "flat", "shrink", 3, "1,2", output)
    assert (outcome.verdict, outcome.lags, outcome.uneven, outcome.in_shrink) == ("ok", [0.1, 0.2, 0.1], 1, 1)
    assert outcome.diff == 1e-08


@pytest.mark.parametrize("moment, victims", [("exit", "1"), ("store", "0")])
def test_a_real_check_is_read_as_its_rank_program_prints_it(moment, victims):
    outcome, run = stress.run_once("flat", moment, 3, victims, load=False, seed=0, mode="checks")
    if not (ulfm_here() and torch_release() >= (2, 14)):
        # hpccomm-run --ft refuses (tests/test_fault_tolerance.py asserts how): nothing recovered.
        assert outcome.verdict == "wrong" and not outcome.lags, run.output[-4000:]
        return
    # Both survivors learnt of the death; how soon is the benchmark's verdict, "late" past 5 s, not asserted here.
    assert outcome.verdict in ("ok", "late") and len(outcome.lags) == 2, run.output[-4000:]
    assert all(lag >= 0 for lag in outcome.lags), outcome.lags
    print(f"{moment}: lags {outcome.lags} s, {outcome.wall_s} s")
