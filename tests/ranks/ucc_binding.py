"""The UCC binding on its own (hpccomm.ucc, no torch.distributed): context, teams, all-reduce, errors.

Each rank bootstraps UCC over MPI, all-reduces on a world team and on a team
of the even ranks (same context), checks that UCC's refusals arrive as
UCCError with UCC's status string, then tears down in UCC's order.
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import sys

from hpccomm import ucc

ucc.load()  # before MPI starts: UCC's UCX, not the MPI wheel's, becomes the process's

import numpy as np
from mpi4py import MPI
from hpccomm.ucc.oob import OutOfBand
from rankcheck import check, expect_error, run_all, say

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
TIMEOUT_S = 60.0
binding = ucc.load()
ffi, lib = binding.ffi, binding.lib
context = ucc.Context(WORLD, TIMEOUT_S)
team = ucc.Team(context, WORLD, TIMEOUT_S)


def allreduce_args(array: np.ndarray, op: int = lib.UCC_OP_SUM) -> object:
    args = ffi.new("ucc_coll_args_t *")
    args.mask = lib.UCC_COLL_ARGS_FIELD_FLAGS
    args.flags = lib.UCC_COLL_ARGS_FLAG_IN_PLACE
    args.coll_type = lib.UCC_COLL_TYPE_ALLREDUCE
    args.dst.info.buffer = ffi.cast("void *", array.ctypes.data)
    args.dst.info.count = array.size
    args.dst.info.datatype = {np.float32: lib.UCC_DT_FLOAT32, np.int64: lib.UCC_DT_INT64}[array.dtype.type]
    args.dst.info.mem_type = lib.UCC_MEMORY_TYPE_HOST
    args.op = op
    return args


def wait(request: ucc.Request) -> None:
    while not request.test():
        pass
    request.result("allreduce")


@check
def status_reports_version_and_library() -> None:
    found = ucc.status()
    assert found.available and found.reason is None, found
    assert found.version and found.version[0].isdigit(), found
    assert found.library and "libucc.so" in found.library, found
    assert found.ucx and "libucp.so" in found.ucx, found


@check
def allreduce_on_the_world_team() -> None:
    for count in (1, 1000, 1 << 18):
        data = np.full(count, RANK + 1, dtype=np.float32)
        wait(team.post(allreduce_args(data), keep=data))
        assert np.all(data == SIZE * (SIZE + 1) / 2), (count, data[:4])
    data = np.arange(5, dtype=np.int64) + RANK
    wait(team.post(allreduce_args(data, lib.UCC_OP_MAX), keep=data))
    assert np.array_equal(data, np.arange(5) + SIZE - 1), data
    assert not team.live, "ended requests must leave the team's live set"


@check
def allreduce_on_a_subgroup_team_of_the_same_context() -> None:
    evens = WORLD.Split(RANK % 2, RANK)
    sub = ucc.Team(context, evens, TIMEOUT_S)
    data = np.full(3, RANK, dtype=np.int64)
    wait(sub.post(allreduce_args(data), keep=data))
    assert np.all(data == sum(range(RANK % 2, SIZE, 2))), data
    assert sub.destroy()
    evens.Free()


@check
def an_initialised_request_has_not_ended_until_it_is_posted_and_done() -> None:
    # UCC reports UCC_OPERATION_INITIALIZED (a positive status) for a request not yet posted, as it
    # does after a triggered post until the stream reaches it: "not done", never an end or an error.
    data = np.full(4, RANK + 1, dtype=np.float32)
    request = team.post(allreduce_args(data), keep=data, post=False)
    assert request.status == lib.UCC_OPERATION_INITIALIZED, request.status
    for _ in range(100):
        assert not request.test(), "an initialised, unposted request was taken for ended"
    assert request.status == lib.UCC_OPERATION_INITIALIZED and request in team.live
    expect_error(RuntimeError, "has not ended", lambda: request.result("allreduce"))
    request.post()
    wait(request)
    assert np.all(data == SIZE * (SIZE + 1) / 2), data
    assert request.status == lib.UCC_OK and not team.live


@check
def refusals_are_ucc_errors_with_ucc_status_string() -> None:
    args = allreduce_args(np.zeros(1, dtype=np.float32))
    args.coll_type = 0  # not a collective type
    error = expect_error(ucc.UCCError, "ucc_collective_init/post", lambda: team.post(args))
    assert error.status < 0, error.status
    described = ffi.string(lib.ucc_status_string(error.status)).decode()
    assert described in str(error), (described, str(error))
    assert not team.live, "a refused post leaves nothing posted"


@check
def a_collective_ucc_lacks_is_refused_at_post() -> None:
    if SIZE == 1:
        return  # one rank runs on UCC's tl/self, which has SCATTER
    # tl/ucp has SCATTERV only: a plain SCATTER finds no algorithm.
    data = np.zeros(SIZE, dtype=np.float32)
    args = ffi.new("ucc_coll_args_t *")
    args.coll_type = lib.UCC_COLL_TYPE_SCATTER
    args.root = 0
    args.src.info.buffer = ffi.cast("void *", data.ctypes.data)
    args.src.info.count = SIZE
    args.src.info.datatype = lib.UCC_DT_FLOAT32
    args.dst.info.buffer = ffi.cast("void *", data.ctypes.data)
    args.dst.info.count = 1
    args.dst.info.datatype = lib.UCC_DT_FLOAT32
    error = expect_error(ucc.UCCError, "ucc_collective_init/post", lambda: team.post(args, keep=data))
    assert error.status == lib.UCC_ERR_NOT_SUPPORTED, error.status


@check
def an_allgather_given_up_never_writes_into_ucc_buffers_when_a_late_part_arrives() -> None:
    # A bootstrap allgather that gave up (its deadline, or a departure read wrongly) stays posted in MPI, and
    # UCC frees its buffers. Rank 0 gives up here, marks its buffer as UCC would reuse it, then the others post
    # their parts: MPI completes rank 0's allgather, which must land in memory of hpccomm's own, never UCC's.
    if SIZE == 1:
        return
    out_of_band = OutOfBand(WORLD, timeout_s=0.0 if RANK == 0 else None)
    send, recv = ffi.new("char[]", bytes([RANK + 1]) * 8), ffi.new("char[]", 8 * SIZE)
    if RANK == 0:
        request_id = out_of_band.start(send, recv, 8)
        while (status := out_of_band.test(request_id)) == lib.UCC_INPROGRESS:
            pass
        assert status == lib.UCC_ERR_TIMED_OUT, status
        out_of_band.free(request_id)
        ffi.memmove(recv, b"\xee" * 8 * SIZE, 8 * SIZE)  # reused by UCC
        WORLD.Barrier()  # the others post their parts now
        for _oob, state, _buffers in out_of_band._stuck:
            state[0].Wait()  # MPI completes it, writing the late parts
        assert bytes(ffi.buffer(recv)) == b"\xee" * 8 * SIZE, bytes(ffi.buffer(recv))
    else:
        WORLD.Barrier()
        request_id = out_of_band.start(send, recv, 8)
        while (status := out_of_band.test(request_id)) == lib.UCC_INPROGRESS:
            pass
        assert status == lib.UCC_OK, status
        out_of_band.free(request_id)
        assert bytes(ffi.buffer(recv)) == b"".join(bytes([r + 1]) * 8 for r in range(SIZE)), bytes(ffi.buffer(recv))
    out_of_band.close()


run_all(RANK, sys.argv[1] if len(sys.argv) > 1 else None)
assert team.destroy()
assert context.destroy(TIMEOUT_S)
assert context.library.finalize()
say(f"TORN DOWN rank={RANK}")  # one write: MPICH's hydra joined three print()s on one line
