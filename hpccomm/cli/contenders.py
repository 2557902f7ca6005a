"""The contenders the bench times: hpccomm and Gloo through torch.distributed, and raw mpi4py.

Each contender turns a :class:`~hpccomm.cli.collectives.Case` into a call
with every argument bound, so that the timed loop pays for the collective and
nothing else. hpccomm and Gloo make the same ``torch.distributed`` calls on
their own process groups; mpi4py makes the equivalent blocking MPI call on
its own duplicate of the world's communicator (:func:`hpccomm.world.members`:
``MPI_COMM_WORLD`` less the spares of fault-tolerant mode) over the same
tensors' memory, as a program using MPI directly would.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .collectives import IN_PLACE, Call, Case, RedOpType

HPCCOMM = "hpccomm"
GLOO = "gloo"
MPI4PY = "mpi4py"
#: Contenders ``--compare`` accepts, in the order their columns appear.
COMPARABLE = (GLOO, MPI4PY)
# torch 2.13 renamed these (the old names warn); both reach the same backend method.
# (Also used by model.py for FSDP's traffic.)
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Unsupported(Exception):
    """The contender cannot run this case (the message says why)."""


class Contender:
    """One library under test.

    Args:
        name: its name in tables and JSON.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def call(self, case: Case) -> tuple[Call, torch.Tensor | None]:
        """A blocking call of ``case`` and where it leaves its result (None: ``case.output``).

        Raises:
            Unsupported: the contender has no such operation.
        """
        raise NotImplementedError


class TorchContender(Contender):
    """A torch.distributed backend, through its process group.

    Args:
        name: the backend's name.
        group: its process group (None: the default group).
    """

    def __init__(self, name: str, group: dist.ProcessGroup | None) -> None:
        super().__init__(name)
        self.group = group

    def call(self, case: Case) -> tuple[Call, torch.Tensor | None]:
        name, group, inp, out = case.collective.name, self.group, case.input, case.output
        op = dist.ReduceOp(case.op) if case.op is not None else None
        if name == "all_reduce":
            return (lambda: dist.all_reduce(out, op=op, group=group)), None
        if name == "all_gather":
            return (lambda: all_gather_single(out, inp, group=group)), None
        if name == "reduce_scatter":
            return (lambda: reduce_scatter_single(out, inp, op=op, group=group)), None
        if name == "all_to_all":
            return (lambda: dist.all_to_all_single(out, inp, group=group)), None
        if name == "broadcast":
            return (lambda: dist.broadcast(out, src=case.root, group=group)), None
        if name == "reduce":
            return (lambda: dist.reduce(out, dst=case.root, op=op, group=group)), None
        if name == "sendrecv":
            peer = case.peer
            return _ping_pong(case, lambda: dist.send(inp, peer, group=group), lambda: dist.recv(out, peer, group=group))
        raise Unsupported(f"no {name}")


class MPIContender(Contender):
    """Raw mpi4py on the same memory, with the blocking call a C program would make.

    Args:
        comm: its communicator (a duplicate of :func:`hpccomm.world.members`).
        MPI: the mpi4py ``MPI`` module.
    """

    def __init__(self, comm: Any, MPI: Any) -> None:
        super().__init__(MPI4PY)
        self.comm = comm
        self.MPI = MPI

    def _bytes(self, tensor: torch.Tensor) -> list[Any]:
        return [self.MPI.buffer.fromaddress(tensor.data_ptr(), tensor.nbytes), self.MPI.BYTE]

    def _typed(self, case: Case, tensor: torch.Tensor) -> list[Any]:
        MPI = self.MPI
        types = {
            torch.float32: MPI.FLOAT,
            torch.float64: MPI.DOUBLE,
            torch.int8: MPI.INT8_T,
            torch.uint8: MPI.UINT8_T,
            torch.int32: MPI.INT32_T,
            torch.int64: MPI.INT64_T,
        }
        if case.dtype not in types:
            raise Unsupported(f"MPI has no usable {str(case.dtype).removeprefix('torch.')} reduction")
        return [MPI.buffer.fromaddress(tensor.data_ptr(), tensor.nbytes), types[case.dtype]]

    def _op(self, case: Case) -> Any:
        MPI = self.MPI
        ops = {RedOpType.SUM: MPI.SUM, RedOpType.PRODUCT: MPI.PROD, RedOpType.MIN: MPI.MIN, RedOpType.MAX: MPI.MAX}
        if case.op not in ops:
            raise Unsupported(f"MPI has no {case.op.name.lower()} reduce op")
        return ops[case.op]

    def call(self, case: Case) -> tuple[Call, torch.Tensor | None]:
        comm, MPI, name = self.comm, self.MPI, case.collective.name
        inp, out, in_place = case.input, case.output, case.placement == IN_PLACE
        if name == "all_reduce":
            buf, op = self._typed(case, out), self._op(case)
            return (lambda: comm.Allreduce(MPI.IN_PLACE, buf, op)), None
        if name == "all_gather":
            recv = self._bytes(out)
            send = MPI.IN_PLACE if in_place else self._bytes(inp)
            return (lambda: comm.Allgather(send, recv)), None
        if name == "reduce_scatter":
            op = self._op(case)
            if in_place:
                # MPI's in-place reduce_scatter leaves this rank's part at the start of the buffer.
                whole = self._typed(case, inp)
                return (lambda: comm.Reduce_scatter_block(MPI.IN_PLACE, whole, op)), inp[: case.chunk]
            send, recv = self._typed(case, inp), self._typed(case, out)
            return (lambda: comm.Reduce_scatter_block(send, recv, op)), None
        if name == "all_to_all":
            send, recv = self._bytes(inp), self._bytes(out)
            return (lambda: comm.Alltoall(send, recv)), None
        if name == "broadcast":
            buf = self._bytes(out)
            return (lambda: comm.Bcast(buf, case.root)), None
        if name == "reduce":
            buf, op = self._typed(case, out), self._op(case)
            if case.rank == case.root:
                return (lambda: comm.Reduce(MPI.IN_PLACE, buf, op, case.root)), None
            return (lambda: comm.Reduce(buf, None, op, case.root)), None
        if name == "sendrecv":
            send, recv, peer = self._bytes(inp), self._bytes(out), case.peer
            return _ping_pong(case, lambda: comm.Send(send, peer), lambda: comm.Recv(recv, peer))
        raise Unsupported(f"no {name}")


def _ping_pong(case: Case, send: Call, recv: Call) -> tuple[Call, None]:
    """A round trip between this rank and its partner (``case.peer``): the even rank sends first.

    Args:
        case: the sendrecv case.
        send: sends ``case.input`` to the partner.
        recv: receives the partner's message into ``case.output``.
    """
    if case.peer < 0:
        return (lambda: None), None
    if case.rank % 2 == 0:

        def round_trip() -> None:
            send()
            recv()

    else:

        def round_trip() -> None:
            recv()
            send()

    return round_trip, None
