"""The UCC transport: tensors through UCC collectives, behind the same Work machinery as MPI.

One UCC context per process, created over ``MPI_COMM_WORLD`` when the first
group using UCC (the default group) is built, and one UCC team per group,
created over the group's communicator (:mod:`hpccomm.ucc`). Each operation
fills a ``ucc_coll_args_t`` and posts one request per tensor; its Pending
polls the request, progressing the context once per poll, so blocking calls
are driven inline, asynchronous work by the progress engine, and timeouts,
departed peers and aborts are handled by :mod:`hpccomm.work` exactly as for
MPI. A request UCC fails surfaces as a :class:`~hpccomm.ucc.UCCError` from
``wait()`` (and the future).

UCC has no point-to-point calls. PyTorch's ProcessGroupUCC makes a send a
broadcast over an "active set" of two ranks, which has no receive from any
source (and keeps 15 bits of a tag); a receive refused for that left the
peer's send posted, for a later receive to take. Here point-to-point goes
through MPI on the group's own communicator (duplicated before UCC's team
takes the original), so sends and receives match as on the MPI transport:
any source, any tag, nothing left behind.

Dtype and reduction mapping, and what UCC's CPU code lacks, are in
:mod:`hpccomm.transports.ucc_types`. Staging, premultiplying and averaging
are shared with the MPI transport (:mod:`hpccomm.transports.local_steps`).

Every buffer description carries the transport's memory type and every
temporary is made on the transport's device: device memory
(``UCC_MEMORY_TYPE_CUDA``) is this transport with two hooks overridden
(:mod:`hpccomm.transports.ucc_cuda`).

Teardown follows UCC's order: requests are finalized as they end; a group's
team is destroyed when the group is, unless an operation on it never
completed (then team, requests and buffers are kept, as UCC may still write
them); at exit, after the progress engine's drain and the goodbye to peers,
teams still open are destroyed, then the context (collective: an
out-of-band barrier, which gives up once a peer has left, or after
:data:`~hpccomm.progress.DRAIN_TIMEOUT_S`), then the library. A context
with a team kept is left to the process's end.
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

import torch

from .. import failure
from ..progress import DRAIN_TIMEOUT_S
from ..ucc import Context, Library, Request, Team
from ..ledger import Ledger
from ..work import Pending
from ..world import mpi, mpi_world_ranks
from . import Transport, ucc_types
from .local_steps import After, averager, concat, premultiplied, scatter_back, staged, unaliased
from .mpi import MPITransport
from .mpi_types import Reduction

_context: Context | None = None
_open: weakref.WeakSet[UCCTransport] = weakref.WeakSet()


class UCCPending:
    """Posted UCC requests plus the local steps to run once they complete.

    Args:
        requests: the posted requests (none for an operation with no data).
        after: steps to run, in order, once all requests completed.
        what: the operation, for error messages.
    """

    #: The path that serves it, as the profiler names it (:mod:`hpccomm.profiling`).
    path = "ucc"

    __slots__ = ("test", "_requests", "_after", "_what")

    def __init__(self, requests: list[Request], after: Sequence[Callable[[], None]], what: str) -> None:
        self._requests = requests
        self._after = after
        self._what = what
        # One request, the common case: its own test, with no loop around it.
        self.test = requests[0].test if len(requests) == 1 else self._test_all

    def _test_all(self) -> bool:
        return all([request.test() for request in self._requests])

    def finish(self) -> None:
        for request in self._requests:
            request.result(f"hpccomm {self._what} on UCC")
        for step in self._after:
            step()


class UCCTransport(Transport):
    """Collectives on one UCC team; point-to-point on the group's MPI communicator.

    Build it with :meth:`for_group`, on every rank of the group at once. On
    host memory as it is; :class:`~hpccomm.transports.ucc_cuda.UCCCudaTransport`
    is this transport on device memory, through its two hooks, :meth:`_post`
    and :meth:`_pending`.

    Args:
        team: the group's team.
        p2p: point-to-point, on the group's MPI communicator (for device
            tensors, through host memory).
        device: where the tensors live (default: host memory); temporaries are
            made there.
    """

    def __init__(self, team: Team, p2p: Transport, device: torch.device | None = None) -> None:
        self._team = team
        self._p2p = p2p
        self._device = device if device is not None else torch.device("cpu")
        self._size = team.size
        self._rank = team.rank
        binding = team.binding
        self._ffi, self._lib = binding.ffi, binding.lib
        self._on_device = self._device.type == "cuda"
        self._mem_type = self._lib.UCC_MEMORY_TYPE_CUDA if self._on_device else self._lib.UCC_MEMORY_TYPE_HOST
        # Hot-path lookups held here: each attribute lookup through the binding costs.
        self._voidp = self._ffi.typeof("void *")
        self._cast = self._ffi.cast
        self._new_args = self._ffi.new
        self._args_type = self._ffi.typeof("ucc_coll_args_t *")
        #: id(Reduction) -> (the Reduction, its prepared all-reduce args, their dst.info)
        self._allreduce_plans: dict[int, tuple[Reduction, Any, Any]] = {}
        _open.add(self)

    @classmethod
    def for_group(cls, comm: Any, global_ranks: Sequence[int], timeout_s: float) -> UCCTransport:
        """The transport for the group on ``comm``. Collective over the group.

        The first call in the process creates the UCC context over the whole
        world, so it must come from a group all ranks build (the default group).

        Args:
            comm: the group's communicator, handed over: the team bootstraps on
                it and frees it.
            global_ranks: the world rank of each group rank.
            timeout_s: how long bootstrap waits for the other ranks.
        """
        p2p = MPITransport(comm.Dup())  # before the team, which frees ``comm``
        team = Team(_world_context(comm, timeout_s), comm, timeout_s, Departures("ucc-team", global_ranks), own=True)
        return cls(team, p2p)

    def communicators(self) -> list[Any]:
        return self._p2p.communicators()

    def close(self, in_flight: bool = False) -> None:
        if self._team is not None:
            self._team.destroy(in_flight)
            self._team = None
            self._p2p.close(in_flight)

    # -- the hooks a device-memory transport overrides --------------------

    def _post(self, args: Any, keep: Any) -> Request:
        """Initialise and post one collective on the team."""
        return self._team.post(args, keep)

    def _pending(self, requests: list[Request], after: After, what: str) -> Pending:
        """The Pending of an operation made of ``requests``, then the local steps ``after``."""
        return UCCPending(requests, after, what)

    def _reduction(self, op_name: str, reduction: Reduction, dtype: torch.dtype) -> ucc_types.UCCReduction:
        return ucc_types.reduction(self._lib, op_name, reduction, dtype, self._on_device)

    def _in_place(self, args: Any, work: torch.Tensor, datatype: int, after: After) -> Any:
        """Describe a reduction into ``work``, which is also its input; returns what the request must keep.

        UCC's own in-place flag here; the transport on device memory reduces
        out of place into its scratch instead (:mod:`~hpccomm.transports.scratch`).
        """
        args.mask |= self._lib.UCC_COLL_ARGS_FIELD_FLAGS
        args.flags |= self._lib.UCC_COLL_ARGS_FLAG_IN_PLACE
        self._info(args.dst.info, work, datatype)
        return work

    # -- building arguments ------------------------------------------------

    def _args(self, coll_type: int, flags: int = 0) -> Any:
        args = self._new_args(self._args_type)
        args.coll_type = coll_type
        if flags:
            args.mask = self._lib.UCC_COLL_ARGS_FIELD_FLAGS
            args.flags = flags
        return args

    def _info(self, info: Any, tensor: torch.Tensor, dtype: int | None = None) -> None:
        """Describe a contiguous tensor in a ``ucc_coll_buffer_info_t``."""
        info.buffer = self._cast(self._voidp, tensor.data_ptr())
        info.count = tensor.numel()
        info.datatype = ucc_types.datatype(self._lib, tensor.dtype) if dtype is None else dtype
        info.mem_type = self._mem_type

    def _info_v(self, info_v: Any, tensor: torch.Tensor, counts: Sequence[int]) -> tuple[Any, Any]:
        """Describe a contiguous tensor cut into ``counts`` in a ``ucc_coll_buffer_info_v_t``.

        Returns:
            the count and displacement arrays, which must outlive the request.
        """
        ffi = self._ffi
        count_array = ffi.new("ucc_count_t[]", list(counts))
        displacements = ffi.new("ucc_aint_t[]", [0, *accumulate(counts)][:-1])
        info_v.buffer = self._cast(self._voidp, tensor.data_ptr())
        info_v.counts = count_array
        info_v.displacements = displacements
        info_v.datatype = ucc_types.datatype(self._lib, tensor.dtype)
        info_v.mem_type = self._mem_type
        return count_array, displacements

    def _vector_flags(self) -> int:
        lib = self._lib
        return lib.UCC_COLL_ARGS_FLAG_COUNT_64BIT | lib.UCC_COLL_ARGS_FLAG_DISPLACEMENTS_64BIT

    def _reduced_in(
        self, tensor: torch.Tensor, red: ucc_types.UCCReduction, after: After, copy_in: bool = True
    ) -> torch.Tensor:
        """The contiguous tensor UCC writes the reduction for ``tensor`` into; ``after`` gets it back into ``tensor``.

        A non-contiguous tensor goes through a stand-in, a 16-bit float through
        a float32 one; AVG on integers divides the result afterwards. With
        ``copy_in`` (``tensor`` is reduced in place) it starts with ``tensor``'s
        values, multiplied by PREMUL_SUM's factor; without (``tensor`` is only
        an output) it starts uninitialised.
        """
        work = staged(tensor, after, copy_in)
        steps: After = []
        if red.widen_to is not None:
            wide = work.to(red.widen_to) if copy_in else torch.empty_like(work, dtype=red.widen_to)
            steps.append(_copier(work, wide))
            work = wide
        if copy_in:
            premultiplied(work, red, in_place=True)
        after[:0] = [*averager(work, red, self._size), *steps]
        return work

    # -- element-wise collectives ------------------------------------------

    def allreduce(self, tensors: Sequence[torch.Tensor], reduction: Reduction) -> Pending:
        requests: list[Request] = []
        after: After = []
        if len(tensors) == 1:
            plan = self._allreduce_plans.get(id(reduction))
            tensor = tensors[0]
            if plan is not None and plan[0] is reduction and tensor.is_contiguous() and tensor.numel():
                keep = self._in_place(plan[1], tensor, plan[2], after)
                return self._pending([self._post(plan[1], keep)], after, "all_reduce")
        for tensor in tensors:
            red = self._reduction("all_reduce", reduction, tensor.dtype)
            work = self._reduced_in(tensor, red, after)
            if not work.numel():
                continue
            args = self._args(self._lib.UCC_COLL_TYPE_ALLREDUCE)
            args.op = red.op
            requests.append(self._post(args, self._in_place(args, work, red.datatype, after)))
            if len(tensors) == 1 and red.widen_to is None and not red.divide_by_size and red.premul_factor is None:
                # UCC copied the args when it took them: kept for ``reduction``,
                # later calls set only the buffers and count (_in_place).
                self._allreduce_plans[id(reduction)] = (reduction, args, red.datatype)
        return self._pending(requests, after, "all_reduce")

    def broadcast(self, tensor: torch.Tensor, root: int) -> Pending:
        after: After = []
        work = staged(tensor, after)
        if not work.numel():
            return self._pending([], after, "broadcast")
        args = self._args(self._lib.UCC_COLL_TYPE_BCAST)
        args.root = root
        self._info(args.src.info, work)
        return self._pending([self._post(args, work)], after, "broadcast")

    def reduce(self, tensor: torch.Tensor, root: int, reduction: Reduction) -> Pending:
        red = self._reduction("reduce", reduction, tensor.dtype)
        after: After = []
        args = self._args(self._lib.UCC_COLL_TYPE_REDUCE)
        if self._rank == root:
            work = self._reduced_in(tensor, red, after)
            if not work.numel():
                return self._pending([], after, "reduce")
            keep = self._in_place(args, work, red.datatype, after)
        else:
            keep = work = _sent(tensor, red)  # only the root's tensor changes
            if not work.numel():
                return self._pending([], after, "reduce")
            self._info(args.src.info, work, red.datatype)
        args.root = root
        args.op = red.op
        return self._pending([self._post(args, keep)], after, "reduce")

    # -- gathers and scatters ---------------------------------------------

    def allgather(self, outputs: Sequence[torch.Tensor], tensor: torch.Tensor) -> Pending:
        counts = [out.numel() for out in outputs]
        send = tensor.contiguous()
        flat = torch.empty(sum(counts), dtype=tensor.dtype, device=self._device)
        args = self._args(self._lib.UCC_COLL_TYPE_ALLGATHERV, self._vector_flags())
        self._info(args.src.info, send)
        arrays = self._info_v(args.dst.info_v, flat, counts)
        request = self._post(args, (send, flat, arrays))
        return self._pending([request], [scatter_back(flat, outputs)], "all_gather")

    def allgather_into(self, output: torch.Tensor, tensor: torch.Tensor) -> Pending:
        after: After = []
        recv = staged(output, after, copy_in=False)
        if not recv.numel():
            return self._pending([], after, "all_gather_into_tensor")
        send = tensor.contiguous()
        if send.data_ptr() == recv.data_ptr() + self._rank * send.nbytes:
            # In place, as FSDP2 calls it: the input is this rank's slot of the output.
            args = self._args(self._lib.UCC_COLL_TYPE_ALLGATHER, self._lib.UCC_COLL_ARGS_FLAG_IN_PLACE)
        else:
            send = unaliased(send, recv)
            args = self._args(self._lib.UCC_COLL_TYPE_ALLGATHER)
            self._info(args.src.info, send)
        self._info(args.dst.info, recv)
        return self._pending([self._post(args, (send, recv))], after, "all_gather_into_tensor")

    def gather(self, outputs: Sequence[torch.Tensor] | None, tensor: torch.Tensor, root: int) -> Pending:
        send = tensor.contiguous()
        args = self._args(self._lib.UCC_COLL_TYPE_GATHERV, self._vector_flags())
        args.root = root
        self._info(args.src.info, send)
        if outputs is None:
            return self._pending([self._post(args, send)], (), "gather")
        counts = [out.numel() for out in outputs]
        flat = torch.empty(sum(counts), dtype=tensor.dtype, device=self._device)
        arrays = self._info_v(args.dst.info_v, flat, counts)
        request = self._post(args, (send, flat, arrays))
        return self._pending([request], [scatter_back(flat, outputs)], "gather")

    def scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor] | None, root: int) -> Pending:
        # UCC's tl/ucp has no plain SCATTER: SCATTERV with equal counts.
        after: After = []
        recv = staged(output, after, copy_in=False)
        args = self._args(self._lib.UCC_COLL_TYPE_SCATTERV, self._vector_flags())
        args.root = root
        self._info(args.dst.info, recv)
        keep: tuple[Any, ...] = (recv,)
        if inputs is not None:
            flat = concat(inputs, output.dtype)
            keep = (recv, flat, self._info_v(args.src.info_v, flat, [t.numel() for t in inputs]))
        return self._pending([self._post(args, keep)], after, "scatter")

    def reduce_scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor], reduction: Reduction) -> Pending:
        red = self._reduction("reduce_scatter", reduction, output.dtype)
        counts = [t.numel() for t in inputs]
        send = concat(inputs, output.dtype)
        if red.widen_to is not None:
            send = send.to(red.widen_to)
        premultiplied(send, red, in_place=True)
        after: After = []
        recv = self._reduced_in(output, red, after, copy_in=False)
        args = self._args(self._lib.UCC_COLL_TYPE_REDUCE_SCATTERV, self._vector_flags())
        args.op = red.op
        self._info(args.src.info, send, red.datatype)
        arrays = self._info_v(args.dst.info_v, recv, counts)
        args.dst.info_v.datatype = red.datatype
        return self._pending([self._post(args, (send, recv, arrays))], after, "reduce_scatter")

    def reduce_scatter_from(self, output: torch.Tensor, tensor: torch.Tensor, reduction: Reduction) -> Pending:
        red = self._reduction("reduce_scatter_tensor", reduction, tensor.dtype)
        after: After = []
        recv = self._reduced_in(output, red, after, copy_in=False)
        if not recv.numel():
            return self._pending([], after, "reduce_scatter_tensor")
        send = unaliased(_sent(tensor, red), recv)
        args = self._args(self._lib.UCC_COLL_TYPE_REDUCE_SCATTER)
        args.op = red.op
        self._info(args.src.info, send, red.datatype)
        self._info(args.dst.info, recv, red.datatype)
        return self._pending([self._post(args, (send, recv))], after, "reduce_scatter_tensor")

    # -- all-to-all ---------------------------------------------------------

    def alltoall(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> Pending:
        dtype = outputs[0].dtype
        send = concat(inputs, dtype)
        recv_counts = [t.numel() for t in outputs]
        flat = torch.empty(sum(recv_counts), dtype=dtype, device=self._device)
        request = self._alltoallv(send, [t.numel() for t in inputs], flat, recv_counts)
        return self._pending([request], [scatter_back(flat, outputs)], "all_to_all")

    def alltoall_single(
        self, output: torch.Tensor, tensor: torch.Tensor, output_counts: Sequence[int], input_counts: Sequence[int]
    ) -> Pending:
        after: After = []
        recv = staged(output, after, copy_in=False)
        send = unaliased(tensor.contiguous(), recv)
        return self._pending([self._alltoallv(send, input_counts, recv, output_counts)], after, "all_to_all_single")

    def _alltoallv(
        self, send: torch.Tensor, send_counts: Sequence[int], recv: torch.Tensor, recv_counts: Sequence[int]
    ) -> Request:
        args = self._args(self._lib.UCC_COLL_TYPE_ALLTOALLV, self._vector_flags())
        sent = self._info_v(args.src.info_v, send, send_counts)
        received = self._info_v(args.dst.info_v, recv, recv_counts)
        return self._post(args, (send, recv, sent, received))

    # -- synchronisation and point-to-point ---------------------------------

    def barrier(self) -> Pending:
        return self._pending([self._post(self._args(self._lib.UCC_COLL_TYPE_BARRIER), None)], (), "barrier")

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> Pending:
        return self._p2p.send(tensor, peer, tag)

    def recv(self, tensor: torch.Tensor, peer: int | None, tag: int) -> Pending:
        return self._p2p.recv(tensor, peer, tag)


def _sent(tensor: torch.Tensor, red: ucc_types.UCCReduction) -> torch.Tensor:
    """What a reduction sends for ``tensor``, which it leaves unchanged.

    A contiguous tensor of its values, widened to float32 for a 16-bit float and
    multiplied by PREMUL_SUM's factor: ``tensor`` itself where none of that changes it.
    """
    send = tensor.contiguous() if red.widen_to is None else tensor.to(red.widen_to)
    return premultiplied(send, red, in_place=send is not tensor)


def _copier(target: torch.Tensor, source: torch.Tensor) -> Callable[[], None]:
    """A step that copies ``source`` into ``target`` (rounding to its dtype)."""
    return lambda: target.copy_(source)


def _world_context(comm: Any, timeout_s: float) -> Context:
    """The process's context over MPI_COMM_WORLD, created by the first group that needs it.

    Raises:
        RuntimeError: that group is not the whole world (only its members
            would reach the collective creation).
    """
    global _context
    if _context is None:
        world = mpi().COMM_WORLD
        if comm.Get_size() != world.Get_size():
            raise RuntimeError("hpccomm: the first group on UCC must span every rank (the default group)")
        departures = Departures("ucc-context", range(world.Get_size()))
        _context = Context(world, timeout_s, departures, Library.instance())
        # The context's teardown waits for the other ranks: after the goodbye
        # (so a rank that leaves early does not hold up the others) and while
        # ranks that leave are still noticed. The goodbye says whether it will
        # run (the teams are closed first, locally, just before it: a team kept
        # for an operation that never completed keeps the context). The
        # progress engine's drain, registered later with atexit, runs before all.
        if failure.after_goodbye(_at_exit):
            failure.before_goodbye(lambda: _promise_teardown(departures))
        else:
            atexit.register(_at_exit)
    return _context


class Departures:
    """Why UCC's bootstrap among some ranks should stop waiting: a rank that left without taking part (or None).

    Each step of the bootstrap (an out-of-band allgather, a group's settling
    all-reduce) is counted as a collective of its own ledger
    (:mod:`hpccomm.ledger`), so a rank that did its part and left is waited
    for no more than one that is still here: what it sent arrives.

    Args:
        name: what bootstraps ("ucc-context", "ucc-team"): with the ranks,
            the ledger's name, equal on every rank that takes part.
        global_ranks: the world ranks taking part.
    """

    def __init__(self, name: str, global_ranks: Sequence[int]) -> None:
        ranks = list(global_ranks)
        self.ledger = Ledger(name, ranks, mpi_world_ranks(ranks))

    def step(self) -> None:
        """A step begins (:class:`hpccomm.ucc.OutOfBand` calls it as it posts an allgather)."""
        self.ledger.post("bootstrap", -1)

    def __call__(self) -> str | None:
        gone = failure.abandoned(self.ledger, "bootstrap", -1, self.ledger.collectives)
        return f"rank(s) {', '.join(map(str, gone))} left the job without taking part" if gone else None


def _promise_teardown(departures: Departures) -> None:
    """Just before the goodbye: close the teams (local) and count the context's teardown barrier if it will run.

    A rank that said it would and then did not (a team kept for an operation
    that never completed, after a timeout) held every other rank in its
    teardown for the drain's whole bound, 30 s.
    """
    for transport in list(_open):
        transport.close()
    departures.ledger.promised = int(_context is not None and _context.handle is not None and not _context.teams)


def _at_exit() -> None:
    """Tear down what is left, in UCC's order: teams, the context, the library."""
    for transport in list(_open):
        transport.close()
    if _context is not None and _context.destroy(DRAIN_TIMEOUT_S):
        _context.library.finalize()
