"""Property-based: random ops, shapes, dtypes, reduce ops and roots through 2 and 3 ranks.

Every call either gives the locally computed result or raises a clear error
on all ranks; it never hangs (the launch has a time limit) and never crashes
the interpreter (the launch must exit 0).
"""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from launch import run_ranks

KINDS = ["all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "gather"]
OPS = ["sum", "product", "min", "max", "avg", "band", "bor", "bxor", "premul"]
N_DTYPES = 12  # tests/ranks/expected.py ALL

# Its result is the same under every torch release and MPI: CI runs it in its first step only (.ci/run).
pytestmark = pytest.mark.one_environment


def op_spec(nprocs: int):
    return st.fixed_dictionaries(
        {
            "kind": st.sampled_from(KINDS),
            "dtype": st.integers(0, N_DTYPES - 1),
            "op": st.sampled_from(OPS),
            "numel": st.integers(0, 9),
            "root": st.integers(-1, nprocs),  # includes invalid roots on both sides
            "seed": st.integers(0, 50),
        }
    )


def check_program(nprocs: int, program: list[dict]) -> None:
    run = run_ranks(nprocs, "fuzz.py", json.dumps(program), limit_s=120)
    assert not run.timed_out, f"hang on program {program}:\n{run.output[-3000:]}"
    assert run.returncode == 0, f"crash or wrong result on program {program}:\n{run.output[-3000:]}"
    outcomes: dict[int, dict[int, str]] = {}
    for line in run.lines("OP"):
        fields = line.split(maxsplit=3)
        rank, i = int(fields[1].split("=")[1]), int(fields[2].split("=")[1])
        outcomes.setdefault(i, {})[rank] = fields[3]
    assert sorted(outcomes) == list(range(len(program))), run.output[-3000:]
    for i, per_rank in outcomes.items():
        assert len(per_rank) == nprocs, f"op {i} ({program[i]}) missing on some ranks: {per_rank}"
        if program[i]["kind"] in ("reduce", "broadcast", "gather") and not 0 <= program[i]["root"] < nprocs:
            assert all(o.startswith("error") for o in per_rank.values()), f"op {program[i]} accepted a bad root"
        assert len(set(per_rank.values())) == 1, f"ranks disagree on op {program[i]}: {per_rank}"


@pytest.mark.parametrize("nprocs", [2, 3])
def test_random_programs(nprocs):
    @settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.lists(op_spec(nprocs), min_size=5, max_size=25))
    def run(program):
        check_program(nprocs, program)

    run()
