"""The front: torch's collective API, checked and dispatched to a transport.

:class:`Front` holds every operation hpccomm offers a group. torch reaches it
through one of two shells, chosen once at registration by what the installed
torch offers (:mod:`hpccomm.registration`):

* :class:`~hpccomm.backend.HpccommBackend`, a ``torch.distributed.Backend``
  that torch's own ProcessGroup wraps per device type, as it wraps Gloo and
  NCCL (torch >= 2.14, where a Python class can subclass ``Backend``);
* :class:`~hpccomm.process_group.ProcessGroupHpccomm`, a Python
  ``ProcessGroup`` (torch 2.11-2.13, whose ``Backend`` cannot be subclassed).

Each operation

1. validates its arguments locally (:mod:`hpccomm.validation`) and, in debug
   mode, against the other ranks (:mod:`hpccomm.debug`), before anything is
   communicated;
2. picks the transport registered for the tensors' device type;
3. wraps the transport's Pending in an :class:`~hpccomm.work.HpcWork`, which
   the caller's ``wait()`` drives inline, or hands it to the progress engine
   when torch asked for an asynchronous op.

The front knows nothing about MPI: transports plug in per device type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions, AllreduceCoalescedOptions, AllreduceOptions, AllToAllOptions, BarrierOptions,
    BroadcastOptions, GatherOptions, ReduceOptions, ReduceScatterOptions, ScatterOptions,
)
from torch.autograd import profiler as torch_profiler

from . import debug, profiling, validation as check
from .in_flight import InFlight
from .ledger import Ledger, tick
from .monitor import Monitor, barrier_seconds
from .profiling import recording
from .progress import DRAIN_TIMEOUT_S, engine
from .sparse import SparseAllreduce
from .tracing import untraced
from .transports import Transport
from .transports.mpi_types import cached_reduction, op_kind
from .work import AllPending, HpcWork, Pending, WorkList, complete_inline, finish_all
from .world import mpi_world_ranks

RedOpType = dist.ReduceOp.RedOpType
BACKEND_NAME = "hpccomm"
#: An operation whose arguments were already checked: (what posts it, its outputs, its inputs).
Poster = tuple[Callable[[], Pending], list[torch.Tensor], list[torch.Tensor]]


@untraced
class Front:
    """The operations of one hpccomm group, on its transports; a shell adds torch's base class.

    Args:
        rank: this process's rank in the group.
        size: the number of ranks in the group.
        transports: the transport for each device type (``"cpu"`` -> MPI).
        timeout: bounds every operation on the group.
        global_ranks: the world rank of each group rank.
        monitor: runs the group's monitored barriers.
        checker: debug mode's cross-rank argument checker, or None.
    """

    def __init__(
        self,
        rank: int,
        size: int,
        transports: dict[str, Transport],
        timeout: timedelta,
        global_ranks: Sequence[int],
        monitor: Monitor,
        checker: debug.Checker | None = None,
    ) -> None:
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self._transports = transports
        self._cpu_transport = transports.get("cpu")
        self._by_device: dict[torch.device, Transport] = {}  # each device seen, and its transport
        self._timeout_s = timeout.total_seconds()
        self._global_ranks = tuple(global_ranks)
        self._mpi_ranks = tuple(mpi_world_ranks(self._global_ranks))  # fixed: a shrink may renumber the world
        self._group_name = ""
        self._seq = 0
        self._ledger = Ledger("", self._global_ranks, self._mpi_ranks)  # what this rank did here: its goodbye says
        self._closed: str | None = None
        self._monitor = monitor
        self._debug = checker
        self._in_flight = InFlight()  # its asynchronous works; a collective follows those on its memory
        self._coalesced: list[HpcWork] | None = None  # posted since start_coalescing(), or None outside it
        # Set once an operation ended without its communication completing (timeout, departed peer, closed group).
        self._stranded = False

    # -- identity --------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    @property
    def closed(self) -> str | None:
        """'aborted' or 'shut down' once the group has ended, else None."""
        return self._closed

    def describe(self) -> str:
        """'group NAME (N ranks)', for messages."""
        return f"group '{self._group_name or '?'}' ({self._size} ranks)"

    def global_ranks(self) -> tuple[int, ...]:
        """World rank of each rank of this group."""
        return self._global_ranks

    def mpi_ranks(self) -> tuple[int, ...]:
        """``MPI_COMM_WORLD`` rank of each rank of this group."""
        return self._mpi_ranks

    @property
    def ledger(self) -> Ledger:
        """What this rank posted on the group: its goodbye's facts (:mod:`hpccomm.ledger`)."""
        return self._ledger

    def set_timeout(self, timeout: timedelta) -> None:
        """Bound the group's later operations by ``timeout`` (torch's ``ProcessGroup.set_timeout``)."""
        self._timeout_s = timeout.total_seconds()

    # -- plumbing ----------------------------------------------------------

    def _check_open(self, op: str) -> None:
        if self._closed is not None:
            raise RuntimeError(f"hpccomm {op}: {self.describe()} was {self._closed}; create a new group")

    def _route(self, op: str, tensor: torch.Tensor) -> Transport:
        self._check_open(op)
        # tensor.is_cpu costs a seventh of tensor.device.type
        return self._cpu_transport if tensor.is_cpu else self._transports[tensor.device.type]

    def _one(self, op: str, arg: str, tensors: object) -> tuple[torch.Tensor, Transport]:
        # check_single and the route in one, for the one-tensor ops (the caller checks the group is open): checks and
        # route took device.type twice, 18k of the front's 36k instructions for a 4-byte all-reduce (callgrind).
        if type(tensors) is list and len(tensors) == 1:
            tensor = tensors[0]
            if isinstance(tensor, torch.Tensor) and tensor.layout is torch.strided:
                transport = self._cpu_transport if tensor.is_cpu else self._by_device.get(tensor.device)
                if transport is not None:
                    return tensor, transport
        tensor = check.check_single(op, arg, tensors, self._transports)  # raises where it must
        return tensor, self._by_device.setdefault(tensor.device, self._transports[tensor.device.type])

    def _launch(
        self,
        op: str,
        post: Pending,
        outputs: list[torch.Tensor],
        async_op: bool,
        peer: int | None = -1,
        timeout_s: float | None = None,
        inputs: list[torch.Tensor] | None = None,
        about: tuple | None = None,
    ) -> dist.Work:
        """Complete ``post`` inline, or wrap it in an HpcWork for the progress engine.

        Args:
            op: the op's name, for messages.
            post: the posted operation.
            outputs: the tensors it writes (the future's value).
            async_op: hand it to the progress engine instead of completing it here.
            peer: the group rank a point-to-point op waits for (None: any rank,
                so no single departure dooms it); -1, for collectives, means
                the whole group.
            timeout_s: this call's own timeout (torch's ``barrier(timeout=)``),
                else the group's.
            inputs, about: for the profiler (:func:`hpccomm.profiling.begin`);
                the tensors read (None: ``outputs``) also for the order of
                later collectives (:mod:`hpccomm.in_flight`).
        """
        self._seq += 1
        peers = None if peer == -1 else (() if peer is None else (peer,))
        if peer == -1:  # Ledger.post, written out for collectives (a method call cost more than the count)
            ledger = self._ledger
            ledger.collectives = ticket = ledger.collectives + 1
            ledger.used = tick()
        else:
            ticket = self._ledger.post(op, peer)
        label = (op, self, self._seq, peers, ticket)
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        # torch's own flag first (a module attribute, set by every profiler Python starts): asking torch's C++ each
        # call cost 0.2-0.3 us of a 12 us all-reduce; the flag, nothing measurable.
        end = None if not (torch_profiler._is_profiler_enabled and recording()) else profiling.begin(
            op, self, self._seq, post, outputs if inputs is None else inputs, outputs, async_op, about, peer)
        if not async_op:
            try:
                return complete_inline(post, label, timeout_s)
            except BaseException:
                self._stranded = True
                raise
            finally:
                if end is not None:
                    end()
        # Host memory's work any waiting thread may move; a device's, only hpccomm's own threads (hpccomm.progress).
        work = HpcWork(post, outputs, label, timeout_s, end, all(t.is_cpu for t in (*outputs, *(inputs or ()))))
        if self._coalesced is not None:
            self._coalesced.append(work)
        collective = peer == -1
        # Tested before any other thread can see it: a small send, or a receive already matched, ends here.
        if not collective and work.ended_when_posted():
            return work
        self._in_flight.add(work, outputs if collective else None, inputs)
        # A point-to-point op's caller usually waits on it at once: no need to wake the thread.
        engine().submit(work, prompt=collective)
        return work

    def _precheck(self, op: str, **signature: object) -> None:
        if self._debug is not None:
            self._debug.agree(op, self._seq + 1, self.describe(), signature)

    def _follow(self, op: str, writes: list[torch.Tensor], reads: list[torch.Tensor]) -> None:
        """Before a collective is posted: end the async ones in flight on its memory (:mod:`hpccomm.in_flight`)."""
        if self._in_flight.entries:
            self._in_flight.end_overlapping(writes, reads)
            self._check_open(op)  # the group may have been aborted meanwhile

    # -- all-reduce, broadcast, reduce ---------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: AllreduceOptions = None) -> dist.Work:
        opts = opts or AllreduceOptions()
        try:
            tensor, transport = self._one("all_reduce", "tensor", tensors)
        except check.LayoutError:
            if len(tensors) == 1 and tensors[0].is_sparse:  # checked only here: dense calls pay nothing
                return self._allreduce_sparse(tensors[0], opts)
            raise
        if self._closed is not None:  # _check_open, written out on the hottest path
            self._check_open("all_reduce")
        red = cached_reduction("all_reduce", opts.reduceOp, tensor.dtype)
        if self._debug is not None:
            self._precheck("all_reduce", dtype=tensor.dtype, numel=tensor.numel(), reduce_op=opts.reduceOp.op)
        if self._in_flight.entries:  # _follow, written out on the hottest path
            self._in_flight.end_overlapping(tensors, tensors)
            self._check_open("all_reduce")
        return self._launch("all_reduce", transport.allreduce(tensors, red), tensors, opts.asyncOp)

    def _allreduce_sparse(self, tensor: torch.Tensor, opts: AllreduceOptions) -> dist.Work:
        op = "all_reduce"
        if op_kind(opts.reduceOp) != int(RedOpType.SUM.value):
            raise check.fail(op, f"sparse tensors are summed only (as with Gloo), got {opts.reduceOp.op}")
        check.check_device(op, "tensor", tensor, self._transports)
        transport = self._route(op, tensor)
        self._precheck(op, dtype=tensor.dtype, shape=list(tensor.shape), sparse_dim=tensor.sparse_dim())
        return self._launch(op, SparseAllreduce(transport, tensor, self._size), [tensor], opts.asyncOp)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: AllreduceCoalescedOptions = None) -> dist.Work:
        opts = opts or AllreduceCoalescedOptions()
        op = "all_reduce_coalesced"
        tensors = check.check_tensors(op, "tensors", tensors, self._transports)
        if not tensors:
            raise check.fail(op, "tensors is empty")
        transport = self._route(op, tensors[0])
        red = cached_reduction(op, opts.reduceOp, tensors[0].dtype)
        self._precheck(op, dtype=tensors[0].dtype, numels=[t.numel() for t in tensors], reduce_op=opts.reduceOp.op)
        self._follow(op, tensors, tensors)
        return self._launch(op, transport.allreduce(tensors, red), tensors, opts.asyncOp)

    def broadcast(self, tensors: list[torch.Tensor], opts: BroadcastOptions = None) -> dist.Work:
        opts = opts or BroadcastOptions()
        tensor, transport = self._one("broadcast", "tensor", tensors)
        root = check.check_rank("broadcast", "src", opts.rootRank, self._size)
        self._check_open("broadcast")
        self._precheck("broadcast", dtype=tensor.dtype, numel=tensor.numel(), root=root)
        self._follow("broadcast", tensors, tensors)
        return self._launch("broadcast", transport.broadcast(tensor, root), tensors, opts.asyncOp, about=(root, (), ()))

    def reduce(self, tensors: list[torch.Tensor], opts: ReduceOptions = None) -> dist.Work:
        opts = opts or ReduceOptions()
        tensor, transport = self._one("reduce", "tensor", tensors)
        root = check.check_rank("reduce", "dst", opts.rootRank, self._size)
        self._check_open("reduce")
        red = cached_reduction("reduce", opts.reduceOp, tensor.dtype)
        self._precheck("reduce", dtype=tensor.dtype, numel=tensor.numel(), root=root, reduce_op=opts.reduceOp.op)
        self._follow("reduce", tensors, tensors)
        return self._launch("reduce", transport.reduce(tensor, root, red), tensors, opts.asyncOp, about=(root, (), ()))

    # -- gathers -------------------------------------------------------------

    def allgather(
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: AllgatherOptions = None
    ) -> dist.Work:
        opts = opts or AllgatherOptions()
        if len(output_tensors) != 1:
            raise check.fail("all_gather", f"tensor_list must be one list per process, got {len(output_tensors)}")
        tensor = check.check_single("all_gather", "tensor", input_tensors, self._transports)
        post, outputs, inputs = self._prepare_allgather("all_gather", "tensor_list", output_tensors[0], tensor)
        self._follow("all_gather", outputs, inputs)
        return self._launch("all_gather", post(), outputs, opts.asyncOp, inputs=inputs)

    def _prepare_allgather(self, op: str, out_arg: str, output_list: list[torch.Tensor], tensor: torch.Tensor) -> Poster:
        """Check one all-gather of the (checked) ``tensor`` into ``output_list``, one tensor per rank."""
        outputs = check.check_tensors(op, out_arg, output_list, self._transports)
        check.check_length(op, out_arg, outputs, self._size)
        check.check_same_dtype(op, f"{out_arg}[0]", outputs[0], tensor, "tensor")
        check.check_numel(op, f"{out_arg}[{self._rank}]", outputs[self._rank], tensor.numel(), "this rank's tensor")
        transport = self._route(op, tensor)
        self._precheck(op, dtype=tensor.dtype, numels=[t.numel() for t in outputs])
        return (lambda: transport.allgather(outputs, tensor)), outputs, [tensor]

    def allgather_coalesced(
        self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor], opts: AllgatherOptions = None
    ) -> dist.Work:
        """Gather each input from every rank: ``output_lists[rank][i]`` receives ``rank``'s ``input_list[i]``."""
        opts = opts or AllgatherOptions()
        op = "all_gather_coalesced"
        inputs = check.check_tensors(op, "input_tensor_list", input_list, self._transports)
        check.check_lists(op, "output_tensor_lists", output_lists, self._size, len(inputs))
        posters = [
            self._prepare_allgather(op, f"output_tensor_lists[*][{i}]", [outs[i] for outs in output_lists], tensor)
            for i, tensor in enumerate(inputs)
        ]
        return self._launch_all(op, posters, opts.asyncOp)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: AllgatherOptions = None) -> dist.Work:
        opts = opts or AllgatherOptions()
        post, outputs, inputs = self._prepare_all_gather_single(output, input)
        self._follow("all_gather_into_tensor", outputs, inputs)
        return self._launch("all_gather_into_tensor", post(), outputs, opts.asyncOp, inputs=inputs)

    def _prepare_all_gather_single(self, output: torch.Tensor, input: torch.Tensor) -> Poster:
        op = "all_gather_into_tensor"
        tensor = check.check_tensor(op, "input_tensor", input, self._transports)
        output = check.check_tensor(op, "output_tensor", output, self._transports)
        check.check_same_dtype(op, "output_tensor", output, tensor, "input_tensor")
        check.check_numel(op, "output_tensor", output, tensor.numel() * self._size, "world size x input elements")
        transport = self._route(op, tensor)
        self._precheck(op, dtype=tensor.dtype, numel=tensor.numel())
        return (lambda: transport.allgather_into(output, tensor)), [output], [tensor]

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: AllgatherOptions = None
    ) -> dist.Work:
        opts = opts or AllgatherOptions()
        check.check_pairs("all_gather_into_tensor_coalesced", outputs, inputs)
        posters = [self._prepare_all_gather_single(out, inp) for out, inp in zip(outputs, inputs)]
        return self._launch_all("all_gather_into_tensor_coalesced", posters, opts.asyncOp)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: GatherOptions = None
    ) -> dist.Work:
        opts = opts or GatherOptions()
        op = "gather"
        tensor = check.check_single(op, "tensor", input_tensors, self._transports)
        root = check.check_rank(op, "dst", opts.rootRank, self._size)
        outputs = check.check_root_list(op, "gather_list", output_tensors, tensor, self._rank, root, self._size,
                                        "destination", self._transports)
        transport = self._route(op, tensor)
        self._precheck(op, dtype=tensor.dtype, numel=tensor.numel(), root=root)
        self._follow(op, outputs or [], [tensor])
        post = transport.gather(outputs, tensor, root)
        return self._launch(op, post, outputs or [], opts.asyncOp, inputs=[tensor], about=(root, (), ()))

    # -- scatters and reduce-scatters ---------------------------------------

    def scatter(
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: ScatterOptions = None
    ) -> dist.Work:
        opts = opts or ScatterOptions()
        op = "scatter"
        output = check.check_single(op, "tensor", output_tensors, self._transports)
        root = check.check_rank(op, "src", opts.rootRank, self._size)
        inputs = check.check_root_list(op, "scatter_list", input_tensors, output, self._rank, root, self._size,
                                       "source", self._transports)
        transport = self._route(op, output)
        self._precheck(op, dtype=output.dtype, numel=output.numel(), root=root)
        self._follow(op, [output], inputs or [])
        post = transport.scatter(output, inputs, root)
        return self._launch(op, post, [output], opts.asyncOp, inputs=inputs or [], about=(root, (), ()))

    def reduce_scatter(
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: ReduceScatterOptions = None
    ) -> dist.Work:
        opts = opts or ReduceScatterOptions()
        op = "reduce_scatter"
        output = check.check_single(op, "output", output_tensors, self._transports)
        if len(input_tensors) != 1:
            raise check.fail(op, f"input_list must be one list per process, got {len(input_tensors)}")
        inputs = check.check_tensors(op, "input_list", input_tensors[0], self._transports)
        check.check_length(op, "input_list", inputs, self._size)
        check.check_same_dtype(op, "input_list[0]", inputs[0], output, "output")
        check.check_numel(op, "output", output, inputs[self._rank].numel(), f"input_list[{self._rank}]")
        transport = self._route(op, output)
        red = cached_reduction(op, opts.reduceOp, output.dtype)
        self._precheck(op, dtype=output.dtype, numels=[t.numel() for t in inputs], reduce_op=opts.reduceOp.op)
        self._follow(op, [output], inputs)
        return self._launch(op, transport.reduce_scatter(output, inputs, red), [output], opts.asyncOp, inputs=inputs)

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: ReduceScatterOptions = None
    ) -> dist.Work:
        opts = opts or ReduceScatterOptions()
        post, outputs, inputs = self._prepare_reduce_scatter_single(output, input, opts.reduceOp)
        self._follow("reduce_scatter_tensor", outputs, inputs)
        return self._launch("reduce_scatter_tensor", post(), outputs, opts.asyncOp, inputs=inputs)

    def _prepare_reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, reduce_op: dist.ReduceOp) -> Poster:
        op = "reduce_scatter_tensor"
        tensor = check.check_tensor(op, "input", input, self._transports)
        output = check.check_tensor(op, "output", output, self._transports)
        check.check_same_dtype(op, "output", output, tensor, "input")
        check.check_numel(op, "input", tensor, output.numel() * self._size, "world size x output elements")
        transport = self._route(op, tensor)
        red = cached_reduction(op, reduce_op, tensor.dtype)
        self._precheck(op, dtype=tensor.dtype, numel=tensor.numel(), reduce_op=reduce_op.op)
        return (lambda: transport.reduce_scatter_from(output, tensor, red)), [output], [tensor]

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: ReduceScatterOptions = None
    ) -> dist.Work:
        opts = opts or ReduceScatterOptions()
        check.check_pairs("reduce_scatter_tensor_coalesced", outputs, inputs)
        reduce_op = opts.reduceOp
        posters = [self._prepare_reduce_scatter_single(out, inp, reduce_op) for out, inp in zip(outputs, inputs)]
        return self._launch_all("reduce_scatter_tensor_coalesced", posters, opts.asyncOp)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _launch_all(self, op: str, posters: list[Poster], async_op: bool) -> dist.Work:
        """Post several validated operations; one Work ends when all have.

        Every argument was checked before the first post, so a bad one
        leaves no peer waiting.
        """
        outputs = [tensor for _, outs, _ in posters for tensor in outs]
        inputs = [tensor for _, _, ins in posters for tensor in ins]
        self._follow(op, outputs, inputs)
        return self._launch(op, AllPending([post() for post, _, _ in posters]), outputs, async_op, inputs=inputs)

    # -- all-to-all ------------------------------------------------------------

    def alltoall(
        self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: AllToAllOptions = None
    ) -> dist.Work:
        opts = opts or AllToAllOptions()
        op = "all_to_all"
        outputs = check.check_tensors(op, "output_tensor_list", output_tensors, self._transports)
        inputs = check.check_tensors(op, "input_tensor_list", input_tensors, self._transports)
        check.check_length(op, "output_tensor_list", outputs, self._size)
        check.check_length(op, "input_tensor_list", inputs, self._size)
        check.check_same_dtype(op, "output_tensor_list[0]", outputs[0], inputs[0], "input_tensor_list[0]")
        transport = self._route(op, inputs[0])
        self._precheck(op, dtype=inputs[0].dtype, numels=[t.numel() for t in inputs])
        self._follow(op, outputs, inputs)
        return self._launch(op, transport.alltoall(outputs, inputs), outputs, opts.asyncOp, inputs=inputs)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: AllToAllOptions = None,
    ) -> dist.Work:
        opts = opts or AllToAllOptions()
        op = "all_to_all_single"
        tensor = check.check_tensor(op, "input", input, self._transports)
        output = check.check_tensor(op, "output", output, self._transports)
        check.check_same_dtype(op, "output", output, tensor, "input")
        input_counts = check.split_counts(op, "input", tensor, input_split_sizes, self._size)
        output_counts = check.split_counts(op, "output", output, output_split_sizes, self._size)
        transport = self._route(op, tensor)
        self._precheck(op, dtype=tensor.dtype, sends=input_counts, receives=output_counts)
        self._follow(op, [output], [tensor])
        post = transport.alltoall_single(output, tensor, output_counts, input_counts)
        splits = (-1, input_counts, output_counts) if input_split_sizes or output_split_sizes else None
        return self._launch(op, post, [output], opts.asyncOp, inputs=[tensor], about=splits)

    alltoall_base = all_to_all_single

    # -- barrier and point-to-point -------------------------------------------

    def barrier(self, opts: BarrierOptions = None) -> dist.Work:
        opts = opts or BarrierOptions()
        transport = self._route("barrier", torch.empty(0))
        own_timeout = opts.timeout.total_seconds()  # negative: torch's "unset"
        self._precheck("barrier")
        if self._in_flight.entries:  # it ends after the group's earlier collectives, as Gloo's and NCCL's do
            self._in_flight.end_collectives("barrier", own_timeout if own_timeout > 0 else None)
            self._check_open("barrier")
        post = transport.barrier()
        return self._launch("barrier", post, [], opts.asyncOp, timeout_s=own_timeout if own_timeout > 0 else None)

    def monitored_barrier(
        self, timeout: timedelta | float | BarrierOptions | None = None, wait_all_ranks: bool = False
    ) -> None:
        """A barrier that names the ranks that did not arrive within ``timeout``.

        torch's ``dist.monitored_barrier`` serves Gloo only; this is the same
        call on an hpccomm group (see :mod:`hpccomm.monitor`), also reachable
        as :func:`hpccomm.monitored_barrier`.

        Args:
            timeout: how long to wait (a timedelta or seconds, or torch's
                BarrierOptions carrying it); default: the group's timeout.
            wait_all_ranks: rank 0 names every missing rank, not just the first.

        Raises:
            MonitoredBarrierError: on rank 0, naming the missing rank(s); on the
                others, saying rank 0 did not release them.
        """
        self._check_open("monitored_barrier")
        seconds = barrier_seconds(timeout, self._timeout_s)
        self._monitor.barrier(f"monitored_barrier on {self.describe()}", seconds, wait_all_ranks, self._global_ranks)

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> dist.Work:
        tensor, transport = self._one("send", "tensor", tensors)
        peer = check.check_rank("send", "dst", dstRank, self._size)
        if tag < 0:
            raise check.fail("send", f"tag={tag} must be non-negative")
        self._check_open("send")
        return self._launch("send", transport.send(tensor, peer, tag), tensors, True, peer)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> dist.Work:
        tensor, transport = self._one("recv", "tensor", tensors)
        peer = check.check_rank("recv", "src", srcRank, self._size)
        if tag < 0:
            raise check.fail("recv", f"tag={tag} must be non-negative")
        self._check_open("recv")
        return self._launch("recv", transport.recv(tensor, peer, tag), tensors, True, peer)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        tensor, transport = self._one("recv", "tensor", tensors)
        if tag < 0:
            raise check.fail("recv", f"tag={tag} must be non-negative")
        self._check_open("recv")
        return self._launch("recv", transport.recv(tensor, None, tag), tensors, True, None)

    # -- coalescing (torch's batch_isend_irecv, _coalescing_manager) ----------

    def start_coalescing(self) -> None:
        """Collect the works of the operations that follow, until :meth:`end_coalescing`.

        Each operation is still posted when called (MPI's requests are
        independent), so coalescing groups works without delaying any.
        """
        if self._coalesced is not None:
            raise RuntimeError(f"hpccomm start_coalescing: {self.describe()} is already coalescing")
        self._coalesced = []

    def end_coalescing(self) -> dist.Work:
        """One Work for every asynchronous operation posted since :meth:`start_coalescing`."""
        if self._coalesced is None:
            raise RuntimeError(f"hpccomm end_coalescing: {self.describe()} was not coalescing")
        works, self._coalesced = self._coalesced, None
        return WorkList(works)

    # -- lifetime ----------------------------------------------------------------

    def shutdown(self) -> None:
        """End the group (``destroy_process_group``); later calls raise.

        Asynchronous work still in flight is first driven to completion, as
        at exit (at most :data:`~hpccomm.progress.DRAIN_TIMEOUT_S`): a
        program may destroy its groups without waiting on its last works.
        What is still pending then fails.
        """
        finish_all(self._in_flight.works(), min(self._timeout_s, DRAIN_TIMEOUT_S))
        self._close("shut down")

    def abort(self) -> None:
        """End the group now: pending work fails at once, later calls raise."""
        self._close("aborted")

    def _close(self, how: str) -> None:
        if self._closed is not None:
            return
        self._closed = how
        # Waiters and the progress thread fail their work within a few polls; this fails work nobody drives.
        for work in self._in_flight.works():
            work.poll()
        unfinished = self._in_flight.clear()
        stranded = self._stranded or self._in_flight.failed or bool(unfinished)
        for transport in self._transports.values():
            transport.close(in_flight=stranded)
        self._monitor.close()
        if self._debug is not None:
            self._debug.close()

