"""The host-gated device path (hpccomm/transports/device_gated.py) and its size routing, without a GPU.

A device operation on the host-gated path must: post only once the caller's
stream has produced its inputs, in call order whichever operation is polled
first; run its local steps on the side stream and complete only once they
have landed (a blocking call: queued on the caller's stream); fail, not
hang, on refusals, errors, timeouts and aborts; keep its tensors until the
communication is done; bind the device on every thread that polls. Tested
here in this process with scripted requests and tests/fake_device.py; the
same logic over real MPI and UCC, every operation: tests/test_mpi_cuda.py,
tests/test_ucc_cuda.py; on a GPU: tests/gpu.
"""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch
from fake_device import FakeDevice
from test_host_staged import Group

from hpccomm.transports import Transport
from hpccomm.transports.call_order import CallOrder
from hpccomm.transports.device_gated import BySize, GatedPending
from hpccomm.transports.ucc import UCCPending
from hpccomm.transports.ucc_cuda import GatedPost, TriggeredPending
from hpccomm.ucc import UCCError
from hpccomm.work import CommTimeoutError, GroupClosedError, HpcWork, complete_inline

# -- the host-gated ordering, with scripted requests ---------------------------------------


class ScriptedRequest:
    """A UCC request as GatedPending sees it: posted once, then ended when the test says (a stand-in for UCC)."""

    def __init__(self, log: list[str], name: str, keep: object = None, refuse: bool = False) -> None:
        self.log, self.name, self.keep, self.refuse = log, name, keep, refuse
        self.posted = False
        self.done = False
        self.error: str | None = None

    def post(self) -> None:
        self.posted = True
        self.log.append(self.name)
        if self.refuse:
            self.done, self.error = True, "ucc_collective_post: refused"
            raise UCCError(-1, self.error)

    def test(self) -> bool:
        assert self.posted, f"{self.name} tested before it was posted"
        if self.done:
            self.keep = None  # UCC is done with the buffers
        return self.done

    def result(self, what: str) -> None:
        if self.error is not None:
            raise UCCError(-1, f"{what}: {self.error}")


class Gated:
    """Operations through the host-gated path as UCCCudaTransport makes them, on a simulated device.

    UCC's own Pending and GatedPost over scripted requests.
    """

    def __init__(self, late: bool = False) -> None:
        self.device = FakeDevice(late=late)
        self.order = CallOrder()
        self.posts: list[str] = []

    def call(self, name: str, after=(), keep: object = None, refuse: bool = False):
        request = ScriptedRequest(self.posts, name, keep, refuse)
        self.order.add(GatedPost(request, self.device.record(self.device.current_stream()), self.device))
        pending = GatedPending(self.order, self.order.queued, self.device, UCCPending([request], list(after), name))
        return pending, request


def test_a_request_is_posted_only_once_the_callers_stream_has_produced_its_inputs():
    gated = Gated()
    x = torch.zeros(2)
    gated.device.hold(gated.device.user)
    gated.device.launch(gated.device.user, lambda: x.fill_(3))  # a kernel queued before the collective
    pending, request = gated.call("all_reduce")
    assert not pending.test() and not request.posted, "posted before the caller's stream produced the input"
    gated.device.release(gated.device.user)
    assert not pending.test() and request.posted and x.tolist() == [3.0, 3.0]
    request.done = True
    assert pending.test()
    pending.finish()


def test_posts_follow_call_order_whichever_operation_is_tested_first():
    gated = Gated()
    gated.device.hold(gated.device.user)
    first, _ = gated.call("first")
    second, _ = gated.call("second")
    assert not second.test() and gated.posts == []
    gated.device.release(gated.device.user)
    assert not second.test()  # the progress thread may reach the later one first
    assert gated.posts == ["first", "second"], gated.posts


