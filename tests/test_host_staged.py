"""The host-staged device path's ordering and lifetime logic, on the CPU (hpccomm/transports/host_staged.py).

A device tensor's operation must: read its inputs only after the caller's
stream has produced them; post the host communication in call order, whoever
tests first; complete only once the results have landed; keep every tensor
until then; fail (not hang) on errors, timeouts and aborts. These tests drive
the transport through the DeviceOps seam with tests/fake_device.py, whose
streams a test can hold, and a scripted host transport; the every-op values
with real MPI are tests/ranks/device_paths.py (below); on a GPU, tests/gpu.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path

import pytest
import torch
from fake_device import FakeDevice
from launch import assert_all_ranks_ok, run_ranks

from hpccomm.ledger import Ledger
from hpccomm.transports import Transport
from hpccomm.transports.host_staged import HostStagedTransport
from hpccomm.work import CommTimeoutError, GroupClosedError, HpcWork, complete_inline

SUM = object()  # the scripted host ignores the reduction; the staged transport passes it on untouched

# Its result is the same under every torch release and MPI: CI runs it in its first step only (.ci/run).
pytestmark = pytest.mark.one_environment


class Gate:
    """A host operation's Pending: completes when opened; its finish doubles the host tensors (a stand-in result)."""

    def __init__(self, tensors: list[torch.Tensor], error: Exception | None = None) -> None:
        self.tensors = tensors
        self.open = False
        self.error = error

    def test(self) -> bool:
        if self.error is not None:
            raise self.error
        return self.open

    def finish(self) -> None:
        for tensor in self.tensors:
            tensor.mul_(2)


class ScriptedHost(Transport):
    """A CPU transport that records what is posted, with what values, and hands out Gates."""

    def __init__(self, fail_posts: int = 0) -> None:
        self.posts: list[tuple[str, list[float]]] = []
        self.gates: list[Gate] = []
        self.fail_posts = fail_posts
        self.closed = False

    def _post(self, op: str, tensors: list[torch.Tensor]) -> Gate:
        if self.fail_posts:
            self.fail_posts -= 1
            raise ValueError(f"hpccomm {op}: refused by the host transport")
        self.posts.append((op, [t.sum().item() for t in tensors]))
        gate = Gate(tensors)
        self.gates.append(gate)
        return gate

    def allreduce(self, tensors, reduction):
        assert reduction is SUM
        return self._post("all_reduce", list(tensors))

    def send(self, tensor, peer, tag):
        return self._post("send", [tensor])

    def recv(self, tensor, peer, tag):
        gate = self._post("recv", [tensor])
        gate.source_rank = 2
        return gate

    def close(self, in_flight=False):
        self.closed = True


class Group:
    """What a Work's label needs of its group."""

    closed: str | None = None
    ledger = Ledger("test", (0,), (0,))

    def global_ranks(self) -> tuple[int, ...]:
        return (0,)

    def mpi_ranks(self) -> tuple[int, ...]:
        return (0,)

    def describe(self) -> str:
        return "group 'test' (1 ranks)"


def staged(fail_posts: int = 0, capturing: bool = False) -> tuple[HostStagedTransport, FakeDevice, ScriptedHost]:
    device, host = FakeDevice(capturing=capturing), ScriptedHost(fail_posts)
    return HostStagedTransport(host, device), device, host


def test_inputs_are_read_only_after_the_callers_queued_work():
    transport, device, host = staged()
    x = torch.zeros(4)
    device.hold(device.user)
    device.launch(device.user, lambda: x.fill_(3))  # a kernel the caller queued before the collective
    pending = transport.allreduce([x], SUM)
    assert not pending.test() and host.posts == [], "posted before the caller's stream produced the input"
    device.release(device.user)
    assert not pending.test()
    assert host.posts == [("all_reduce", [12.0])], host.posts  # the produced values, not the zeros
    host.gates[0].open = True
    assert pending.test()
    pending.finish()
    assert x.tolist() == [6.0] * 4


