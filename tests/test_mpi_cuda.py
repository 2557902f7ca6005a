"""CUDA tensors through a CUDA-aware MPI (hpccomm/transports/mpi_cuda.py), without a GPU.

Every operation through the host-gated MPI path over real MPI on host
memory, the device simulated (tests/ranks/device_paths.py with
``DEVICE_PATH=mpi``): the deferred MPI calls, their call order, completion
once landed, any-source receives. The deferral in isolation, and what a
machine whose MPI is not CUDA-aware is told. No machine of this project has a
CUDA-aware MPI, so the path has not run on device memory.
"""

from __future__ import annotations

import pytest
from fake_device import FakeDevice
from launch import assert_all_ranks_ok, run_ranks

from hpccomm.transports.call_order import CallOrder
from hpccomm.transports.mpi_cuda import GatedComm

# Its result is the same under every torch release and MPI: CI runs it in its first step only (.ci/run).
pytestmark = pytest.mark.one_environment


@pytest.mark.parametrize("nprocs", [2, 3])
def test_every_operation_on_mpi_gated_by_the_callers_stream(nprocs):
    assert_all_ranks_ok(run_ranks(nprocs, "device_paths.py", env={"DEVICE_PATH": "mpi"}), nprocs)


class Communicator:
    """Records the nonblocking calls made on it (a stand-in for an MPI communicator; the real one is above)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def Get_size(self) -> int:  # noqa: N802
        return 2

    def Iallreduce(self, *args):  # noqa: N802
        self.calls.append(("Iallreduce", args))
        if args == ("refused",):
            raise ValueError("MPI refused it")
        return Request()


class Request:
    def Test(self, status=None) -> bool:  # noqa: N802
        return True


def test_a_call_is_made_only_once_the_callers_stream_is_there_in_call_order():
    device, order, comm = FakeDevice(), CallOrder(), Communicator()
    gated = GatedComm(comm, device, order)
    assert gated.Get_size() == 2  # not an I* call: the communicator's own
    device.hold(device.user)
    first, second = gated.Iallreduce("a"), gated.Iallreduce("b")
    assert not second.Test() and not first.Test() and comm.calls == []
    device.release(device.user)
    assert second.Test() and first.Test()
    assert comm.calls == [("Iallreduce", ("a",)), ("Iallreduce", ("b",))]


def test_a_refused_call_raises_from_its_test_and_the_next_one_is_still_made():
    device, order, comm = FakeDevice(), CallOrder(), Communicator()
    gated = GatedComm(comm, device, order)
    refused, ok = gated.Iallreduce("refused"), gated.Iallreduce("ok")
    with pytest.raises(ValueError, match="MPI refused it"):
        refused.Test()
    assert ok.Test() and len(comm.calls) == 2


def test_where_the_mpi_is_not_cuda_aware_the_log_says_how_cuda_tensors_still_move(monkeypatch):
    from hpccomm.transports import device_routes

    monkeypatch.setattr(device_routes, "_cuda_available", lambda: True)  # the reason as a GPU machine gives it
    reason = device_routes._why_none("cuda", "mpi")
    assert reason.startswith("this MPI is not CUDA-aware (MPIX_Query_cuda_support() is 0)"), reason
    assert "HPCCOMM_TRANSPORT=cuda:staged" in reason