def test_local_steps_run_on_the_side_stream_and_the_work_completes_once_they_have_landed():
    gated = Gated()
    out = torch.zeros(2)
    pending, request = gated.call("all_gather", after=[lambda: out.fill_(7)])
    gated.device.hold(gated.device.side)
    request.done = True
    assert not pending.test(), "completed before the local steps ran"
    assert out.tolist() == [0.0, 0.0]
    gated.device.release(gated.device.side)
    assert pending.test() and out.tolist() == [7.0, 7.0]
    assert ("call", "side") in gated.device.trace


def test_a_blocking_call_ends_with_its_local_steps_queued_on_the_callers_stream():
    gated = Gated()
    out = torch.zeros(2)
    pending, request = gated.call("all_gather", after=[lambda: out.fill_(7)])
    request.done = True
    gated.device.hold(gated.device.user)  # the caller's stream is busy: the steps queue behind its work
    complete_inline(pending, ("all_gather", Group(), 1, None, 1), 5.0)
    assert out.tolist() == [0.0, 0.0] and gated.device.user.tasks
    gated.device.release(gated.device.user)
    assert out.tolist() == [7.0, 7.0] and gated.device.trace[-1] == ("call", "user")


def test_a_refused_post_fails_its_work_runs_no_local_step_and_the_next_one_still_posts():
    gated = Gated()
    out = torch.zeros(1)
    refused, _ = gated.call("refused", after=[lambda: out.fill_(1)], refuse=True)
    ok, request = gated.call("ok")
    assert refused.test()
    with pytest.raises(UCCError, match="hpccomm refused on UCC: ucc_collective_post: refused"):
        refused.finish()
    assert out.item() == 0.0 and gated.posts == ["refused", "ok"]
    request.done = True
    assert ok.test()


def test_a_ucc_error_fails_the_work():
    gated = Gated()
    pending, request = gated.call("all_reduce")
    request.done, request.error = True, "Timeout expired"
    assert pending.test()
    with pytest.raises(UCCError, match="hpccomm all_reduce on UCC: Timeout expired"):
        pending.finish()


def test_every_thread_that_tests_binds_the_device_first():
    gated = Gated()
    pending, request = gated.call("all_reduce")
    worker = threading.Thread(target=pending.test)
    worker.start()
    worker.join()
    assert gated.device.bound_threads == {worker.ident}


def test_tensors_are_held_until_ucc_is_done_with_them():
    gated = Gated()
    x = torch.ones(8)
    gone = weakref.ref(x)
    gated.device.hold(gated.device.user)
    pending, request = gated.call("send", keep=x)
    del x
    gc.collect()
    assert gone() is not None, "the tensor was released before UCC had it"
    gated.device.release(gated.device.user)
    assert not pending.test()
    request.done = True
    del request
    assert pending.test()
    pending.finish()
    del pending
    gc.collect()
    assert gone() is None, "the tensor was kept after the work completed"


def test_temporaries_of_local_steps_queued_on_the_side_stream_are_held_until_those_have_landed():
    # On a GPU the caching allocator hands a freed temporary's memory at once to the stream it was made on (the
    # caller's), whose next kernels would overwrite a stand-in that a copy queued on the side stream has yet to
    # read. The device here runs queued work only when told (late), as a GPU that lags the host.
    gated = Gated(late=True)
    out = torch.zeros(4)
    stand_in = torch.full((4,), 5.0)  # a contiguous stand-in for a non-contiguous output, say
    gone = weakref.ref(stand_in)
    pending, request = gated.call("all_gather", after=[lambda stage=stand_in: out.copy_(stage)])
    del stand_in
    gated.device.run()  # the caller's stream reaches the gate
    assert not pending.test() and request.posted
    request.done = True
    del request
    assert not pending.test(), "completed before its local steps landed"
    gc.collect()
    assert gone() is not None, "a temporary was released while the local steps that read it were still queued"
    gated.device.run()
    assert pending.test()
    gc.collect()
    assert gone() is None, "a temporary was kept after its local steps landed"  # the Work still holds the Pending
    pending.finish()