def test_the_work_completes_only_once_the_results_have_landed():
    transport, device, host = staged()
    x = torch.ones(3)
    pending = transport.allreduce([x], SUM)
    assert not pending.test()
    device.hold(device.side)  # the copy back will queue behind this
    host.gates[0].open = True
    assert not pending.test(), "completed before the copy back ran"
    assert x.tolist() == [1.0] * 3
    device.release(device.side)
    assert pending.test()
    assert x.tolist() == [2.0] * 3


def test_a_copy_back_waits_for_no_kernel_the_caller_queued_after_the_call():
    # One stream that both waited on the caller's stream for each call's inputs and copied results back put an
    # operation's copy back behind the next call's wait: behind the caller's kernels queued between the two calls.
    transport, device, host = staged()
    x = torch.ones(3)
    first = transport.allreduce([x], SUM)
    assert not first.test() and len(host.posts) == 1
    finish_kernel = device.stall(device.user)  # a long kernel, queued after the call
    later = torch.ones(2)
    second = transport.allreduce([later], SUM)  # its inputs wait for that kernel
    host.gates[0].open = True
    try:
        assert first.test(), "the copy back waited for a kernel the caller queued after the call"
        assert x.tolist() == [2.0] * 3
        assert not second.test() and len(host.posts) == 1, "posted before the caller's stream produced the input"
    finally:
        finish_kernel()
    assert not second.test() and len(host.posts) == 2
    host.gates[1].open = True
    assert second.test() and later.tolist() == [2.0] * 2


def test_a_blocking_call_ends_once_its_copy_back_is_queued_on_the_callers_stream():
    transport, device, host = staged()
    x = torch.ones(3)
    pending = transport.allreduce([x], SUM)
    device.hold(device.user)  # the caller's stream is busy: the copy back must queue behind its work
    host.gates[0].open = True
    complete_inline(pending, ("all_reduce", Group(), 1, None, 1), 5.0)
    assert x.tolist() == [1.0] * 3, "the copy back ran before the caller's queued work"
    assert device.user.tasks, "nothing was queued on the caller's stream"
    device.release(device.user)
    assert x.tolist() == [2.0] * 3
    assert device.trace[-1] == ("copy", "user"), device.trace


def test_posts_follow_call_order_whichever_work_is_tested_first():
    transport, device, host = staged()
    a, b = torch.full((2,), 1.0), torch.full((2,), 5.0)
    device.hold(device.user)
    first = transport.allreduce([a], SUM)
    second = transport.allreduce([b], SUM)
    device.release(device.user)
    assert not second.test()  # the progress thread may reach the later work first
    assert [values for _op, values in host.posts] == [[2.0], [10.0]], host.posts
    for gate in host.gates:
        gate.open = True
    assert first.test() and second.test()


def test_a_refused_post_fails_its_work_and_the_next_one_still_runs():
    transport, device, host = staged(fail_posts=1)
    refused = transport.allreduce([torch.ones(2)], SUM)
    after = torch.ones(2)
    ok = transport.allreduce([after], SUM)
    assert refused.test()
    with pytest.raises(ValueError, match="refused by the host transport"):
        refused.finish()
    host.gates[0].open = True
    assert ok.test()
    ok.finish()
    assert after.tolist() == [2.0, 2.0]


def test_a_host_error_fails_the_work_and_writes_nothing():
    transport, device, host = staged()
    x = torch.ones(2)
    pending = transport.allreduce([x], SUM)
    pending.test()
    host.gates[0].error = RuntimeError("peer left")
    assert pending.test()
    with pytest.raises(RuntimeError, match="peer left"):
        pending.finish()
    assert x.tolist() == [1.0, 1.0]


def test_graph_capture_is_refused_before_anything_is_queued():
    transport, device, host = staged(capturing=True)
    with pytest.raises(RuntimeError, match="graph capture"):
        transport.allreduce([torch.ones(2)], SUM)
    assert not device.side.tasks and not device.user.tasks and host.posts == []


