"""A UCC team whose creation a peer stops finishing, past the out-of-band exchange, gives up at its timeout.

The last rank stops inside its out-of-band test callback right after its allgather has completed, as a rank
that hangs there would: UCC's own set-up of the team (its team layers, the team's id) then waits for it on the
other ranks, past the exchange whose own deadline no longer applies. Rank 0 (which waits for it at every size
tried, 2 and 3 ranks) must raise UCCError naming the timeout; the last rank is let go by rank 0's message once
rank 0 has given up (without a deadline past the exchange, rank 0 waited for it for good: rankcheck names the
hang). Every other rank either ends its creation (UCC's set-up needed nothing more of the stopped rank there)
or gives up the same way; none waits past its timeout. The teams stay half made in UCC (kept, as hpccomm
keeps them), so this rank script ends without tearing UCC down.
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import sys

from hpccomm import ucc

ucc.load()  # before MPI starts: UCC's UCX, not the MPI wheel's, becomes the process's

from mpi4py import MPI  # noqa: E402
from hpccomm.ucc import oob  # noqa: E402
from rankcheck import check, expect_error, run_all  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
TIMEOUT_S = 2.0
LET_GO = 7  # the tag of rank 0's message to the stopped rank
lib = ucc.load().lib
context = ucc.Context(WORLD, 60.0)


@check
def a_team_whose_creation_a_peer_stops_finishing_past_the_exchange_times_out() -> None:
    stopped = []
    real_test = oob.OutOfBand.test

    def test(self: oob.OutOfBand, request_id: int) -> int:
        status = real_test(self, request_id)
        if RANK == SIZE - 1 and status == lib.UCC_OK and not stopped:
            stopped.append(request_id)
            WORLD.Recv([bytearray(1), MPI.BYTE], source=0, tag=LET_GO)  # until rank 0 has given up
        return status

    timed_out = f"its creation did not end within {TIMEOUT_S:g} s"
    oob.OutOfBand.test = test
    try:
        if RANK == 0:
            error = expect_error(ucc.UCCError, timed_out, lambda: ucc.Team(context, WORLD.Dup(), TIMEOUT_S))
            assert error.status == lib.UCC_ERR_TIMED_OUT, error.status
        else:
            try:
                ucc.Team(context, WORLD.Dup(), TIMEOUT_S)
            except ucc.UCCError as exc:
                assert timed_out in str(exc) and exc.status == lib.UCC_ERR_TIMED_OUT, exc
            assert RANK < SIZE - 1 or len(stopped) == 1, stopped
    finally:
        oob.OutOfBand.test = real_test
        if RANK == 0:
            WORLD.Send([bytearray(1), MPI.BYTE], dest=SIZE - 1, tag=LET_GO)


run_all(RANK, sys.argv[1] if len(sys.argv) > 1 else None)
