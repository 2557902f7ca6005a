"""The MPI transport: host-memory tensors through mpi4py nonblocking calls.

Each operation posts MPI-3 nonblocking calls (``Iallreduce``, ``Ialltoallv``,
...) on the group's own communicator, so the caller can poll with a deadline
and asynchronous work overlaps with compute. Tensors reach MPI as raw
address ranges (``MPI.buffer.fromaddress``) with an explicit datatype: that
costs a fraction of a microsecond, where DLPack costs ~20 us and mangles
bfloat16.

Non-contiguous tensors and list-of-tensor ops go through a contiguous staging
buffer that is copied back once the communication completes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

import torch

from ..world import mpi
from . import Transport
from .local_steps import After, averager, concat, premultiplied, scatter_back, staged, unaliased
from .mpi_types import Reduction, datatype

# Open MPI 5 rejects nonblocking collectives whose count passes 2**31 - 1, so
# element-wise operations are split into calls of at most this many elements.
MAX_ELEMENTS_PER_CALL = 2**30
INT_MAX = 2**31 - 1


class MPIPending:
    """Posted MPI requests plus the local steps to run once they complete.

    Args:
        requests: the posted requests.
        after: steps to run, in order, once all requests completed.
        keep: staging tensors MPI reads or writes; held until completion.
        status: filled by a receive from any source.
    """

    #: The path that serves it, as the profiler names it (:mod:`hpccomm.profiling`).
    path = "mpi"

    __slots__ = ("_requests", "_after", "_keep", "_status")

    def __init__(
        self, requests: list[Any], after: list[Callable[[], None]], keep: tuple[Any, ...] = (), status: Any = None
    ) -> None:
        self._requests = requests
        self._after = after
        self._keep = keep
        self._status = status

    def test(self) -> bool:
        requests = self._requests
        if len(requests) == 1:
            if self._status is not None:
                return requests[0].Test(self._status)
            return requests[0].Test()
        # Each tested on its own (not Request.Testall): a CUDA-aware MPI's deferred calls stand in
        # for requests (hpccomm/transports/mpi_cuda.py). A completed request tests True again.
        return all([request.Test() for request in requests])

    def finish(self) -> None:
        for step in self._after:
            step()
        self._keep = ()

    @property
    def source_rank(self) -> int:
        """The sender's rank, for a receive from any source."""
        return self._status.Get_source() if self._status is not None else -1


class SinglePending:
    """One posted MPI request with nothing to do afterwards: the common small case."""

    #: The path that serves it, as the profiler names it (:mod:`hpccomm.profiling`).
    path = "mpi"
    __slots__ = ("test",)

    def __init__(self, request: Any) -> None:
        self.test = request.Test

    def finish(self) -> None:
        pass


def _buffer(tensor: torch.Tensor) -> tuple[Any, Any]:
    """(buffer, datatype) over a contiguous tensor's memory."""
    return (mpi().buffer.fromaddress(tensor.data_ptr(), tensor.nbytes), datatype(tensor.dtype))


def _vector(tensor: torch.Tensor, counts: Sequence[int]) -> list[Any]:
    """[buffer, counts, displacements, datatype] over a contiguous tensor."""
    displacements = [0, *accumulate(counts)][:-1]
    buf, dtype = _buffer(tensor)
    return [buf, list(counts), displacements, dtype]


def _spans(tensor: torch.Tensor) -> list[tuple[Any, Any]]:
    """(buffer, datatype) pieces of at most MAX_ELEMENTS_PER_CALL elements."""
    numel = tensor.numel()
    if numel <= MAX_ELEMENTS_PER_CALL:
        return [_buffer(tensor)] if numel else []
    flat = tensor.view(-1)
    return [_buffer(flat[i : i + MAX_ELEMENTS_PER_CALL]) for i in range(0, numel, MAX_ELEMENTS_PER_CALL)]


def _check_count(op_name: str, total: int) -> None:
    if total > INT_MAX:
        raise ValueError(
            f"hpccomm {op_name}: {total} elements exceed MPI's 32-bit count limit for this op "
            f"(only all_reduce, broadcast, reduce, send and recv split larger tensors)"
        )


