"""Bad input: a clear error naming op and argument, raised before any communication.

Each case is tried on rank 0 only while the other ranks skip it; all ranks
then run a checked all_reduce. Had rank 0 posted anything, that all_reduce
would pair with it and give a wrong sum or hang (and the run times out).
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import sys
from datetime import timedelta

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from hpccomm.groups import front_of
from torch._C._distributed_c10d import AllgatherOptions
from rankcheck import check, expect_error, run_all

dist.init_process_group("hpccomm", timeout=timedelta(seconds=20))
RANK, SIZE = dist.get_rank(), dist.get_world_size()
# hpccomm itself: on torch >= 2.14 torch's ProcessGroup would reject some bad input before hpccomm sees it.
PG = front_of(dist.group.WORLD)


def only_rank0_fails(kind: type[BaseException], fragments: list[str], call) -> None:
    if RANK == 0:
        exc = expect_error(kind, fragments[0], call)
        for fragment in fragments[1:]:
            assert fragment in str(exc), f"message lacks {fragment!r}: {exc}"
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(SIZE))), f"group out of step after a bad call: {t}"


def opts(cls, **fields):
    o = cls()
    for key, value in fields.items():
        setattr(o, key, value)
    return o


@check
def all_gather_list_of_wrong_length() -> None:
    outs = [torch.empty(2) for _ in range(SIZE + 1)]
    only_rank0_fails(ValueError, ["all_gather", "tensor_list", "entries"], lambda: dist.all_gather(outs, torch.ones(2)))


@check
def all_gather_coalesced_lists_that_do_not_match() -> None:
    ins = [torch.ones(1), torch.ones(2)]
    per_rank = lambda: [[torch.empty(1), torch.empty(2)] for _ in range(SIZE)]
    too_few_ranks = per_rank()[:-1]
    call = lambda: dist.all_gather_coalesced(too_few_ranks, ins)
    only_rank0_fails(ValueError, ["all_gather_coalesced", "output_tensor_lists", "entries"], call)
    short = per_rank()
    short[-1] = short[-1][:1]
    call = lambda: dist.all_gather_coalesced(short, ins)
    only_rank0_fails(ValueError, ["all_gather_coalesced", f"output_tensor_lists[{SIZE - 1}]", "one tensor per input"], call)
    wrong_size = per_rank()
    wrong_size[RANK][1] = torch.empty(3)
    call = lambda: dist.all_gather_coalesced(wrong_size, ins)
    only_rank0_fails(ValueError, ["all_gather_coalesced", f"output_tensor_lists[*][1][{RANK}]"], call)


@check
def all_to_all_single_splits_that_do_not_sum() -> None:
    bad = [1] * SIZE
    bad[0] += 1
    call = lambda: dist.all_to_all_single(torch.empty(SIZE), torch.ones(SIZE), input_split_sizes=bad, output_split_sizes=[1] * SIZE)
    only_rank0_fails(ValueError, ["all_to_all_single", "input_split_sizes"], call)


@check
def all_to_all_single_uneven_without_splits() -> None:
    call = lambda: dist.all_to_all_single(torch.empty(SIZE * 2 + 1), torch.ones(SIZE * 2 + 1))
    if SIZE > 1:
        only_rank0_fails(ValueError, ["all_to_all_single", "split"], call)


@check
def output_too_small() -> None:
    call = lambda: dist.all_gather_into_tensor(torch.empty(SIZE * 2 - 1), torch.ones(2))
    only_rank0_fails(ValueError, ["all_gather_into_tensor", "output_tensor"], call)
    call = lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * SIZE + 1))
    only_rank0_fails(ValueError, ["reduce_scatter_tensor", "input"], call)


@check
def invalid_root_and_peer() -> None:
    call = lambda: PG.broadcast([torch.ones(1)], opts(dist.BroadcastOptions, rootRank=SIZE))
    only_rank0_fails(ValueError, ["broadcast", "src"], call)
    call = lambda: PG.reduce([torch.ones(1)], opts(dist.ReduceOptions, rootRank=-1))
    only_rank0_fails(ValueError, ["reduce", "dst"], call)
    only_rank0_fails(ValueError, ["send", "dst"], lambda: PG.send([torch.ones(1)], SIZE, 0))
    only_rank0_fails(ValueError, ["recv", "src"], lambda: PG.recv([torch.ones(1)], SIZE + 3, 0))
    only_rank0_fails(ValueError, ["send", "tag"], lambda: PG.send([torch.ones(1)], 0, -1))


@check
def sparse_tensor_where_only_dense_ones_work() -> None:
    # all_reduce sums sparse COO tensors (tests/ranks/collectives.py); nothing else takes them
    coo = torch.ones(4).to_sparse()
    only_rank0_fails(ValueError, ["broadcast", "sparse_coo"], lambda: PG.broadcast([coo], dist.BroadcastOptions()))
    only_rank0_fails(ValueError, ["all_reduce", "summed only"], lambda: dist.all_reduce(coo, op=dist.ReduceOp.MAX))
    csr = torch.ones(2, 2).to_sparse_csr()
    only_rank0_fails(ValueError, ["all_reduce", "sparse_csr"], lambda: PG.allreduce([csr], dist.AllreduceOptions()))


@check
def device_with_no_route() -> None:
    meta = torch.empty(4, device="meta")
    only_rank0_fails(RuntimeError, ["all_reduce", "no transport", "meta"], lambda: PG.allreduce([meta], dist.AllreduceOptions()))


class Recorder:
    """A transport for meta tensors that records what it is handed and posts nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, torch.Tensor]] = []

    def allreduce(self, tensors, reduction):
        self.calls.append(("all_reduce", tensors[0]))
        return self

    def broadcast(self, tensor, root):
        self.calls.append(("broadcast", tensor))
        return self

    def test(self) -> bool:
        return True

    def finish(self) -> None:
        pass