def test_a_blocking_operation_whose_inputs_never_come_times_out_unposted():
    gated = Gated()
    gated.device.hold(gated.device.user)  # never released
    pending, request = gated.call("all_reduce")
    with pytest.raises(CommTimeoutError, match="Timed out waiting"):
        complete_inline(pending, ("all_reduce", Group(), 1, None, 1), 0.2)
    assert not request.posted and len(gated.order) == 1  # the transport then keeps its team as in flight


def test_an_aborted_group_ends_the_wait():
    gated = Gated()
    pending, _request = gated.call("all_reduce")  # posted, never ends
    group = Group()
    work = HpcWork(pending, [], ("all_reduce", group, 1, None, 1), 30.0)
    group.closed = "aborted"
    with pytest.raises(GroupClosedError, match="aborted"):
        work.wait()


# -- which path serves which operation ---------------------------------------------------------


class Recorder(Transport):
    """Records which operations reach it (a stand-in for one path; both paths are tested for real)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattribute__(self, name: str):
        if name in ("calls", "__dict__", "__class__") or name.startswith("_"):
            return object.__getattribute__(self, name)
        calls = object.__getattribute__(self, "calls")
        return lambda *args: calls.append(name)


def test_collectives_go_by_a_size_every_rank_sees_alike_and_point_to_point_is_staged():
    staged, ucc = Recorder(), Recorder()
    paths = BySize(staged, ucc, limits=64)
    small, large = torch.zeros(16), torch.zeros(17)  # 64 and 68 bytes
    paths.allreduce([small], None)
    paths.allreduce([large], None)
    paths.allreduce([small, small], None)  # 128 bytes in one call
    paths.broadcast(small, 0)
    paths.reduce(large, 0, None)
    paths.allgather([torch.zeros(8), torch.zeros(8)], torch.zeros(8))  # output 64 bytes
    paths.allgather_into(torch.zeros(32), torch.zeros(16))  # output 128 bytes
    paths.reduce_scatter_from(torch.zeros(8), torch.zeros(16), None)  # input 64 bytes
    paths.gather(None, large, 0)  # a non-root passes no outputs: the tensor decides
    paths.scatter(small, None, 0)
    # All-to-all has no size every rank shares: at 3 ranks, rank 0's pieces can all be one size ([1, 1, 1])
    # while rank 1's are [1, 1, 5]; a choice by size would split them between paths. One path at every size.
    paths.alltoall_single(torch.zeros(3), torch.zeros(3), [1, 2], [2, 1])
    paths.alltoall_single(torch.zeros(16), torch.zeros(16), [8, 8], [8, 8])  # 64 bytes, even: still device memory
    paths.alltoall([torch.zeros(8), torch.zeros(8)], [torch.zeros(8), torch.zeros(8)])
    paths.barrier()
    paths.send(large, 1, 0)
    paths.recv(large, None, 0)
    assert staged.calls == ["allreduce", "broadcast", "allgather", "reduce_scatter_from", "scatter",
                            "barrier", "send", "recv"]
    assert ucc.calls == ["allreduce", "allreduce", "reduce", "allgather_into", "gather", "alltoall_single",
                         "alltoall_single", "alltoall"]


def test_zero_sends_every_collective_to_device_memory():
    staged, ucc = Recorder(), Recorder()
    BySize(staged, ucc, limits=0).allreduce([torch.zeros(1)], None)
    BySize(staged, ucc, limits=0).broadcast(torch.zeros(0), 0)
    assert ucc.calls == ["allreduce"] and staged.calls == ["broadcast"]  # 0 bytes <= 0: no data to move


def test_reductions_the_device_cannot_do_stay_staged_and_point_to_point_can_go_to_the_device():
    staged, device = Recorder(), Recorder()
    paths = BySize(staged, device, limits=0, host_reduced=frozenset({torch.bfloat16}), p2p_on_device=True)
    half = torch.zeros(64, dtype=torch.bfloat16)
    paths.allreduce([half], None)
    paths.reduce(half, 0, None)
    paths.reduce_scatter_from(torch.zeros(32, dtype=torch.bfloat16), half, None)
    paths.broadcast(half, 0)  # no reduction: on the device
    paths.allreduce([torch.zeros(64)], None)
    paths.send(torch.zeros(1), 1, 0)
    paths.recv(torch.zeros(1), 1, 0)
    paths.barrier()
    assert staged.calls == ["allreduce", "reduce", "reduce_scatter_from", "barrier"], staged.calls
    assert device.calls == ["broadcast", "allreduce", "send", "recv"], device.calls


def test_the_staged_limits_are_measured_per_collective_and_the_setting_overrides_them_all(monkeypatch):
    from hpccomm import config

    assert config._read().cuda_staged_max_bytes is None
    limits = config.cuda_staged_limits(config._read())
    # From the H100 acceptance run of 2026-11-27 (hpccomm/config.py says how): UCC from 16 MiB all-reduces on.
    assert limits["all_reduce"] == 4 << 20 and limits["reduce_scatter"] is None, limits
    staged, device = Recorder(), Recorder()
    paths = BySize(staged, device, limits)
    paths.allreduce([torch.empty((4 << 20) // 4)], None)
    paths.allreduce([torch.empty((4 << 20) // 4 + 1)], None)
    big = torch.empty(16 << 20)
    paths.reduce_scatter_from(torch.empty((16 << 20) // 2), big, None)  # never faster on UCC there: staged
    paths.reduce(big, 0, None)  # never timed on a GPU: staged
    paths.alltoall_single(torch.zeros(2), torch.zeros(2), [1, 1], [1, 1])  # 8 bytes: UCC, at every size
    assert staged.calls == ["allreduce", "reduce_scatter_from", "reduce"], staged.calls
    assert device.calls == ["allreduce", "alltoall_single"], device.calls
    always_staged = BySize(Recorder(), Recorder(), {**limits, "all_to_all": None})
    always_staged.alltoall_single(torch.zeros(1 << 20), torch.zeros(1 << 20), [1 << 19] * 2, [1 << 19] * 2)
    assert always_staged.staged.calls == ["alltoall_single"], "an all-to-all on a path never chosen for it"
    monkeypatch.setenv("HPCCOMM_CUDA_STAGED_MAX_BYTES", "64")
    assert set(config.cuda_staged_limits(config._read()).values()) == {64}
    monkeypatch.setenv("HPCCOMM_CUDA_STAGED_MAX_BYTES", "0")
    assert config._read().cuda_staged_max_bytes == 0
    monkeypatch.setenv("HPCCOMM_CUDA_STAGED_MAX_BYTES", "1MiB")
    with pytest.raises(ValueError, match="HPCCOMM_CUDA_STAGED_MAX_BYTES='1MiB' is not a whole number of bytes"):
        config._read()
    monkeypatch.delenv("HPCCOMM_CUDA_STAGED_MAX_BYTES")
    assert config._read().ucc_triggered is False
    monkeypatch.setenv("HPCCOMM_UCC_TRIGGERED", "1")
    assert config._read().ucc_triggered is True


def test_the_in_place_setting(monkeypatch):
    from hpccomm import config

    assert config._read().ucc_in_place == "scratch"
    for mode in ("native", "tuned", "SCRATCH"):
        monkeypatch.setenv("HPCCOMM_UCC_IN_PLACE", mode)
        assert config._read().ucc_in_place == mode.lower()
    monkeypatch.setenv("HPCCOMM_UCC_IN_PLACE", "inplace")
    with pytest.raises(ValueError, match="HPCCOMM_UCC_IN_PLACE='inplace'; use scratch, native, tuned"):
        config._read()


def test_ucc_settings_the_choices_need_are_set_before_ucc_starts_unless_the_user_set_them(monkeypatch, caplog):
    # UCC reads its settings once, in ucc_init at the first context, whichever group makes it: they are set
    # where UCC is loaded, before MPI starts (HPCCOMM_UCC_TRIGGERED=1: the executor as one preloaded kernel).
    import os

    from hpccomm import config, ucc
    from hpccomm.transports import device_routes

    loaded = []
    monkeypatch.setattr(ucc, "load", lambda: loaded.append(True))
    monkeypatch.setattr(device_routes, "_cuda_available", lambda: True)  # as on a GPU machine
    names = ("UCC_EC_CUDA_USE_COOPERATIVE_LAUNCH", "UCC_TL_UCP_ALLREDUCE_SRA_KN_PIPELINE",
             "UCC_MC_CUDA_MPOOL_ELEM_SIZE")
    for name in names:
        monkeypatch.delenv(name, raising=False)  # and whatever the test sets is gone after it

    def load_with(**variables: str) -> dict[str, str | None]:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(device_routes, "settings", config._read())
        device_routes.load_ucc_first()
        return {name: os.environ.get(name) for name in names}

    assert load_with(HPCCOMM_TRANSPORT="cuda:ucc") == dict.fromkeys(names) and loaded == [True]
    assert "CUDA_MODULE_LOADING" not in caplog.text
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    assert load_with(HPCCOMM_UCC_TRIGGERED="1")["UCC_EC_CUDA_USE_COOPERATIVE_LAUNCH"] == "y"
    assert "HPCCOMM_UCC_TRIGGERED=1 without CUDA_MODULE_LOADING=EAGER" in caplog.text  # lazy loading: warned
    caplog.clear()
    load_with(CUDA_MODULE_LOADING="EAGER")
    assert "CUDA_MODULE_LOADING" not in caplog.text, caplog.text
    chosen = load_with(UCC_EC_CUDA_USE_COOPERATIVE_LAUNCH="n", HPCCOMM_UCC_IN_PLACE="tuned")
    assert chosen == {names[0]: "n", names[1]: "n", names[2]: "64Mb"}, chosen  # the user's choice stays
    monkeypatch.delenv(names[2])
    assert load_with(HPCCOMM_TRANSPORT="cuda:staged")[names[2]] is None and loaded == [True] * 4  # no UCC: untouched
    # UCC for CPU tensors alone: loaded, and its settings for CUDA tensors left alone.
    assert load_with(HPCCOMM_TRANSPORT="cpu:ucc,cuda:staged")[names[2]] is None and loaded == [True] * 5


# -- triggered posts: UCC's status while the stream has not reached the collective ---------------


class ScriptedLib:
    """The binding's ``lib`` as Request initialises and polls it: statuses from a script (UCC's values)."""

    UCC_OK, UCC_INPROGRESS, UCC_OPERATION_INITIALIZED = 0, 1, 2

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = iter(statuses)
        self.polls = 0

    def hpccomm_ucc_init(self, team: object, args: object, cell: list[object]) -> int:
        cell[0] = object()  # the request's handle
        return self.UCC_OK

    def hpccomm_ucc_poll(self, context: object, handle: object) -> int:
        self.polls += 1
        return next(self.statuses)


def scripted_request(lib: ScriptedLib):
    """An hpccomm.ucc.Request, initialised, whose polls read ``lib``'s script (the real: tests/ranks/ucc_binding.py).

    Its ``live`` set (its team's) holds it until it ends.
    """
    from types import SimpleNamespace

    from hpccomm.ucc import Request

    binding = SimpleNamespace(lib=lib, ffi=SimpleNamespace(new=lambda kind: [None]))
    context = SimpleNamespace(binding=binding, lock=threading.Lock(), handle=None)
    live: set[object] = set()
    request = Request(context, object(), live, None, torch.zeros(1), post=False)
    assert live == {request} and request.status == lib.UCC_OPERATION_INITIALIZED
    return request


def test_a_triggered_request_is_in_progress_while_ucc_reports_it_initialized():
    # After ucc_collective_triggered_post, UCC says UCC_OPERATION_INITIALIZED until the stream reaches the
    # collective, then UCC_INPROGRESS, then UCC_OK: the first two are "not done", never an end or an error.
    lib = ScriptedLib([2, 2, 2, 1, 1, 0])
    request = scripted_request(lib)
    device = FakeDevice()
    device.hold(device.side)
    pending = TriggeredPending(device, UCCPending([request], (), "all_reduce"))
    for _ in range(5):
        assert not pending.test(), "done while UCC still reported the request initialized or in progress"
    assert request.status == lib.UCC_OPERATION_INITIALIZED or request.status == lib.UCC_INPROGRESS
    assert not pending.test(), "done before its local steps landed on the side stream"  # the request ended
    assert request.status == lib.UCC_OK and request._keep is None and not request._live
    device.release(device.side)
    assert pending.test()
    pending.finish()  # UCC_OK: no error
    assert lib.polls == 6 and pending.path == "ucc-triggered"


class GenericTriggeredLib(ScriptedLib):
    """UCC's generic triggered post (tl/ucp) over the simulated device, as UCC 1.8's src/core/ucc_coll.c runs it.

    ``ucc_collective_triggered_post`` queues nothing on the stream. The first
    progress after it (``ucc_trigger_test``) starts the executor on the
    engine's stream (the gate stream): a kernel that spins there until the
    host stops it, which UCC does as the collective ends (its result written
    by then). ``spinning`` says whether the executor's kernel is on that stream
    now: a kernel launched for the first time meanwhile may wait for it
    forever (lazy loading).
    """

    def __init__(self, device: FakeDevice, polls: int, result: torch.Tensor, value: float) -> None:
        super().__init__([self.UCC_OPERATION_INITIALIZED] + [self.UCC_INPROGRESS] * (polls - 2) + [self.UCC_OK])
        self.device, self.result, self.value = device, result, value
        self.stop = None
        self.spinning = False

    def hpccomm_ucc_poll(self, context: object, handle: object) -> int:
        status = super().hpccomm_ucc_poll(context, handle)
        if self.stop is None:
            self.stop, self.spinning = self.device.stall(self.device.gate), True  # the executor starts
        if status == self.UCC_OK:
            self.result.fill_(self.value)  # the collective's result, in the scratch
            self.stop()  # executor stop: the kernel leaves the gate stream
            self.spinning = False
        return status


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "async"])
@pytest.mark.parametrize("late", [False, True], ids=["on-time", "late"])
def test_a_triggered_reductions_copy_back_follows_the_collective_and_launches_nothing_while_ucc_spins(
    blocking, late
):
    # The H100's triggered all-reduce through the scratch: queued at the call (as before), the copy back ran on
    # the side stream ahead of UCC's executor, which the generic path starts only at the first progress, and
    # copied the scratch before the collective had written it; queued as UCC's post event appears, it would be
    # a first launch behind a spinning kernel. Now it is queued once the request has ended.
    device = FakeDevice(late=late)
    work, out = torch.zeros(4), torch.full((4,), -1.0)
    lib = GenericTriggeredLib(device, polls=4, result=out, value=3.0)
    request = scripted_request(lib)
    launched_while_spinning = []
    call_on = device.call_on

    def watched(stream, queue_work):
        launched_while_spinning.append(lib.spinning)
        call_on(stream, queue_work)

    device.call_on = watched
    copy_back = lambda: device.copy([(work, out)], device.current_stream())  # noqa: E731 (Scratch.take's)
    pending = TriggeredPending(device, UCCPending([request], [copy_back], "all_reduce"))
    test = pending.test_inline if blocking else pending.test
    for _ in range(200):
        if test():
            break
        device.run()
    else:
        pytest.fail("never ended")
    device.synchronize()
    pending.finish()
    assert launched_while_spinning == [False], launched_while_spinning
    assert work.tolist() == [3.0] * 4, "the copy back ran ahead of the collective"
    assert lib.polls == 4
