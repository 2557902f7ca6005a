"""UCC on device memory: each collective posted once the caller's stream has produced its inputs.

The host-gated path of :mod:`~hpccomm.transports.device_gated` on UCC: any
UCC team layer (tl/ucp over UCX's CUDA transports, tl/cuda, tl/nccl) can
serve. At the call the collective is built as on host memory
(:class:`~hpccomm.transports.ucc.UCCTransport`, through its hooks) and
its UCC request initialised, in call order as on every rank (UCC numbers
collectives at initialisation); the post waits in the
:class:`~hpccomm.transports.call_order.CallOrder` for the caller's stream.
UCC's count arrays are held with the tensors until the request has ended.

Reductions into the caller's tensor (all-reduce, reduce at the root) run out
of place into the group's scratch (:mod:`~hpccomm.transports.scratch`), and
the result is copied back as the first local step: UCC's in-place all-reduce
on CUDA memory is many times slower than its out-of-place one
(``HPCCOMM_UCC_IN_PLACE`` chooses: ``scratch``, ``native``, ``tuned``).
An all-gather in place (FSDP2's) passes to UCC as it is: it reduces nothing
and needs no scratch.

Every team layer finishes its set-up at the group's creation, where every
rank is present (:meth:`UCCCudaTransport.settle`): tl/nccl creates its NCCL
communicator inside the first ``ucc_collective_init`` on the team, blocking
until every rank has come and with no timeout (``UCC_TL_NCCL_LAZY_INIT``,
UCC 1.8's default), so a rank alone in its first collective (a peer skipped
it, or died) would wait there forever, before any deadline of hpccomm's
applies: on an H100 a lone rank sat in ``ucc_collective_init``.

Point-to-point and barriers go through the staged path: UCC has no
point-to-point calls and the MPI here need not be CUDA-aware.

``HPCCOMM_UCC_TRIGGERED=1`` posts on an execution engine over the gate stream
instead (design (b), :meth:`UCCCudaTransport._post`): the gate stream waits on
the caller's event and UCC starts the collective when the stream gets there.
Where the team layer has no triggered post of its own (tl/ucp: UCC's generic
one, ``ucc_trigger_test`` in UCC 1.8's ``src/core/ucc_coll.c``), the call
queues nothing on the stream: the first ``ucc_context_progress`` after it
starts UCC's executor there, whose persistent kernel spins until the
collective has ended. So the local steps are queued only once the requests
have ended, as on the host-gated path (:class:`TriggeredPending`): queued at
the call they ran ahead of the collective, and a kernel of hpccomm's launched
while the executor spins could wait for it forever (below). The host polls
UCC's requests until they end (no other thread would progress them); UCC's
``UCC_OPERATION_INITIALIZED`` until the stream has reached the collective is
"not done", as :class:`~hpccomm.ucc.Request` reads it.

Off by default: on an H100 (2026-11-27) its first all-reduce never ended, with
UCC's persistent executor started ("executor start") and never stopped, on
both ranks, under MPS too. The likely cause, read from UCC 1.8's
``ec/cuda/kernel/ec_cuda_executor.cu`` (not yet confirmed on a GPU): without
cooperative launch the executor is three kernels queued in one host call, the
spinning one and then ``executor_shutdown_ack``, launched there for the first
time in the process; under CUDA's lazy loading (torch's default) a kernel's
first launch may wait for the device to drain, and the spinning kernel ends
only when the host, blocked in that launch, stops it. With
``UCC_EC_CUDA_USE_COOPERATIVE_LAUNCH=y`` (:data:`TRIGGERED_EXECUTOR`, set
before UCC starts unless the user set it: :func:`ucc_environment`) the
executor is one kernel, loaded while UCC starts (``cudaFuncGetAttributes``).
A kernel loaded for the first time by any thread while an executor spins can
still wait for it: ``CUDA_MODULE_LOADING=EAGER`` rules that out.

Tested without a GPU, with the tests' simulated device: every operation over
real UCC on host memory, in place through the scratch and through UCC's flag
(``tests/test_ucc_cuda.py``), the ordering and the scratch with scripted
requests (``tests/test_device_gated.py``, ``tests/test_scratch.py``); the
INITIALIZED status over real UCC (``tests/ranks/ucc_binding.py``). On a GPU:
``tests/gpu`` and the acceptance run (``tests/gpu/acceptance.sh``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..ucc import Request, Team, UCCError
from ..ucc.binding import cuda_support, turn_off_memtype_cache
from ..work import CommTimeoutError, Pending
from . import Transport
from .call_order import CallOrder
from .device_gated import BySize, GatedPending
from .device_ops import DeviceOps
from .local_steps import After
from .scratch import Scratch
from .ucc import Departures, UCCPending, UCCTransport, _world_context


#: ``HPCCOMM_UCC_IN_PLACE=tuned``: UCC's settings for in-place all-reduces on CUDA memory, set before
#: UCC starts unless the user set them. tl/ucp cuts an in-place all-reduce into fragments of its CUDA pool's
#: element (1 MiB by default) and cudaMallocs scratch larger than an element on every call
#: (../shared/CUDA-NOTES.md): no fragments, and elements that hold a 64 MiB message (UCC allocates them on
#: demand, at most UCC_MC_CUDA_MPOOL_MAX_ELEMS, 8 by default, outside torch's allocator).
TUNED_IN_PLACE = {"UCC_TL_UCP_ALLREDUCE_SRA_KN_PIPELINE": "n", "UCC_MC_CUDA_MPOOL_ELEM_SIZE": "64Mb"}
#: ``HPCCOMM_UCC_TRIGGERED=1``: UCC's settings for its CUDA executor, set before UCC starts unless the user
#: set them: the persistent executor as one cooperative kernel, loaded while UCC starts, instead of three kernels
#: whose last is loaded on its first launch, behind the spinning one (the module docstring).
TRIGGERED_EXECUTOR = {"UCC_EC_CUDA_USE_COOPERATIVE_LAUNCH": "y"}
_logger = logging.getLogger("hpccomm")
#: The all-reduce the first group on a device runs while it is made (UCCCudaTransport.settle): past UCX's
#: rendezvous threshold and UCC's small-message algorithms, as a DDP bucket is.
WARM_BYTES = 4 << 20
#: The devices whose first group has run it, in this process.
_warmed: set[torch.device] = set()


def ucc_environment(in_place: str, triggered: bool) -> dict[str, str]:
    """UCC's settings that hpccomm's choices for CUDA tensors need, to be set before ``ucc_init`` reads them.

    Set by :func:`hpccomm.transports.device_routes.load_ucc_first` before any
    UCC context (whichever group makes the first), where the user has not set them.

    Args:
        in_place: ``HPCCOMM_UCC_IN_PLACE`` (``tuned``: :data:`TUNED_IN_PLACE`).
        triggered: ``HPCCOMM_UCC_TRIGGERED`` (:data:`TRIGGERED_EXECUTOR`).
    """
    return {**(TUNED_IN_PLACE if in_place == "tuned" else {}), **(TRIGGERED_EXECUTOR if triggered else {})}


class GatedPost:
    """A request waiting in the :class:`~hpccomm.transports.call_order.CallOrder` for the caller's stream.

    Args:
        request: initialised, not posted.
        ready: an event recorded on the caller's stream after the work that produces the inputs.
        ops: the device the event belongs to.
    """

    def __init__(self, request: Request, ready: Any, ops: DeviceOps) -> None:
        self._request = request
        self._ready = ready
        self._ops = ops

    def ready(self) -> bool:
        return self._ops.query(self._ready)

    def post(self) -> None:
        try:
            self._request.post()
        except UCCError:
            pass  # the request has ended with the error: its Pending raises it


class UCCCudaTransport(UCCTransport):
    """:class:`UCCTransport` on CUDA memory, posted host-gated (the module docstring).

    Build it with :meth:`for_group`, on every rank of the group at once.

    Args:
        team: the group's team.
        staged: the group's staged transport, for point-to-point (not closed here: it belongs to :class:`BySize`).
        ops: the device's streams and events.
        device: the group's device (host memory for the tests' simulated device).
        triggered: post on an execution engine on the gate stream (design (b)).
        in_place: how reductions into the caller's tensor run (``HPCCOMM_UCC_IN_PLACE``):
            ``scratch``, out of place into the group's :class:`~hpccomm.transports.scratch.Scratch`
            then copied back on the stream; ``native`` or ``tuned``, UCC's in-place flag.
    """

    def __init__(
        self, team: Team, staged: Transport, ops: DeviceOps, device: torch.device, triggered: bool = False,
        in_place: str = "scratch",
    ) -> None:
        super().__init__(team, staged, device)
        self.ops = ops
        #: Requests initialised and waiting for the caller's stream, posted in call order.
        self.order = CallOrder()
        self._engine = _engine(team, ops) if triggered else None
        #: Where reductions into the caller's tensors are written first; None: in place, by UCC.
        self.scratch = Scratch(ops, device) if in_place == "scratch" else None

    @classmethod
    def for_group(  # type: ignore[override]
        cls, comm: Any, global_ranks: Sequence[int], timeout_s: float, staged: Transport, ops: DeviceOps,
        device: torch.device, triggered: bool = False, in_place: str = "scratch",
    ) -> UCCCudaTransport:
        """The transport for the group on ``comm`` (handed over: the team frees it). Collective.

        Raises:
            RuntimeError: this UCC cannot carry CUDA memory (the message names what is missing).
        """
        if device.type == "cuda":
            missing = cuda_support()
            if missing is not None:
                raise RuntimeError(f"hpccomm: UCC cannot carry CUDA tensors here: {missing}")
            # UCX's memory-type cache made tl/ucp crash on CUDA memory (uct_mm_ep_am_short, H100):
            # off unless the user chose, where the loaded UCX has it. Before UCC's first CUDA buffer.
            _logger.info("hpccomm: UCX memory-type cache for CUDA on UCC: %s", turn_off_memtype_cache())
        departed = Departures("ucc-team", global_ranks)
        team = Team(_world_context(comm, timeout_s), comm, timeout_s, departed, own=True)
        transport = cls(team, staged, ops, device, triggered, in_place)
        try:
            transport.settle(timeout_s, departed)
        except BaseException:
            transport.close(in_flight=True)  # its request may still be in UCC: team and buffers are kept
            raise
        return transport

    def settle(self, timeout_s: float, departed: Departures) -> None:
        """All-reduces on the group's device memory while every rank is here building the group. Collective.

        A team layer that finishes its set-up in its first collective's
        ``ucc_collective_init`` (tl/nccl, the module docstring) does it in the
        first, 4 bytes, where it ends; later collectives, whichever ranks call
        them, find it set up and are bounded by the group's timeout. On one GPU
        shared by ranks, NCCL refuses there ("Duplicate GPU") and UCC falls back,
        once. The first group on a device in the process also runs one of
        :data:`WARM_BYTES`: UCC and UCX allocate device resources for their
        first large collective (its pipeline, reduction executors, transfer
        streams), and a device allocation waits for the work queued on the
        legacy default stream (CUDA's implicit synchronisation), so a first
        large all-reduce after init waited for a kernel the caller queued after
        it (an H100, 2026-11-27: its request ended only when the kernel did).

        Args:
            timeout_s: the group's timeout: how long each collective may take.
            departed: why to stop waiting (a rank that left the job), or None.

        Raises:
            CommTimeoutError: one did not end within ``timeout_s``.
            RuntimeError: a rank left, or UCC refused or failed one.
        """
        self.ops.check_can_stage("group creation")
        self.ops.bind_thread()
        first = self._device not in _warmed
        for nbytes in (4, WARM_BYTES) if first else (4,):
            self._settle_once(nbytes // 4, timeout_s, departed)
        _warmed.add(self._device)

    def _settle_once(self, numel: int, timeout_s: float, departed: Departures) -> None:
        """One all-reduce of ``numel`` float32 zeros, out of place, progressed until it ends (:meth:`settle`)."""
        ops, lib = self.ops, self._lib
        what = (f"hpccomm group creation ({self._size} ranks): UCC's all-reduce of {numel * 4} bytes on device memory "
                "while the group is made")
        deadline = time.monotonic() + timeout_s
        source = torch.zeros(numel, dtype=torch.float32, device=self._device)
        result = torch.empty_like(source)
        written = ops.record(ops.current_stream())
        while not ops.query(written):  # the zeros' kernel, before UCC reads them: after what the caller queued
            if time.monotonic() > deadline:
                raise CommTimeoutError(
                    f"{what}: Timed out waiting {round(timeout_s * 1000)}ms for the caller's stream to reach it "
                    "(work queued on it before the group's creation still runs)"
                )
            time.sleep(0)
        args = self._args(lib.UCC_COLL_TYPE_ALLREDUCE)
        args.op = lib.UCC_OP_SUM
        self._info(args.src.info, source)
        self._info(args.dst.info, result)
        departed.step()
        try:
            request = self._team.post(args, (source, result))
        except UCCError as exc:
            raise _unsupported(exc, lib) from exc
        polls = 0
        while not request.test():
            polls += 1
            if polls % 1024:
                continue
            gone = departed()
            if gone is not None:
                raise RuntimeError(f"{what}: {gone} while it waited for them")
            if time.monotonic() > deadline:
                raise CommTimeoutError(
                    f"{what}: Timed out waiting {round(timeout_s * 1000)}ms for it to complete; a peer rank may "
                    "not have joined the group's creation"
                )
        request.result(what)
        if bool(result.ne(0).any()):
            raise RuntimeError(f"{what}: summed zeros to something else")

    def close(self, in_flight: bool = False) -> None:
        # The staged transport is closed by its owner; an unposted request counts as in flight.
        if self._team is not None:
            self._team.destroy(in_flight or len(self.order) > 0)
            self._team = None
        if self.scratch is not None:
            self.scratch.close()

    # -- the hooks --------------------------------------------------------------------

    def _in_place(self, args: Any, work: torch.Tensor, datatype: int, after: After) -> Any:
        """Out of place into the scratch, copied back into ``work`` first among the local steps."""
        if self.scratch is None:
            return super()._in_place(args, work, datatype, after)
        # The stream the post waits for (host-gated; triggered, the gate stream waits for it in turn): a buffer
        # whose copy back went there before is free at once.
        out, copy_back = self.scratch.take(work, self.ops.current_stream())
        self._info(args.src.info, work, datatype)
        self._info(args.dst.info, out, datatype)
        after.insert(0, copy_back)
        return work, out

    def _post(self, args: Any, keep: Any) -> Request:
        """Initialise now, in call order; queue the post behind the caller's stream (or trigger it on the engine)."""
        ops = self.ops
        ops.check_can_stage("collective")
        ops.bind_thread()
        try:
            request = self._team.post(args, keep, post=False)
        except UCCError as exc:
            raise _unsupported(exc, self._lib) from exc
        if self._engine is not None:
            ops.wait_event(ops.gate_stream(), ops.record(ops.current_stream()))
            request.post_on(self._engine)
        else:
            self.order.add(GatedPost(request, ops.record(ops.current_stream()), ops))
        return request

    def _pending(self, requests: list[Request], after: After, what: str) -> Pending:
        inner = UCCPending(requests, after, what)
        if self._engine is not None:
            return TriggeredPending(self.ops, inner)
        return GatedPending(self.order, self.order.queued, self.ops, inner)


def _engine(team: Team, ops: DeviceOps) -> Any:
    """The execution engine on the gate stream, for ``HPCCOMM_UCC_TRIGGERED``; a refusal says what to do."""
    try:
        return team.execution_engine(ops.gate_stream().cuda_stream)
    except UCCError as exc:
        raise RuntimeError(
            f"hpccomm: HPCCOMM_UCC_TRIGGERED=1 needs UCC's CUDA execution engine ({exc}); unset it to post "
            "host-gated"
        ) from exc


class TriggeredPending(GatedPending):
    """A triggered operation (design (b)): posted at the call, its local steps queued once its requests have ended.

    Until then UCC's executor may spin on the gate stream (the module
    docstring); once they have, UCC has stopped it, and the local steps go
    where :class:`~hpccomm.transports.device_gated.GatedPending` puts them: on
    the side stream, or on the caller's stream for a blocking call.

    Args:
        ops: the device's streams and events.
        inner: the operation's requests and local steps.
    """

    #: The path that serves it, as the profiler names it (:mod:`hpccomm.profiling`).
    path = "ucc-triggered"  # type: ignore[assignment]

    def __init__(self, ops: DeviceOps, inner: UCCPending) -> None:
        super().__init__(None, 0, ops, inner)


def cuda_transport(
    comm: Any, global_ranks: Sequence[int], timeout_s: float, staged: Transport, ops: DeviceOps,
    device: torch.device, staged_max_bytes: int | Mapping[str, int | None], triggered: bool = False,
    in_place: str = "scratch",
) -> BySize:
    """The group's CUDA transport: UCC on device memory, host memory up to ``staged_max_bytes``. Collective.

    Args:
        comm: a communicator of the group's, handed over to UCC's team.
        global_ranks: the world rank of each group rank.
        timeout_s: how long the team's creation waits for the other ranks.
        staged: the group's host-staged transport (handed over).
        ops: the device's streams and events.
        device: the group's device.
        staged_max_bytes: per collective, or one for all (:func:`hpccomm.config.cuda_staged_limits`).
        triggered: ``HPCCOMM_UCC_TRIGGERED``.
        in_place: ``HPCCOMM_UCC_IN_PLACE``.
    """
    ucc = UCCCudaTransport.for_group(comm, global_ranks, timeout_s, staged, ops, device, triggered, in_place)
    return BySize(staged, ucc, staged_max_bytes)


def _unsupported(error: UCCError, lib: Any) -> Exception:
    """A UCC refusal to initialise on device memory, as one error that names what is missing."""
    if error.status != lib.UCC_ERR_NOT_SUPPORTED:
        return error
    missing = cuda_support() or "no UCC team layer offers this collective on CUDA memory (UCC_COLL_TRACE=info tells)"
    return RuntimeError(f"hpccomm: UCC cannot run this collective on CUDA memory: {missing} ({error})")

