"""Fault-tolerant mode's bookkeeping of each operation, in one process: the results kept
(hpccomm/fault_tolerance/kept_results.py) and the wrapper that numbers, keeps and watches
(hpccomm/fault_tolerance/transport.py), around a transport that needs no MPI.

The same logic across real deaths: tests/test_fault_tolerance.py (the "uneven" training cases hand a kept
result to the survivors whose copy failed, copied and held by reference).
"""

import pytest
import torch
from hpccomm.fault_tolerance.agreement import Recovery
from hpccomm.fault_tolerance.errors import FailureSeen
from hpccomm.fault_tolerance.kept_results import KEPT_OPERATIONS, KeptResults, fill, shared_outputs
from hpccomm.fault_tolerance.transport import _POLLS_PER_WATCH, FaultTolerantTransport

pytestmark = pytest.mark.one_environment  # hpccomm's own logic, no MPI: once in CI


def test_the_outputs_every_rank_shares_are_the_first_argument_on_the_cpu_only():
    a, b = torch.ones(2), torch.zeros(3)
    assert shared_outputs("allreduce", ([a, b], "sum")) == [a, b]
    assert shared_outputs("broadcast", (a, 0)) == [a]
    assert shared_outputs("allgather", ((a, b), torch.ones(2))) == [a, b]
    assert shared_outputs("allgather_into", (a, b)) == [a]
    assert shared_outputs("barrier", ()) == []
    # Each rank's own result differs: nothing to hand another survivor.
    for op, args in [("reduce", (a, 0, "sum")), ("reduce_scatter", (a, [a, b], "sum")), ("send", (a, 1))]:
        assert shared_outputs(op, args) is None
    assert shared_outputs("allreduce", ([a, torch.ones(1, device="meta")], "sum")) is None


def test_a_small_result_is_copied_and_survives_the_tensor_changing():
    kept = KeptResults(max_bytes=64)
    one = torch.arange(4, dtype=torch.float32)
    kept.keep(7, [one])
    one.fill_(-1)
    assert kept.numbers() == [7]
    target = torch.zeros(4)
    fill([target], kept.payload(7))
    assert target.tolist() == [0.0, 1.0, 2.0, 3.0]
    # Several tensors, one of them a strided view: copied in order, element by element.
    grid = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    pair = [torch.tensor([5, 6], dtype=torch.int16), grid.t()]
    kept.keep(8, pair)
    grid.zero_()
    targets = [torch.zeros(2, dtype=torch.int16), torch.zeros(3, 2, dtype=torch.int64)]
    fill(targets, kept.payload(8))
    assert targets[0].tolist() == [5, 6] and targets[1].tolist() == [[0, 3], [1, 4], [2, 5]]


def test_a_large_result_is_held_while_unchanged_and_dropped_once_changed_or_reused():
    kept = KeptResults(max_bytes=8)
    big, other = torch.arange(4, dtype=torch.float32), torch.ones(8)
    kept.keep(1, [big])
    kept.keep(2, [other])
    assert kept.numbers() == [1, 2] and len(kept.payload(1)[0]) == big.nbytes
    big.add_(1)  # changed in place: its version counter moves on
    assert kept.numbers() == [2] and kept.payload(1) is None
    kept.posting(([other], "sum"))  # a later operation writes into its memory, which no counter sees
    assert kept.numbers() == [] and kept.payload(2) is None
    # A non-contiguous large result is held too, and its payload is its elements in order.
    grid = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    kept.keep(3, [grid.t()])
    target = torch.zeros(3, 2)
    fill([target], kept.payload(3))
    assert target.tolist() == grid.t().tolist()


def test_only_the_newest_operations_are_kept():
    kept = KeptResults(max_bytes=64)
    for number in range(KEPT_OPERATIONS + 3):
        kept.keep(number, [torch.full((1,), float(number))])
    assert kept.numbers() == list(range(3, KEPT_OPERATIONS + 3))
    assert kept.payload(2) is None


class _Stops:
    def poll(self) -> None:
        pass

    def lowest(self) -> None:
        return None


class _Comm:
    revoked = False

    def Is_revoked(self) -> bool:
        return self.revoked


class _Request:
    """Completes at its ``polls``-th test."""

    def __init__(self, polls: int) -> None:
        self.left = polls

    def test(self) -> bool:
        self.left -= 1
        return self.left <= 0

    def finish(self) -> None:
        pass


class _Inner:
    def __init__(self, polls: int) -> None:
        self.polls = polls

    def allreduce(self, tensors, reduction):
        return _Request(self.polls)

    def communicators(self):
        return []


def _wrapped(polls: int) -> tuple[FaultTolerantTransport, Recovery, _Comm]:
    comm = _Comm()
    recovery = Recovery(comm, [], {}, lambda: "group test", _Stops())
    return FaultTolerantTransport(_Inner(polls), recovery), recovery, comm


def test_each_collective_is_numbered_and_its_result_kept_once_complete():
    transport, recovery, _ = _wrapped(polls=3)
    for step in range(3):
        tensor = torch.full((2,), float(step))
        pending = transport.allreduce([tensor], "sum")
        assert recovery.kept.numbers() == list(range(step))  # not before it completes
        while not pending.test():
            pass
        pending.finish()
        assert recovery.kept.numbers() == list(range(step + 1))
    assert recovery._first_pending() == 3  # none pending: the next number


def test_a_waiting_operation_looks_for_failures_it_cannot_see_at_its_pace(monkeypatch):
    transport, recovery, comm = _wrapped(polls=10**6)
    looks = []
    monkeypatch.setattr(recovery, "watch", lambda: looks.append(1))
    pending = transport.allreduce([torch.ones(1)], "sum")
    for _ in range(5 * _POLLS_PER_WATCH):
        assert not pending.test()
    assert len(looks) == 5
    # And what a look finds ends the operation with its failure (which the agreement, left out here, would turn
    # into the group's PeerFailure), once the polls come to it.
    monkeypatch.undo()
    monkeypatch.setattr(recovery, "failure", lambda error, op: error)
    comm.revoked = True
    recovery._next_watch = 0.0
    pending = transport.allreduce([torch.ones(1)], "sum")
    polls = 1
    while not pending.test():
        polls += 1
    assert polls == _POLLS_PER_WATCH
    with pytest.raises(FailureSeen, match="revoked"):
        pending.finish()
