"""Fault-tolerant mode (hpccomm/fault_tolerance/): the survivors of a rank's death agree, shrink and go on.

Where the MPI under test has ULFM (Open MPI 5) and hpccomm is a torch Backend
(2.14 and later), ranks SIGKILL themselves between two all_reduces and in the
middle of one, at 3 and 4 ranks, one or two at once, or one while the
survivors agree on another, and every survivor must get the same PeerFailure
naming exactly the dead (its lag after the death is printed, not bounded:
benchmarks/ft_stress.py bounds it, these deaths in its mode ``checks``), shrink, and run collectives, new groups, a
DeviceMesh and DDP on the survivors' group, with hpccomm's identity and topology renumbered
(tests/ranks/fault_tolerance.py), the failed collective on flat MPI, on the
node's shared-memory engine, or hierarchical on two fake nodes; survivors
that exit instead must end the job cleanly; examples/train_ft.py recovers
from a death mid-backward. A training loop that redoes its failed step
(tests/ranks/ft_training.py; benchmarks/ft_stress.py runs it at every moment,
path and load) must end with every step run once and exact values: issue 32's
hang (survivors that redid different steps), an operation completed on some
survivors only (completed on the others from a kept result), a death inside
``dist.shrink_group`` (a second shrink), a death in DDP's backward. A dead
rank 0, which serves the job's store, makes the next store operation fail at
once, naming it.
Elsewhere ``hpccomm-run --ft`` and
``HPCCOMM_FT=1`` must refuse, naming what is missing: each environment
asserts what it should do.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import mpi_library
import pytest
import torch
from hpccomm_run import fault_tolerance_settings
from launch import HIER_EVERYWHERE, HPCCOMM_RUN, RankRun, check_failed_fast, run_ranks
from nodes import run_on_nodes


def torch_release() -> tuple[int, int]:
    return tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


def ulfm_here() -> bool:
    """Whether the MPI under test has the fault tolerance hpccomm uses (Open MPI 5's ULFM)."""
    return mpi_library.family() == "openmpi" and int(mpi_library.release().split(".")[0]) >= 5


def run_ft_on_nodes(per_node: list[int], script: str, *args: str, env: dict[str, str], **options) -> RankRun:
    """:func:`nodes.run_on_nodes` in fault-tolerant mode: ``HPCCOMM_FT=1``, and ``--with-ft ulfm`` where MPI has it."""
    ulfm = ["--with-ft", "ulfm"] if ulfm_here() else []
    return run_on_nodes(per_node, script, *args, env={**env, "HPCCOMM_FT": "1"}, launcher_options=ulfm, **options)


#: Fault-tolerant stops (and goodbyes) over a tree from 2 ranks, not at hpccomm's default of 64.
STOPS_OVER_TREE = {"HPCCOMM_GOODBYE_TREE_FROM": "2"}

#: The node's shared-memory engine for every size (64 MiB all_reduces take it anyway).
SHM_EVERYWHERE = {"HPCCOMM_SHM_MIN_BYTES": "1"}


@pytest.mark.parametrize(
    "nprocs, when, victims, env, path",
    [
        (3, "between", "1", {"HPCCOMM_ALGO": "flat"}, "flat"),
        (3, "mid-async", "1", {}, "node"),
        (4, "between", "1,2", SHM_EVERYWHERE, "node"),
        (4, "mid-async", "2", {"HPCCOMM_ALGO": "flat"}, "flat"),
        (4, "during-agreement", "1,2", {}, "flat"),
        (3, "exit", "1", {}, "flat"),
        # The stops over a tree of the group's ranks (hpccomm/fault_tolerance/stop_points.py): rank 1, rank 5's
        # only neighbour, dies as the last stop reaches it, while rank 0 is in the shrink; rank 5 must get it
        # from rank 0's relaying thread.
        (6, "relay-dies", "1,2", {"HPCCOMM_ALGO": "flat", **STOPS_OVER_TREE}, "flat"),
    ],
)
def test_the_survivors_agree_on_the_dead_shrink_and_go_on(nprocs, when, victims, env, path):
    run = run_ranks(nprocs, "fault_tolerance.py", when, victims, env=env, launcher=[*HPCCOMM_RUN, "--ft"], limit_s=120)
    if not refused(run):
        check_survivors(run, range(nprocs), victims, path)
        # Each survivor's stops went over the tree where it was asked for, and each to every rank otherwise.
        tree_from = int({**os.environ, **env}.get("HPCCOMM_GOODBYE_TREE_FROM", "64"))
        over_tree = "1" if 0 < tree_from <= nprocs else "0"
        trees = re.findall(r"STOPS rank=\d+ tree=(\d)", run.output)
        assert trees == [over_tree] * (nprocs - len(victims.split(","))), run.output[-4000:]
        if when == "relay-dies":
            assert re.search(r"STOPS rank=0 .* relayed=[1-9]", run.output), run.output[-4000:]


def test_a_dead_rank_0_is_a_clear_error_at_the_next_store_operation():
    # rank 0 serves the job's store (hpccomm/store.py); once it is dead a store operation must fail at once,
    # naming it, not wait for the store's timeout (30 min).
    run = run_ranks(3, "store.py", "rank0-dies", launcher=[*HPCCOMM_RUN, "--ft"], limit_s=120)
    if refused(run):
        return
    errors = run.lines("STORE-ERROR")
    assert len(errors) == 2 and len(run.lines("OK rank=")) == 2, run.output[-4000:]
    # What makes it at once is what the survivors know (rank 0 is in the failed set), which the error names;
    # how long it took is printed (benchmarks/ft_stress.py --modes checks bounds it at 5 s): a store that waited
    # for its timeout would outlive the job's limit.
    print("the store's error came after (s):", [re.search(r"after=([0-9.]+)", line)[1] for line in errors])


@pytest.mark.parametrize("when, victims", [("between", "3"), ("mid-async", "2")])
def test_hierarchical_collectives_on_two_nodes_survive_a_death(when, victims):
    # 2 fake nodes of 2 ranks, every collective hierarchical; rank 3 is n2's second rank, rank 2 its leader.
    run = run_ft_on_nodes([2, 2], "fault_tolerance.py", when, victims, env=HIER_EVERYWHERE, limit_s=120)
    if not refused(run):
        # Across fake nodes the death's notice reaches the survivors through Open MPI's daemons, and all of them
        # learn it at the same moment. In CI (step 1, 2 cores) that moment came 15.3 s and 9.0 s after the death
        # in two runs (the second on 2026-12-05), 0.3 s or less in the others: Open MPI's latency.
        check_survivors(run, range(4), victims, "hier")
        assert run.leftovers == {"n1": [], "n2": []}, run.leftovers


@pytest.mark.parametrize(
    "when, nprocs, victims, env, spares",
    [
        # Issue 32's hang: 7 of 26 runs under load had the survivors redo different steps.
        ("before", 4, "2", {}, 0),
        ("uneven", 4, "1", {"HPCCOMM_ALGO": "flat"}, 0),
        # The same over the tree of stops: the survivors learn the uneven stops from their neighbours.
        ("uneven", 4, "1", {"HPCCOMM_ALGO": "flat", **STOPS_OVER_TREE}, 0),
        # Every result larger than the copies' limit: the kept result is the tensor itself, unchanged since.
        ("uneven", 4, "1", {"HPCCOMM_ALGO": "flat", "HPCCOMM_FT_KEEP_BYTES": "0"}, 0),
        ("shrink", 4, "1,2", {"HPCCOMM_ALGO": "flat"}, 0),
        ("backward", 3, "1", SHM_EVERYWHERE, 0),
        # With two spares: rank 1 dies before its all_reduce (as above), rank 2 inside the repaired group's
        # build; the survivors and the first replacement go back to the spares, and the second takes rank 2.
        # On the node's shared memory: the build that failed must not leave its segment's file.
        ("shrink", 4, "1,2", {}, 2),
    ],
)
def test_a_training_loop_redoes_the_failed_step_and_trains_on(when, nprocs, victims, env, spares):
    # tests/ranks/ft_training.py (benchmarks/ft_stress.py runs it at every moment, path and load): 30 steps,
    # the victims die at step 5, the survivors shrink (or, with spares, repair), redo the step and check every
    # value and rank.
    run = run_ranks(nprocs, "ft_training.py", when, victims, "--spares", str(spares), env=env,
                    launcher=[*HPCCOMM_RUN, "--ft", "--spares", str(spares)], limit_s=120)
    if not refused(run):
        check_training(run, when, nprocs, victims, spares)


def test_a_death_as_the_repaired_world_is_learnt_across_nodes_sends_all_back_to_the_spares():
    # Two fake nodes, ranks 0-1 on n1, ranks 2-3 and two spares on n2, every collective hierarchical: rank 1 dies
    # before its all_reduce, rank 2 as the repaired world's nodes are learnt, the replacement's first step as it
    # joins (ft_training.py join). Survivors and replacement go back to the spares, and the second spare takes
    # rank 2. Two failures were seen here: the replacement raised an MPI error (and the job hung), and Open MPI
    # 5.0.11's coll/han crashed survivors in the new communicator's first collective (SIGSEGV).
    env = {**HIER_EVERYWHERE, **{setting.name: setting.value for setting in fault_tolerance_settings(2)}}
    run = run_ft_on_nodes([2, 4], "ft_training.py", "join", "1,2", "--spares", "2", env=env, limit_s=120)
    if not refused(run):
        check_training(run, "join", 4, "1,2", 2)


def check_training(run: RankRun, when: str, nprocs: int, victims: str, spares: int) -> None:
    """A training loop's run ended with every step run once, every survivor (and replacement) right, in time."""
    assert not run.timed_out and run.returncode == 0, run.output[-6000:]
    dead = victims.split(",")
    survivors = {str(rank) for rank in range(nprocs) if str(rank) not in dead or spares}
    if spares:  # every dead rank's number was taken by a spare, which took over the state
        assert sorted(re.findall(r"^REPLACED rank=(\d+)", run.output, re.MULTILINE)) == sorted(dead), \
            run.output[-4000:]
    assert set(re.findall(r"^OK rank=(\d+)", run.output, re.MULTILINE)) == survivors, run.output[-4000:]
    failures = re.findall(r"^FAILED rank=\d+ step=\d+ at=([\d.]+) in=(\w+) uneven=(.*)$", run.output, re.MULTILINE)
    died = sorted(float(at) for at in re.findall(r"^DIED rank=\d+ at=([\d.]+)", run.output, re.MULTILINE))
    assert len(died) == len(dead) and failures, run.output[-4000:]
    # Each failure came after a death (its lag printed: see check_survivors).
    assert all(died[0] <= float(at) for at, _, _ in failures), run.output[-4000:]
    print("caught a death after (s):", [round(float(at) - max(d for d in died if d <= float(at)), 3)
                                        for at, _, _ in failures])
    assert all(uneven in ("{}", "?") for _, _, uneven in failures), run.output[-4000:]  # all stopped at one op
    if when == "shrink" and not spares:
        # The second victim died while the group was being shrunk: the survivors shrank again.
        assert any(where == "shrink" for _, where, _ in failures), run.output[-4000:]


def refused(run: RankRun) -> bool:
    """Where this environment cannot keep a job going (no ULFM, or torch <= 2.13): assert the refusal.

    ``hpccomm-run --ft`` refuses an MPI without ULFM before it starts anything;
    ``HPCCOMM_FT=1`` refuses at ``init_process_group``. Each message names
    what is missing. Returns False where fault-tolerant mode can run.
    """
    if ulfm_here() and torch_release() >= (2, 14):
        return False
    assert not run.timed_out and run.returncode != 0, run.output[-4000:]
    if not ulfm_here():
        assert ("hpccomm-run --ft:" in run.output and "ULFM" in run.output) or "HPCCOMM_FT=1" in run.output, \
            run.output[-4000:]
    else:
        assert "HPCCOMM_FT=1 needs torch >= 2.14" in run.output, run.output[-4000:]
    assert "FAILED rank=" not in run.output and "OK rank=" not in run.output, run.output[-4000:]
    return True


def check_survivors(run: RankRun, ranks: range, victims: str, path: str) -> None:
    """Every survivor caught the PeerFailure (its collective on ``path``), shrank and passed its checks.

    How soon after the last death each caught it is printed, not bounded: a speed target, which
    benchmarks/ft_stress.py holds (5 s, issue 32's bound; it exits 1 past it), for tests/ranks/ft_training.py's
    deaths and, in its mode ``checks``, for these. A death never noticed still fails here, through the job's
    limit, and the PeerFailure names exactly the dead (tests/ranks/fault_tolerance.py).
    """
    assert not run.timed_out and run.returncode == 0, run.output[-6000:]
    assert "UNEXPECTED" not in run.output, run.output[-4000:]
    dead = [int(rank) for rank in victims.split(",")]
    survivors = {str(rank) for rank in ranks if rank not in dead}
    assert set(re.findall(r"FAILED rank=(\d+)", run.output)) == survivors, run.output[-4000:]
    died = [float(at) for at in re.findall(r"DIED rank=\d+ at=([\d.]+)", run.output)]
    assert len(died) == len(dead), run.output[-4000:]
    # Timed from the death, not from the survivors' call: beside a CPU-bound process a victim died 9-22 s
    # late. Measured on 2 cores: quiet, 28 runs of these cases, at most 0.31 s; beside a CPU-bound process,
    # 57 runs, over 5 s three times (the agreement, MPI_Comm_shrink, took 10.1 s and 113.5 s; one job hung
    # after it): issue 32.
    caught = re.findall(r"FAILED rank=(\d+) took=\S+ at=([\d.]+)", run.output)
    lags = {rank: float(at) - max(died) for rank, at in caught}
    assert len(lags) == len(survivors), run.output[-4000:]
    print(f"caught the death after (s): {lags}")
    assert set(re.findall(r"OK rank=(\d+)", run.output)) == survivors, run.output[-4000:]
    assert set(re.findall(r"PATH rank=\d+ (\w+)", run.output)) == {path}, run.output[-4000:]


def test_training_state_hands_the_ranks_behind_the_state_of_the_rank_ahead():
    # hpccomm.TrainingState needs no fault-tolerant mode: it is collectives on the group it is given.
    run = run_ranks(3, "training_state.py", limit_s=120)
    assert not run.timed_out and run.returncode == 0, run.output[-4000:]
    assert set(re.findall(r"OK rank=(\d+)", run.output)) == {"0", "1", "2"}, run.output[-4000:]


def test_ft_mode_refuses_at_init_where_the_job_cannot_survive_a_death():
    # HPCCOMM_FT=1 under the plain launcher: Open MPI 5 started without --with-ft ulfm, or an MPI
    # without ULFM, or torch 2.13; every case names HPCCOMM_FT=1 and what is missing.
    run = run_ranks(2, "fault_tolerance.py", "between", "1", env={"HPCCOMM_FT": "1"})
    assert not run.timed_out and run.returncode != 0, run.output[-4000:]
    assert "HPCCOMM_FT=1" in run.output, run.output[-4000:]
    assert "FAILED rank=" not in run.output and "OK rank=" not in run.output, run.output[-4000:]


@pytest.mark.parametrize("layout", ["one-node", "two-nodes"])
def test_every_rank_raising_at_once_ends_the_job_by_its_exit_not_mpi_abort(layout):
    """An uncaught exception ends a fault-tolerant job by the rank's non-zero exit; MPI_Abort is not called.

    Under ``mpirun --with-ft ulfm`` (Open MPI 5.0.11), with every rank calling MPI_Abort at once: on one node
    prterun deadlocked after the ranks were gone in 5 jobs of 30 (2 and 4 ranks; one more exited 0), a chance
    race, so the runs assert the cause (no rank calls MPI_Abort) besides a fast, non-zero end; on two fake
    nodes every such job exited 0 (10 of 10).
    """
    for _ in range(2 if layout == "one-node" else 1):
        if layout == "one-node":
            run = run_ranks(4, "failures.py", "raise-all", launcher=[*HPCCOMM_RUN, "--ft"], limit_s=60)
        else:
            run = run_ft_on_nodes([2, 2], "failures.py", "raise-all", env={}, limit_s=60)
        if refused(run):
            return
        check_failed_fast(run, "raise-all", ["fails on purpose", "aborting the job"])
        assert "MPI_ABORT rank=" not in run.output, run.output[-4000:]


def test_hpccomm_run_ft_starts_open_mpi_with_ulfm():
    proc = subprocess.run([*HPCCOMM_RUN, "--ft", "--dry-run", "-n", "2", sys.executable, "x.py"],
                          capture_output=True, text=True, timeout=60)
    if not ulfm_here():
        assert proc.returncode != 0 and "ULFM" in proc.stderr, proc.stdout + proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    assert "--with-ft ulfm" in proc.stdout and "export HPCCOMM_FT=1" in proc.stdout, proc.stdout
    # Open MPI's coll/han is left out (it crashed survivors across nodes: the test below); hpccomm leaves it out
    # in-process too, where the ranks are started without hpccomm-run.
    assert "export OMPI_MCA_coll='^han'" in proc.stdout, proc.stdout
    # Spares are processes beyond the ranks asked for, and only in fault-tolerant mode.
    spares = subprocess.run([*HPCCOMM_RUN, "--ft", "--spares", "2", "--dry-run", "-n", "3", sys.executable, "x.py"],
                            capture_output=True, text=True, timeout=60)
    assert spares.returncode == 0 and "export HPCCOMM_FT_SPARES=2" in spares.stdout, spares.stdout + spares.stderr
    assert " -n 5 " in spares.stdout, spares.stdout
    alone = subprocess.run([*HPCCOMM_RUN, "--spares", "1", "--dry-run", "-n", "3", sys.executable, "x.py"],
                           capture_output=True, text=True, timeout=60)
    assert alone.returncode != 0 and "--ft" in alone.stderr, alone.stdout + alone.stderr


@pytest.mark.parametrize("spares", [0, 2])
def test_the_example_recovers_from_a_death_in_the_middle_of_a_backward_pass(spares):
    # One run of examples/train_ft.py (benchmarks/ft_recovery.py runs it ten times, with other seeds):
    # seed 7 kills rank 2 at step 5 of 20 with DDP's first gradient bucket in flight. Without spares the
    # survivors shrink to 3; with two, one spare takes rank 2's place (its shard, its number), and the
    # other, never needed, leaves at the end with the job.
    example = Path(__file__).resolve().parent.parent / "examples" / "train_ft.py"
    extra = ["--spares", str(spares)] if spares else []
    run = run_ranks(4, str(example), "--steps", "20", "--seed", "7", *extra,
                    launcher=[*HPCCOMM_RUN, "--ft", *extra], limit_s=120)
    if refused(run):
        return
    assert not run.timed_out and run.returncode == 0, run.output[-6000:]
    result = json.loads(re.search(r"^RESULT (.*)$", run.output, re.MULTILINE).group(1))
    assert result["failed"] == [result["victim"]] and result["world_after"] == (4 if spares else 3), result
    assert result["ok"] and result["max_diff"] <= 1e-4, result
    if spares:
        assert result["replaced"] == 1, result
        # The replacement took the dead rank's number: four ranks, each once, recovered at full size.
        assert sorted(re.findall(r"RECOVERED rank=(\d+)/4", run.output)) == ["0", "1", "2", "3"], run.output[-6000:]


def test_the_bench_times_the_ranks_alone_while_a_spare_waits(tmp_path):
    # hpccomm-bench's raw-MPI contender and its own coordination once used MPI_COMM_WORLD, which holds the spares:
    # under --spares the raw all_reduce waited for a spare that never calls it, and the job hung.
    result = tmp_path / "r.json"
    run = run_ranks(2, "bench.py", "all_reduce", "-b", "4", "-e", "1K", "-f", "256", "-n", "4", "-w", "1",
                    "--no-progress", "--compare", "mpi4py", "--json", str(result),
                    launcher=[*HPCCOMM_RUN, "--ft", "--spares", "1"], limit_s=120)
    if refused(run):
        return
    assert not run.timed_out and run.returncode == 0, run.output[-6000:]
    record = json.loads(result.read_text())
    assert record["environment"]["world_size"] == 2, record["environment"]
    rows = record["rows"]
    assert {(row["contender"], row["bytes"]) for row in rows} == {(who, size) for who in ("hpccomm", "mpi4py")
                                                                 for size in (4, 1024)}, rows
    assert all(row["wrong"] == 0 and row["time_us"] > 0 for row in rows), rows


def test_over_the_goodbye_tree_a_record_goes_round_a_neighbour_that_died_before_passing_it_on():
    # Goodbyes over the tree at 6 ranks (HPCCOMM_GOODBYE_TREE_FROM=2): rank 5's only tree neighbour, rank 1, dies as
    # it takes rank 5's record in. Rank 5 lingers at exit until every rank has left or died; seeing rank 1 dead, it
    # sends its record to rank 1's other neighbour (rank 0), and the ranks waiting for rank 5 learn that it left.
    run = run_ranks(6, "failures.py", "relay-dead", env={"HPCCOMM_GOODBYE_TREE_FROM": "2"},
                    launcher=[*HPCCOMM_RUN, "--ft"], limit_s=120)
    if refused(run):
        return
    assert not run.timed_out, run.output[-6000:]
    trees = {int(line.split("rank=")[1].split()[0]): line.split("neighbours=")[1] for line in run.lines("TREE")}
    assert trees[5] == "[1]" and trees[1] == "[0, 5]", trees
    assert len(run.lines("DIED")) == 1, run.output[-4000:]
    gone = {int(line.split("rank=")[1].split()[0]): line for line in run.lines("GONE")}
    assert sorted(gone) == [0, 2, 3, 4], run.output[-4000:]
    for line in gone.values():
        assert "rank(s) 5 left the job without taking part" in line, line
    assert sorted(int(line.split("rank=")[1].split()[0]) for line in run.lines("EXITED")) == [0, 2, 3, 4, 5]