class MPITransport(Transport):
    """Collectives and point-to-point on one MPI communicator.

    Args:
        comm: the group's communicator (owned: freed by :meth:`close`).
        device: where the tensors live (default: host memory); temporaries
            are made there (device memory with a CUDA-aware MPI).
    """

    def __init__(self, comm: Any, device: torch.device | None = None) -> None:
        self._comm = comm
        self._device = device if device is not None else torch.device("cpu")
        self._size = comm.Get_size()
        self._rank = comm.Get_rank()
        # Held here for all_reduce's hot path: each lookup through mpi() is a call.
        self._in_place = mpi().IN_PLACE
        self._fromaddress = mpi().buffer.fromaddress

    def communicators(self) -> list[Any]:
        return [] if self._comm is None else [self._comm]

    def close(self, in_flight: bool = False) -> None:
        if self._comm is not None:
            # Open MPI's nonblocking collectives keep using a freed
            # communicator's internals (a segfault at the next progress call):
            # one with operations still in flight is left to MPI_Finalize.
            if not in_flight:
                self._comm.Free()
            self._comm = None

    # -- element-wise collectives ------------------------------------------

    def allreduce(self, tensors: Sequence[torch.Tensor], reduction: Reduction) -> MPIPending | SinglePending:
        if len(tensors) == 1 and reduction.plain:
            tensor = tensors[0]
            nbytes = tensor.nbytes  # bounds numel(), which is read only past MAX_ELEMENTS_PER_CALL bytes
            if tensor.is_contiguous() and (nbytes <= MAX_ELEMENTS_PER_CALL or tensor.numel() <= MAX_ELEMENTS_PER_CALL):
                buf = self._fromaddress(tensor.data_ptr(), nbytes)
                return SinglePending(self._comm.Iallreduce(self._in_place, (buf, reduction.datatype), reduction.mpi_op))
        MPI = mpi()
        requests: list[Any] = []
        after: After = []
        for tensor in tensors:
            work = staged(tensor, after)
            premultiplied(work, reduction, in_place=True)
            for span in _spans(work):
                requests.append(self._comm.Iallreduce(MPI.IN_PLACE, span, reduction.mpi_op))
            after[:0] = averager(work, reduction, self._size)
        return MPIPending(requests, after)

    def broadcast(self, tensor: torch.Tensor, root: int) -> MPIPending:
        after: After = []
        work = staged(tensor, after)
        requests = [self._comm.Ibcast(span, root) for span in _spans(work)]
        return MPIPending(requests, after)

    def reduce(self, tensor: torch.Tensor, root: int, reduction: Reduction) -> MPIPending:
        MPI = mpi()
        after: After = []
        if self._rank == root:
            work = premultiplied(staged(tensor, after), reduction, in_place=True)
            requests = [self._comm.Ireduce(MPI.IN_PLACE, span, reduction.mpi_op, root) for span in _spans(work)]
            after[:0] = averager(work, reduction, self._size)
        else:
            # Only the root's tensor changes: send from a copy when premultiplying.
            work = premultiplied(tensor.contiguous(), reduction, in_place=False)
            requests = [self._comm.Ireduce(span, None, reduction.mpi_op, root) for span in _spans(work)]
        return MPIPending(requests, after, keep=(work,))

    # -- gathers and scatters ---------------------------------------------

    def allgather(self, outputs: Sequence[torch.Tensor], tensor: torch.Tensor) -> MPIPending:
        counts = [out.numel() for out in outputs]
        _check_count("all_gather", sum(counts))
        send = tensor.contiguous()
        flat = torch.empty(sum(counts), dtype=tensor.dtype, device=self._device)
        request = self._comm.Iallgatherv(_buffer(send), _vector(flat, counts))
        return MPIPending([request], [scatter_back(flat, outputs)], keep=(send, flat))

    def allgather_into(self, output: torch.Tensor, tensor: torch.Tensor) -> MPIPending:
        _check_count("all_gather_into_tensor", output.numel())
        after: After = []
        recv = staged(output, after, copy_in=False)
        send = tensor.contiguous()
        if send.data_ptr() == recv.data_ptr() + self._rank * send.nbytes:
            # In place, as FSDP2 calls it: the input is this rank's slot of the output.
            request = self._comm.Iallgather(mpi().IN_PLACE, _buffer(recv))
        else:
            send = unaliased(send, recv)
            request = self._comm.Iallgather(_buffer(send), _buffer(recv))
        return MPIPending([request], after, keep=(send, recv))

    def gather(self, outputs: Sequence[torch.Tensor] | None, tensor: torch.Tensor, root: int) -> MPIPending:
        send = tensor.contiguous()
        if outputs is None:
            request = self._comm.Igatherv(_buffer(send), None, root)
            return MPIPending([request], [], keep=(send,))
        counts = [out.numel() for out in outputs]
        _check_count("gather", sum(counts))
        flat = torch.empty(sum(counts), dtype=tensor.dtype, device=self._device)
        request = self._comm.Igatherv(_buffer(send), _vector(flat, counts), root)
        return MPIPending([request], [scatter_back(flat, outputs)], keep=(send, flat))

    def scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor] | None, root: int) -> MPIPending:
        after: After = []
        recv = staged(output, after, copy_in=False)
        if inputs is None:
            flat, send = None, None
        else:
            counts = [t.numel() for t in inputs]
            _check_count("scatter", sum(counts))
            flat = concat(inputs, output.dtype)
            send = _vector(flat, counts)
        request = self._comm.Iscatterv(send, _buffer(recv), root)
        return MPIPending([request], after, keep=(flat, recv))

    def reduce_scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor], reduction: Reduction) -> MPIPending:
        counts = [t.numel() for t in inputs]
        _check_count("reduce_scatter", sum(counts))
        send = premultiplied(concat(inputs, output.dtype), reduction, in_place=True)
        after: After = []
        recv = staged(output, after, copy_in=False)
        request = self._comm.Ireduce_scatter(_buffer(send), _buffer(recv), counts, reduction.mpi_op)
        return MPIPending([request], [*averager(recv, reduction, self._size), *after], keep=(send, recv))

    def reduce_scatter_from(self, output: torch.Tensor, tensor: torch.Tensor, reduction: Reduction) -> MPIPending:
        _check_count("reduce_scatter_tensor", tensor.numel())
        send = premultiplied(tensor.contiguous(), reduction, in_place=False)
        after: After = []
        recv = staged(output, after, copy_in=False)
        send = unaliased(send, recv)
        request = self._comm.Ireduce_scatter_block(_buffer(send), _buffer(recv), reduction.mpi_op)
        return MPIPending([request], [*averager(recv, reduction, self._size), *after], keep=(send, recv))

    # -- all-to-all ---------------------------------------------------------

    def alltoall(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> MPIPending:
        send_counts = [t.numel() for t in inputs]
        recv_counts = [t.numel() for t in outputs]
        _check_count("all_to_all", max(sum(send_counts), sum(recv_counts)))
        dtype = outputs[0].dtype
        send = concat(inputs, dtype)
        flat = torch.empty(sum(recv_counts), dtype=dtype, device=self._device)
        request = self._comm.Ialltoallv(_vector(send, send_counts), _vector(flat, recv_counts))
        return MPIPending([request], [scatter_back(flat, outputs)], keep=(send, flat))

    def alltoall_single(
        self, output: torch.Tensor, tensor: torch.Tensor, output_counts: Sequence[int], input_counts: Sequence[int]
    ) -> MPIPending:
        _check_count("all_to_all_single", max(tensor.numel(), output.numel()))
        send = tensor.contiguous()
        after: After = []
        recv = staged(output, after, copy_in=False)
        send = unaliased(send, recv)
        request = self._comm.Ialltoallv(_vector(send, input_counts), _vector(recv, output_counts))
        return MPIPending([request], after, keep=(send, recv))

    # -- synchronisation and point-to-point ---------------------------------

    def barrier(self) -> MPIPending:
        return MPIPending([self._comm.Ibarrier()], [])

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> MPIPending:
        send = tensor.contiguous()
        requests = [self._comm.Isend(span, peer, tag) for span in _spans(send)]
        return MPIPending(requests, [], keep=(send,))

    def recv(self, tensor: torch.Tensor, peer: int | None, tag: int) -> MPIPending:
        MPI = mpi()
        after: After = []
        recv = staged(tensor, after, copy_in=False)
        if peer is None:
            if recv.numel() > MAX_ELEMENTS_PER_CALL:
                raise ValueError(
                    f"hpccomm recv: a receive from any source is limited to {MAX_ELEMENTS_PER_CALL} "
                    f"elements, got {recv.numel()}; name the source rank"
                )
            status = MPI.Status()
            request = self._comm.Irecv(_buffer(recv), MPI.ANY_SOURCE, tag)
            return MPIPending([request], after, keep=(recv,), status=status)
        requests = [self._comm.Irecv(span, peer, tag) for span in _spans(recv)]
        return MPIPending(requests, after, keep=(recv,))
