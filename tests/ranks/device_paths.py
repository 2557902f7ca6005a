"""Every operation of the device paths, over real MPI or UCC, the device simulated (tests/fake_device.py).

The "device" tensors are CPU tensors behind FakeDevice's streams, so the
ordering and completion rules run as on a GPU. ``DEVICE_PATH=staged`` (the
default): the host-staged path, MPI (the group's, duplicated) moving the host
buffers. ``DEVICE_PATH=ucc``: UCC's host-gated path (hpccomm/transports/
ucc_cuda.py) on UCC's host memory, every collective on UCC (point-to-point and
barriers staged, as on a GPU). ``DEVICE_PATH=mpi``: the CUDA-aware MPI path
(hpccomm/transports/mpi_cuda.py) on host memory, everything on it but barriers
and 16-bit float reductions (staged, as on a GPU). ``FAKE_DEVICE_LATE=1``: the
device lags the host as a GPU does (``FakeDevice(late=True)``, its streams run
by a thread of its own), and a blocking call's results are read after
``synchronize()``, as ``.cpu()`` would. Values are checked on every rank; a
check that runs past ``RANKCHECK_LIMIT_S`` (60 s unless set) is named with its
stack and ends its rank. Usage: device_paths.py [name-filter]
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for fake_device

import hpccomm  # noqa: E402, F401
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from fake_device import FakeDevice  # noqa: E402
from hpccomm import world  # noqa: E402
from hpccomm.groups import front_of  # noqa: E402
from hpccomm.in_flight import InFlight  # noqa: E402
from hpccomm.progress import engine  # noqa: E402
from hpccomm.transports.host_staged import HostStagedTransport  # noqa: E402
from hpccomm.transports.device_gated import BySize  # noqa: E402
from hpccomm.transports.mpi import MPITransport  # noqa: E402
from hpccomm.transports.mpi_types import reduction  # noqa: E402
from hpccomm.work import HpcWork, Pending, complete_inline  # noqa: E402
from expected import ALL, combine, inputs, same, torch_op, valid_ops  # noqa: E402
from rankcheck import check, expect_error, run_all  # noqa: E402

dist.init_process_group("hpccomm")
RANK, SIZE = dist.get_rank(), dist.get_world_size()
GROUP = front_of(dist.group.WORLD)
LATE = os.environ.get("FAKE_DEVICE_LATE") == "1"
DEVICE = FakeDevice(late=LATE)
if LATE:
    DEVICE.start()
STAGED = HostStagedTransport(MPITransport(world.mpi().COMM_WORLD.Dup()), DEVICE)
CPU = MPITransport(world.mpi().COMM_WORLD.Dup())  # a CPU collective's own communicator, as another group's
PATH = os.environ.get("DEVICE_PATH", "staged")
GATED_PATH = PATH != "staged"  # a host-gated path on device memory: its CallOrder is checked too
if PATH == "ucc":
    from hpccomm.config import settings
    from hpccomm.transports.ucc_cuda import UCCCudaTransport

    GATED = UCCCudaTransport.for_group(
        world.mpi().COMM_WORLD.Dup(), range(SIZE), 60.0, STAGED, DEVICE, torch.device("cpu"),
        in_place=settings.ucc_in_place,
    )
    TRANSPORT = BySize(STAGED, GATED, limits=0)
elif PATH == "mpi":
    from hpccomm.transports.mpi_cuda import HOST_REDUCED, MPICudaTransport

    GATED = MPICudaTransport(world.mpi().COMM_WORLD.Dup(), DEVICE, torch.device("cpu"))
    TRANSPORT = BySize(STAGED, GATED, limits=0, host_reduced=HOST_REDUCED, p2p_on_device=True)
else:
    TRANSPORT = STAGED
_seq = 0


def label() -> tuple:
    """A collective's label, its ticket counted on the group's ledger as the front counts one.

    A rank's goodbye tells what its ledger counted: a ticket the ledger never
    counted reads, on a rank still waiting when a faster one exits, as an
    operation the faster one never took part in (a false PeerExitedError).
    """
    global _seq
    _seq += 1
    return ("staged", GROUP, _seq, None, GROUP.ledger.post("staged", -1))


def p2p_label(op: str, peer: int) -> tuple:
    """A point-to-point operation's label with ``peer``, counted on the group's ledger as the front counts one."""
    global _seq
    _seq += 1
    return (op, GROUP, _seq, (peer,), GROUP.ledger.post(op, peer))


def done(pending: Pending) -> None:
    """Complete a blocking operation, as the front does, and wait for the device, as reading its results would."""
    complete_inline(pending, label(), 60.0)
    DEVICE.synchronize()


def red(op: dist.ReduceOp.RedOpType, dtype: torch.dtype):
    return reduction("test", dist.ReduceOp(op), dtype)


def ranks_sum(base: float) -> float:
    return sum(base + r for r in range(SIZE))


@check
def all_reduce_sum_avg_max_and_16_bit() -> None:
    x = torch.arange(12, dtype=torch.float32).view(3, 4).t()  # not contiguous
    x += RANK
    done(TRANSPORT.allreduce([x], red(dist.ReduceOp.SUM, x.dtype)))
    expected = torch.arange(12, dtype=torch.float32).view(3, 4).t() * SIZE + sum(range(SIZE))
    assert torch.equal(x, expected), x
    y = torch.full((5,), float(RANK), dtype=torch.float64)
    done(TRANSPORT.allreduce([y], red(dist.ReduceOp.AVG, y.dtype)))
    assert torch.allclose(y, torch.full((5,), (SIZE - 1) / 2, dtype=torch.float64)), y
    z = torch.tensor([RANK, -RANK], dtype=torch.int32)
    done(TRANSPORT.allreduce([z], red(dist.ReduceOp.MAX, z.dtype)))
    assert z.tolist() == [SIZE - 1, 0], z
    h = torch.ones(7, dtype=torch.bfloat16)
    done(TRANSPORT.allreduce([h], red(dist.ReduceOp.SUM, h.dtype)))
    assert h.float().tolist() == [float(SIZE)] * 7, h


@check
def in_place_reductions_every_dtype_and_op() -> None:
    # all_reduce, and reduce at every root, as the front hands them over (complex as itself, the
    # reduction mapped): on UCC through the scratch or UCC's in-place flag (HPCCOMM_UCC_IN_PLACE).
    for dtype in ALL:
        for op in valid_ops(dtype):
            ins = inputs(dtype, op, SIZE)
            reduce_op = reduction("test", torch_op(op) if op == "premul" else dist.ReduceOp(op), dtype)
            t = ins[RANK].clone()
            done(TRANSPORT.allreduce([t], reduce_op))
            same(t, combine(op, dtype, ins), f"all_reduce {dtype} {op}")
            for root in range(SIZE):
                t = ins[RANK].clone()
                done(TRANSPORT.reduce(t, root, reduce_op))
                same(t, combine(op, dtype, ins) if RANK == root else ins[RANK], f"reduce {dtype} {op} root {root}")


@check
def the_scratch_is_reused_and_each_operation_in_flight_has_its_own() -> None:
    scratch = getattr(GATED, "scratch", None) if GATED_PATH else None
    if scratch is None:
        return  # staged, a CUDA-aware MPI, or UCC in place
    scratch.close()  # from no buffers, whatever ran before (RANKCHECK_REPEAT)
    x = torch.full((1000,), float(RANK))
    done(TRANSPORT.allreduce([x], red(dist.ReduceOp.SUM, x.dtype)))
    held = scratch.nbytes
    assert held >= x.nbytes, held
    for _ in range(5):  # one after another, no wait for the device between them: the same buffer, no growth
        complete_inline(TRANSPORT.allreduce([x], red(dist.ReduceOp.SUM, x.dtype)), label(), 60.0)
    assert scratch.nbytes == held, (scratch.nbytes, held)
    DEVICE.synchronize()
    assert x.tolist() == [float(sum(range(SIZE))) * SIZE**5] * 1000, x[:3]
    # In flight together (one rank's stream held, so none can complete): a buffer each, right values.
    DEVICE.hold(DEVICE.side)
    tensors = [torch.full((1000,), float(RANK + i)) for i in range(3)]
    works = [HpcWork(TRANSPORT.allreduce([t], red(dist.ReduceOp.SUM, t.dtype)), [t], label(), 60.0) for t in tensors]
    try:
        time.sleep(0.2)
        assert scratch.nbytes == 3 * held, (scratch.nbytes, held)
    finally:
        DEVICE.release(DEVICE.side)
        for work in works:
            work.wait()
    for i, t in enumerate(tensors):
        assert t.tolist() == [ranks_sum(float(i))] * 1000, (i, t[:3])


@check
def broadcast_and_reduce() -> None:
    root = 1 % SIZE
    x = torch.full((6,), float(RANK))
    done(TRANSPORT.broadcast(x, root))
    assert x.tolist() == [float(root)] * 6, x
    y = torch.full((3,), float(RANK + 1))
    done(TRANSPORT.reduce(y, 0, red(dist.ReduceOp.SUM, y.dtype)))
    if RANK == 0:
        assert y.tolist() == [ranks_sum(1.0)] * 3, y


@check
def all_gather_both_forms() -> None:
    outs = [torch.zeros(2) for _ in range(SIZE)]
    done(TRANSPORT.allgather(outs, torch.full((2,), float(RANK))))
    assert [o.tolist() for o in outs] == [[float(r)] * 2 for r in range(SIZE)], outs
    flat = torch.zeros(SIZE * 3)
    done(TRANSPORT.allgather_into(flat, torch.full((3,), float(RANK))))
    assert flat.tolist() == [float(r) for r in range(SIZE) for _ in range(3)], flat


@check
def gather_and_scatter() -> None:
    outs = [torch.zeros(2) for _ in range(SIZE)] if RANK == 0 else None
    done(TRANSPORT.gather(outs, torch.full((2,), float(RANK)), 0))
    if RANK == 0:
        assert [o.tolist() for o in outs] == [[float(r)] * 2 for r in range(SIZE)], outs
    out = torch.zeros(4)
    inputs = [torch.full((4,), float(r * 10)) for r in range(SIZE)] if RANK == 0 else None
    done(TRANSPORT.scatter(out, inputs, 0))
    assert out.tolist() == [float(RANK * 10)] * 4, out


@check
def reduce_scatter_both_forms() -> None:
    out = torch.zeros(2)
    inputs = [torch.full((2,), float(RANK + r)) for r in range(SIZE)]
    done(TRANSPORT.reduce_scatter(out, inputs, red(dist.ReduceOp.SUM, out.dtype)))
    assert out.tolist() == [ranks_sum(float(RANK))] * 2, out
    out = torch.zeros(3)
    done(TRANSPORT.reduce_scatter_from(out, torch.ones(3 * SIZE), red(dist.ReduceOp.SUM, out.dtype)))
    assert out.tolist() == [float(SIZE)] * 3, out


@check
def all_to_all_both_forms() -> None:
    outs = [torch.zeros(2) for _ in range(SIZE)]
    done(TRANSPORT.alltoall(outs, [torch.full((2,), float(RANK * 100 + r)) for r in range(SIZE)]))
    assert [o.tolist() for o in outs] == [[float(r * 100 + RANK)] * 2 for r in range(SIZE)], outs
    sends = [r + 1 for r in range(SIZE)]  # to rank r: r + 1 elements
    receives = [RANK + 1] * SIZE
    out = torch.zeros(sum(receives))
    done(TRANSPORT.alltoall_single(out, torch.full((sum(sends),), float(RANK)), receives, sends))
    assert out.tolist() == [float(r) for r in range(SIZE) for _ in range(RANK + 1)], out


@check
def barrier_send_recv_and_any_source() -> None:
    done(TRANSPORT.barrier())
    right, left = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    sent = torch.full((4,), float(RANK))
    got = torch.zeros(4)
    send = HpcWork(TRANSPORT.send(sent, right, 3), [sent], label(), 60.0)
    recv = HpcWork(TRANSPORT.recv(got, left, 3), [got], label(), 60.0)
    recv.wait()
    send.wait()
    assert got.tolist() == [float(left)] * 4, got
    if RANK == 0:
        anyone = torch.zeros(1)
        for _ in range(SIZE - 1):
            work = HpcWork(TRANSPORT.recv(anyone, None, 9), [anyone], label(), 60.0)
            work.wait()
            assert anyone.item() == float(work._source_rank()) * 2, (anyone, work._source_rank())
    else:
        done(TRANSPORT.send(torch.full((1,), float(RANK * 2)), 0, 9))


@check
def async_works_waited_out_of_order() -> None:
    tensors = [torch.full((8,), float(RANK + i)) for i in range(4)]
    works = [HpcWork(TRANSPORT.allreduce([t], red(dist.ReduceOp.SUM, t.dtype)), [t], label(), 60.0) for t in tensors]
    for work in reversed(works):
        work.wait()
    for i, t in enumerate(tensors):
        assert t.tolist() == [ranks_sum(float(i))] * 8, (i, t)


@check
def a_collective_follows_an_async_one_on_its_memory_once_that_has_landed() -> None:
    # The front lets an async collective on the same memory end first (hpccomm/in_flight.py), as NCCL's one
    # stream orders them; the front cannot take this simulated device, so the check asks InFlight itself before
    # each post, as the front does. The first one's results land on the side stream (the stand-in of a
    # non-contiguous tensor: copied back on the host-gated paths too), which must have run before the second
    # reads the tensor. Without InFlight, the second read stale values on every path.
    in_flight = InFlight()
    s = float(sum(r + 1 for r in range(SIZE)))
    for _ in range(10):
        t = torch.full((4, 2), float(RANK + 1)).t()
        works = []
        for _ in range(2):
            in_flight.end_overlapping([t], [t])
            works.append(HpcWork(TRANSPORT.allreduce([t], red(dist.ReduceOp.SUM, t.dtype)), [t], label(), 60.0))
            in_flight.add(works[-1], [t])
        for work in reversed(works):
            work.wait()
        assert torch.equal(t, torch.full_like(t, SIZE * s)), t


@check
def one_ranks_inputs_late_while_the_others_post() -> None:
    # Rank 0's stream is busy (held) when it calls two collectives; the others' inputs are ready.
    # Had rank 0 posted them out of order, MPI would pair its second with the others' first.
    a, b = torch.zeros(3), torch.zeros(5)
    if RANK == 0:
        DEVICE.hold(DEVICE.user)
    DEVICE.launch(DEVICE.user, lambda: (a.fill_(1.0 + RANK), b.fill_(100.0 + RANK)))
    first = HpcWork(TRANSPORT.allreduce([a], red(dist.ReduceOp.SUM, a.dtype)), [a], label(), 60.0)
    second = HpcWork(TRANSPORT.allreduce([b], red(dist.ReduceOp.SUM, b.dtype)), [b], label(), 60.0)
    if RANK == 0:
        time.sleep(0.3)
        if GATED_PATH:
            # Queued in call order, as on every rank; posted only once the stream got there.
            assert len(GATED.order) == 2, (GATED.order.queued, GATED.order.posted)
        DEVICE.release(DEVICE.user)
    second.wait()
    first.wait()
    assert a.tolist() == [ranks_sum(1.0)] * 3 and b.tolist() == [ranks_sum(100.0)] * 5, (a, b)


@check
def complete_only_once_the_results_have_landed() -> None:
    # A non-contiguous output comes back from its stand-in on the side stream: held, the work
    # cannot complete, whatever the communication did; released, the values are in place.
    x = torch.arange(6, dtype=torch.float32).view(2, 3).t()
    x += RANK
    expected = torch.arange(6, dtype=torch.float32).view(2, 3).t() * SIZE + sum(range(SIZE))
    posted = GATED.order.posted if GATED_PATH else 0
    DEVICE.hold(DEVICE.side)
    work = HpcWork(TRANSPORT.allreduce([x], red(dist.ReduceOp.SUM, x.dtype)), [x], label(), 60.0)
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        assert not work.is_completed(), "completed while the side stream was held"
        time.sleep(0.01)
    DEVICE.release(DEVICE.side)
    work.wait()
    assert torch.equal(x, expected), x
    assert not GATED_PATH or GATED.order.posted == posted + 1, f"the all-reduce did not go through {PATH}"
    # Every thread that posted or tested the device path bound the device first.
    assert threading.get_ident() in DEVICE.bound_threads or not GATED_PATH, DEVICE.bound_threads


@check
def wait_returns_while_a_kernel_queued_after_the_call_still_runs() -> None:
    # On an H100 work.wait() of an async all-reduce returned only once a kernel the caller queued after
    # the call had ended (UCC's first-use allocations waited for it: hpccomm/transports/ucc_cuda.py, settle).
    # hpccomm's own part: nothing of the operation, its copies back included, waits on the caller's stream
    # after the call. The long kernel, queued on the caller's stream right after the call, ends after wait().
    x = torch.arange(8, dtype=torch.float32).view(2, 4).t() + RANK  # not contiguous: a stand-in and its copy back
    expected = torch.arange(8, dtype=torch.float32).view(2, 4).t() * SIZE + sum(range(SIZE))
    work = HpcWork(TRANSPORT.allreduce([x], red(dist.ReduceOp.SUM, x.dtype)), [x], label(), 20.0)
    finish_kernel = DEVICE.stall(DEVICE.user)  # queued after the call: the stream cannot pass it until finished
    try:
        work.wait()
        assert torch.equal(x, expected), x
    finally:
        finish_kernel()


@check
def wait_returns_while_a_kernel_queued_before_a_later_call_still_runs() -> None:
    # The same, with a call after the kernel (DDP's next bucket): its inputs wait for the kernel on a stream of
    # hpccomm's, which must not be the one the first operation's results land on (it was: the copies back
    # waited for the kernel). Staged after one routed to device memory, where the path has one, else staged.
    x = torch.arange(8, dtype=torch.float32).view(2, 4).t() + RANK
    expected = torch.arange(8, dtype=torch.float32).view(2, 4).t() * SIZE + sum(range(SIZE))
    work = HpcWork(TRANSPORT.allreduce([x], red(dist.ReduceOp.SUM, x.dtype)), [x], label(), 20.0)
    finish_kernel = DEVICE.stall(DEVICE.user)
    y = torch.full((2,), float(RANK))
    later = HpcWork(STAGED.allreduce([y], red(dist.ReduceOp.SUM, y.dtype)), [y], label(), 20.0)
    try:
        work.wait()
        assert torch.equal(x, expected), x
        assert not later.is_completed(), "the later call read its input before the kernel queued ahead of it ended"
    finally:
        finish_kernel()
    later.wait()
    assert y.tolist() == [ranks_sum(0.0)] * 2, y


@check
def a_graph_captured_while_work_is_in_flight_is_not_broken_by_hpccomms_threads() -> None:
    # torch.cuda.graph captures in "global" mode: meanwhile CUDA refuses an event query or a pinned allocation
    # from every other thread of the process in that mode, and the capture breaks (PyTorch's NCCL watchdog met
    # this). The caller captures on its own thread while the progress thread polls and lands its async
    # all-reduce; the results land and the capture stands.
    assert engine().enabled, "no progress thread (MPI_THREAD_MULTIPLE): nothing of hpccomm's polls meanwhile"
    x = torch.arange(8, dtype=torch.float32).view(2, 4).t() + RANK
    expected = torch.arange(8, dtype=torch.float32).view(2, 4).t() * SIZE + sum(range(SIZE))
    DEVICE.hold(DEVICE.side)  # the results cannot land until the capture has begun: polled meanwhile
    work = HpcWork(TRANSPORT.allreduce([x], red(dist.ReduceOp.SUM, x.dtype)), [x], label(), 20.0)
    engine().submit(work)
    future = work.get_future()
    DEVICE.capture_elsewhere = True
    try:
        time.sleep(0.2)
        DEVICE.release(DEVICE.side)
        deadline = time.monotonic() + 20.0
        while not future.done():
            assert time.monotonic() < deadline, "the progress thread did not complete the work in 20 s"
            time.sleep(0.002)
    finally:
        DEVICE.capture_elsewhere = False
        DEVICE.release(DEVICE.side)
    assert not DEVICE.broken_captures, f"threads broke the capture: {DEVICE.broken_captures}"
    work.wait()
    assert torch.equal(x, expected), x


class LazyTeamLayer:
    """A team layer that sets itself up inside the team's first ``ucc_collective_init``, stood in for on host memory.

    tl/nccl does so (``UCC_TL_NCCL_LAZY_INIT``, UCC 1.8's default): it creates
    its NCCL communicator there, blocking until every rank of the team has come,
    with no timeout. Here a blocking MPI barrier over the team's ranks (a
    duplicate made while the team is) runs in the team's first post, in C and
    without a timeout as NCCL's is. On an H100 a rank alone in a collective sat
    in that init for good; the check below hangs the same way unless every team
    layer is set up while the group is made.
    """

    def __enter__(self) -> None:
        from hpccomm.ucc.team import Team

        self.team_class, self.init, self.post = Team, Team.__init__, Team.post
        init, post = self.init, self.post

        def lazy_init(team: Team, context, comm, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            team._lazy_setup = comm.Dup()  # collective, as the team's creation is
            init(team, context, comm, *args, **kwargs)

        def lazy_post(team: Team, *args, **kwargs):  # type: ignore[no-untyped-def]
            setup = team.__dict__.pop("_lazy_setup", None)
            if setup is not None:
                setup.Barrier()  # every rank of the team, or wait forever
                setup.Free()
            return post(team, *args, **kwargs)

        Team.__init__, Team.post = lazy_init, lazy_post

    def __exit__(self, *exc: object) -> None:
        self.team_class.__init__, self.team_class.post = self.init, self.post


@check
def a_rank_alone_in_a_collective_times_out_where_a_team_layer_sets_up_lazily() -> None:
    if PATH != "ucc" or not LATE:
        return  # once per CI run: with the device that lags as a GPU does

    with LazyTeamLayer():
        lone = UCCCudaTransport.for_group(world.mpi().COMM_WORLD.Dup(), range(SIZE), 3.0, STAGED, DEVICE,
                                          torch.device("cpu"), in_place=settings.ucc_in_place)
        if RANK == 0:  # the others skip it
            x = torch.ones(4)
            work = HpcWork(lone.allreduce([x], red(dist.ReduceOp.SUM, x.dtype)), [x], label(), 1.0)
            expect_error(RuntimeError, "Timed out", work.wait)
    lone.close(in_flight=RANK == 0)
    dist.barrier()


@check
def a_group_made_while_the_callers_stream_never_reaches_it_times_out() -> None:
    # A UCC group's creation all-reduces zeros it writes on the caller's stream (UCCCudaTransport.settle): the
    # wait for them, behind whatever the caller queued before, had no deadline; a kernel that never ends (a
    # hung GPU) held the group's creation for good. 3 s, not less: the team's creation has the same timeout.
    if PATH != "ucc" or not LATE:
        return  # once per CI run: with the device that lags as a GPU does
    from hpccomm.work import CommTimeoutError

    finish_kernel = DEVICE.stall(DEVICE.user)
    try:
        expect_error(CommTimeoutError, "caller's stream", lambda: UCCCudaTransport.for_group(
            world.mpi().COMM_WORLD.Dup(), range(SIZE), 3.0, STAGED, DEVICE, torch.device("cpu"),
            in_place=settings.ucc_in_place))
    finally:
        finish_kernel()
    dist.barrier()


class FirstUseAllocations:
    """UCC and UCX allocating device memory for a process's first large collective, stood in for on host memory.

    On a GPU, UCC's and UCX's first large collective allocates device
    resources (its pipeline, reduction executors, transfer streams) once it is
    posted, and a device allocation waits for the work queued on the legacy
    default stream (CUDA's implicit synchronisation): on an H100 the first
    large all-reduce after init ended only once a kernel the caller queued
    after it had (issue 39). Here the first post of at least
    :attr:`LARGE_BYTES` in the process waits until the caller's stream has
    run what is queued on it (:meth:`FakeDevice.wait_for`).
    """

    LARGE_BYTES = 1 << 20

    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        #: Where the allocation happened: "init" (a request posted as it was made) or "post" (a gated post).
        self.allocated_at: str | None = None

    def __enter__(self) -> FirstUseAllocations:
        from hpccomm.ucc.request import Request

        self.request_class, self.init, self.post = Request, Request.__init__, Request.post
        original_init, original_post = self.init, self.post

        def allocating_init(request: Request, context, team, live, args, keep,  # type: ignore[no-untyped-def]
                            post: bool = True) -> None:
            if post:
                self._first_use(keep, "init")
            original_init(request, context, team, live, args, keep, post)

        def allocating_post(request: Request) -> None:
            self._first_use(request._keep, "post")
            original_post(request)

        Request.__init__, Request.post = allocating_init, allocating_post
        return self

    def __exit__(self, *exc: object) -> None:
        self.request_class.__init__, self.request_class.post = self.init, self.post

    def _first_use(self, keep: object, where: str) -> None:
        tensors = keep if isinstance(keep, (tuple, list)) else (keep,)
        nbytes = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
        if self.allocated_at is None and nbytes >= self.LARGE_BYTES:
            self.allocated_at = where
            self.device.wait_for(self.device.user)


#: How long the stand-in kernel runs unless wait() returns first (then it ends at once): a bound on the check's
#: failure, not a speed target; a 1 MiB all-reduce takes milliseconds here.
KERNEL_S = 20.0


@check
def a_first_large_collective_waits_for_no_kernel_queued_after_it() -> None:
    if PATH != "ucc" or not LATE:
        return  # once per CI run: with the device that lags as a GPU does
    from hpccomm.transports import ucc_cuda

    with FirstUseAllocations(DEVICE) as layer:
        ucc_cuda._warmed.discard(torch.device("cpu"))  # the process's first group on this device, as after init
        fresh = UCCCudaTransport.for_group(world.mpi().COMM_WORLD.Dup(), range(SIZE), 60.0, STAGED, DEVICE,
                                           torch.device("cpu"), in_place=settings.ucc_in_place)
        x = torch.full((FirstUseAllocations.LARGE_BYTES // 4,), float(RANK))
        work = HpcWork(fresh.allreduce([x], red(dist.ReduceOp.SUM, x.dtype)), [x], label(), 60.0)
        finish_kernel = DEVICE.stall(DEVICE.user)  # queued after the call
        ended = threading.Event()

        def end_kernel() -> None:
            ended.set()
            finish_kernel()

        timer = threading.Timer(KERNEL_S, end_kernel)
        timer.start()
        try:
            work.wait()
            assert not ended.is_set(), f"wait() returned only once the kernel queued after the call ended ({KERNEL_S} s)"
        finally:
            timer.cancel()
            finish_kernel()
        assert layer.allocated_at == "init", f"UCC's first large collective was {layer.allocated_at!r}, not at creation"
        DEVICE.synchronize()
        assert torch.equal(x, torch.full_like(x, ranks_sum(0.0))), x[:3]
    fresh.close()
    dist.barrier()


@check
def a_rank_blocked_in_another_call_still_posts_its_deferred_one() -> None:
    # Rank 0's inputs are late (its stream is busy) when it calls an async all-reduce, which the path posts only
    # once they are ready; rank 0 then blocks in a CPU all-reduce on another communicator, while the others wait
    # for the async one first. Without the progress thread, nothing polled rank 0's deferred one while it
    # blocked: every rank timed out. (With the thread, the front submits each async work to the engine too.)
    x = torch.zeros(4)
    finish_kernel = DEVICE.stall(DEVICE.user) if RANK == 0 else None
    DEVICE.launch(DEVICE.user, lambda: x.fill_(RANK + 1.0))
    work = HpcWork(TRANSPORT.allreduce([x], red(dist.ReduceOp.SUM, x.dtype)), [x], label(), 20.0)
    engine().submit(work)
    b = torch.full((2,), float(RANK))

    def cpu_all_reduce() -> None:
        complete_inline(CPU.allreduce([b], red(dist.ReduceOp.SUM, b.dtype)), label(), 20.0)

    if finish_kernel is not None:
        timer = threading.Timer(0.2, finish_kernel)  # the kernel ends while rank 0 blocks
        timer.start()
        try:
            cpu_all_reduce()
        finally:
            timer.cancel()
            finish_kernel()
        work.wait()
    else:
        work.wait()
        cpu_all_reduce()
    DEVICE.synchronize()
    assert x.tolist() == [ranks_sum(1.0)] * 4 and b.tolist() == [ranks_sum(0.0)] * 2, (x, b)


@check
def a_deferred_send_goes_out_before_the_rank_makes_a_group() -> None:
    # Rank 0's send waits for its (simulated) stream, which a kernel holds, when rank 0 makes a group; rank 1
    # receives first, then makes it too. A group's creation blocks in MPI, which polls nothing: without the
    # progress thread, the send stayed unposted there and rank 1 waited for it until its timeout.
    x = torch.zeros(4)
    if RANK == 0:
        finish_kernel = DEVICE.stall(DEVICE.user)
        DEVICE.launch(DEVICE.user, lambda: x.fill_(7.0))
        send = HpcWork(TRANSPORT.send(x, 1, 11), [x], p2p_label("send", 1), 20.0)
        engine().submit(send)
        timer = threading.Timer(0.2, finish_kernel)  # the kernel ends while rank 0 makes the group
        timer.start()
        try:
            group = dist.new_group(list(range(SIZE)))
        finally:
            timer.cancel()
            finish_kernel()
        send.wait()
    else:
        if RANK == 1:
            complete_inline(TRANSPORT.recv(x, 0, 11), p2p_label("recv", 0), 10.0)
            DEVICE.synchronize()
            assert x.tolist() == [7.0] * 4, x
        group = dist.new_group(list(range(SIZE)))
    dist.destroy_process_group(group)


# A check that hangs (issue 39's lone rank in a UCC team layer that sets up lazily did) is named with its stack
# (rankcheck's Watchdog) at 60 s, half of run_ranks' 120 s limit for the whole job, rather than only killed with
# the job; a caller's own RANKCHECK_LIMIT_S (tests/gpu sets one per check) wins.
os.environ.setdefault("RANKCHECK_LIMIT_S", "60")
run_all(RANK, sys.argv[1] if len(sys.argv) > 1 else None)
