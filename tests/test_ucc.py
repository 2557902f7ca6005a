"""UCC: the binding on its own, and what is particular to the UCC transport.

The every-collective checker, subgroups, failures and exit also run on UCC,
through the ``transport`` parameter of their own tests (tests/transports.py).
Everything here needs UCC: skipped, saying why, where hpccomm was built
without it; failed where UCC_HOME is set (tests/transports.py).
"""

import pytest
from launch import assert_all_ranks_ok, run_ranks
from transports import ON_UCC, needs_ucc

pytestmark = needs_ucc


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_binding_on_its_own(nprocs):
    """Context, teams (world and a subgroup), all-reduce and UCC's errors without torch.distributed."""
    run = run_ranks(nprocs, "ucc_binding.py")
    assert_all_ranks_ok(run, nprocs)
    assert len(run.lines("TORN DOWN")) == nprocs, run.output[-4000:]


def test_a_team_whose_creation_a_peer_stops_finishing_gives_up_at_its_timeout():
    """Past the out-of-band exchange too (a rank stopped inside it: ucc_team_stall.py), at 3 ranks."""
    run = run_ranks(3, "ucc_team_stall.py", env={"RANKCHECK_LIMIT_S": "30"})
    assert_all_ranks_ok(run, 3)


@pytest.mark.parametrize("nprocs", [1, 3])
def test_ucc_transport_specifics(nprocs):
    run = run_ranks(nprocs, "ucc_transport.py", env=ON_UCC)
    assert_all_ranks_ok(run, nprocs)
    # The context's teardown barrier ran on every rank (no rank read another's goodbye as leaving it out).
    for gave_up in ("left the job without taking part", "failed to test oob req", "ucc_context_destroy"):
        assert gave_up not in run.output, run.output[-4000:]