@check
def device_with_a_route_is_checked_then_found_by_its_device() -> None:
    # The one-tensor ops find a device tensor's transport by its device, kept once seen (front.py's _one).
    recorder = Recorder()
    PG._transports["meta"] = recorder
    try:
        first, second = torch.empty(4, device="meta"), torch.empty(2, device="meta")
        blocking = opts(dist.AllreduceOptions, asyncOp=False)
        PG.allreduce([first], blocking)  # the device not seen yet: checked in full, then kept
        assert PG._by_device == {first.device: recorder}, PG._by_device
        PG.allreduce([second], blocking)
        PG.broadcast([first], opts(dist.BroadcastOptions, asyncOp=False))
        expected = [("all_reduce", 4), ("all_reduce", 2), ("broadcast", 4)]
        assert [(op, t.shape[0]) for op, t in recorder.calls] == expected, recorder.calls
        # A known device does not skip the checks of what is passed.
        call = lambda: PG.allreduce([first, second], blocking)
        only_rank0_fails(ValueError, ["all_reduce", "exactly one"], call)
        call = lambda: PG.broadcast([first], opts(dist.BroadcastOptions, rootRank=SIZE))
        only_rank0_fails(ValueError, ["broadcast", "src"], call)
        assert len(recorder.calls) == 3, recorder.calls
    finally:
        del PG._transports["meta"]
        PG._by_device.clear()  # the other checks meet meta tensors with no route


@check
def reduce_op_that_makes_no_sense() -> None:
    c = torch.ones(2, dtype=torch.complex64)
    call = lambda: PG.allreduce([c], opts(dist.AllreduceOptions, reduceOp=dist.ReduceOp.MIN))
    only_rank0_fails(ValueError, ["all_reduce", "MIN", "complex"], call)
    call = lambda: PG.allreduce([torch.ones(2)], opts(dist.AllreduceOptions, reduceOp=dist.ReduceOp.BXOR))
    only_rank0_fails(ValueError, ["all_reduce", "BXOR", "float32"], call)
    call = lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool), op=dist.ReduceOp.AVG)
    only_rank0_fails(ValueError, ["all_reduce", "AVG", "bool"], call)


@check
def dtype_mismatch_between_output_and_input() -> None:
    call = lambda: PG.all_gather_single(torch.empty(SIZE, dtype=torch.int32), torch.ones(1), AllgatherOptions())
    only_rank0_fails(ValueError, ["all_gather_into_tensor", "dtype"], call)


@check
def more_than_one_tensor_per_process() -> None:
    call = lambda: PG.allreduce([torch.ones(1), torch.ones(1)], dist.AllreduceOptions())
    only_rank0_fails(ValueError, ["all_reduce", "exactly one"], call)


@check
def not_a_tensor() -> None:
    only_rank0_fails(ValueError, ["broadcast", "torch.Tensor"], lambda: PG.broadcast([[1, 2]], dist.BroadcastOptions()))


@check
def coalesced_call_with_a_bad_second_pair_posts_nothing() -> None:
    outs = [torch.empty(SIZE), torch.empty(SIZE * 2 + 1)]
    ins = [torch.ones(1), torch.ones(2)]
    call = lambda: PG.allgather_into_tensor_coalesced(outs, ins, AllgatherOptions())
    only_rank0_fails(ValueError, ["all_gather_into_tensor", "output_tensor"], call)


@check
def gather_list_length() -> None:
    call = lambda: dist.gather(torch.ones(1), [torch.empty(1)] * (SIZE + 1), dst=0)
    only_rank0_fails(ValueError, ["gather", "gather_list"], call)


run_all(RANK, sys.argv[1] if len(sys.argv) > 1 else None)
dist.destroy_process_group()