def test_tensors_are_held_until_the_work_completes():
    transport, device, host = staged()
    x = torch.ones(8)
    gone = weakref.ref(x)
    device.hold(device.user)
    pending = transport.send(x, 1, 0)
    del x  # the caller drops its tensor at once (an async send)
    gc.collect()
    assert gone() is not None, "the tensor was released while its copy was still queued"
    device.release(device.user)
    assert not pending.test()  # posted now
    host.gates[0].open = True
    assert pending.test()
    pending.finish()
    del pending
    gc.collect()
    assert gone() is None, "the tensor was kept after the work completed"


def test_a_receive_reports_its_source_and_writes_its_tensor():
    transport, device, host = staged()
    out = torch.zeros(2)
    pending = transport.recv(out, None, 0)
    pending.test()
    host.gates[0].tensors[0].fill_(4)  # what arrived in the host buffer
    host.gates[0].open = True
    assert pending.test()
    pending.finish()
    assert out.tolist() == [8.0, 8.0] and pending.source_rank == 2


def test_a_blocking_operation_that_never_completes_times_out():
    transport, _device, _host = staged()
    pending = transport.allreduce([torch.ones(2)], SUM)
    with pytest.raises(CommTimeoutError, match="Timed out waiting"):
        complete_inline(pending, ("all_reduce", Group(), 1, None, 1), 0.2)


def test_an_aborted_group_ends_the_wait():
    transport, device, _host = staged()
    device.hold(device.user)  # never released: the input copy never happens
    group = Group()
    work = HpcWork(transport.allreduce([torch.ones(2)], SUM), [], ("all_reduce", group, 1, None, 1), 30.0)
    group.closed = "aborted"
    with pytest.raises(GroupClosedError, match="aborted"):
        work.wait()


def test_close_closes_the_host_transport():
    transport, _device, host = staged()
    transport.close()
    assert host.closed


@pytest.mark.parametrize("nprocs", [2, 3])
def test_every_operation_through_host_memory_with_mpi(nprocs):
    # Real MPI under the staged transport, the device simulated: values of every op, async
    # interleaving, one rank's inputs delayed while the others post, completion only once landed.
    assert_all_ranks_ok(run_ranks(nprocs, "device_paths.py"), nprocs)


@pytest.mark.one_environment
def test_the_staged_cost_benchmark_runs_over_its_own_device_seam():
    # benchmarks/staged_host_cost.py implements DeviceOps itself (FreeOps); a method the staged path came to
    # call (keep_out_of_captures) once broke it at its start, with no test to say so.
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "staged_host_cost.py"
    proc = subprocess.run([sys.executable, str(script), "--iters", "5", "--rounds", "1"], capture_output=True,
                          text=True, timeout=120, cwd=tempfile.gettempdir())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "hpccomm's own, for a device tensor" in proc.stdout, proc.stdout[-2000:]


# -- routing on a machine without a GPU ----------------------------------------------------


def test_without_a_gpu_only_the_cpu_is_registered_and_the_log_says_why_cuda_has_no_route():
    from hpccomm.transports import device_routes

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: tests/gpu covers CUDA routing")
    assert device_routes.devices() == ["cpu"]
    assert device_routes._why_none("cuda", "auto") == "torch sees no CUDA device"


def test_staged_is_refused_for_cpu_tensors_with_the_setting_to_write():
    from hpccomm import config

    with pytest.MonkeyPatch.context() as env:
        env.setenv("HPCCOMM_TRANSPORT", "cuda:staged")
        assert dict(config._transports("HPCCOMM_TRANSPORT")) == {"cpu": "auto", "cuda": "staged"}
        for value in ("staged", "cpu:staged"):
            env.setenv("HPCCOMM_TRANSPORT", value)
            with pytest.raises(ValueError, match="'staged' moves CUDA tensors only; write cuda:staged"):
                config._transports("HPCCOMM_TRANSPORT")
