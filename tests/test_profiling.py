"""hpccomm in torch.profiler's traces: a span per operation, and its metadata under NCCL's field names.

One 2-rank job (tests/ranks/profiling.py) runs a short DDP training and a few
other operations under ``torch.profiler``, once recording shapes and once not,
and writes each rank's Chrome trace; this test reads the traces as a user's
tool would.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hpccomm.registration import _backend_is_subclassable
from launch import assert_all_ranks_ok, run_ranks

NPROCS = 2
#: The DDP model's parameters: Linear(16, 8) and Linear(8, 4), weights and biases.
PARAMS = 16 * 8 + 8 + 8 * 4 + 4
#: Paths a CPU operation can take on one node.
CPU_PATHS = {"mpi", "shm", "hierarchical"}
STEPS = 3


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces")
    run = run_ranks(NPROCS, "profiling.py", str(out))
    assert_all_ranks_ok(run, NPROCS)
    loaded = {}
    for name in ("shapes", "plain"):
        for rank in range(NPROCS):
            events = json.loads((out / f"{name}-{rank}.json").read_text())["traceEvents"]
            loaded[name, rank] = [event for event in events if event.get("ph") == "X"]
    return run, loaded


PARAMS_EVENT = "hpccomm:record_param_comms"


def spans(events, op=None):
    """The operations' spans (of ``op``), each with the arguments of its metadata event."""
    ordered = sorted(events, key=lambda e: e["ts"])
    found = [e for e in ordered if e["name"].startswith("hpccomm:") and e["name"] != PARAMS_EVENT]
    metadata = [e for e in ordered if e["name"] == PARAMS_EVENT]
    assert len(found) == len(metadata), (len(found), len(metadata))
    paired = []
    for span, params in zip(found, metadata):  # made in the same order, the metadata at the span's start
        assert span["tid"] == params["tid"] and span["ts"] <= params["ts"] <= span["ts"] + span["dur"], (span, params)
        paired.append(dict(span, args=params.get("args", {})))
    return [e for e in paired if op is None or e["name"] == f"hpccomm:{op}"]


def test_no_span_is_opened_without_a_profiler(traces):
    run, loaded = traces
    found = re.findall(r"BEGIN rank=(\d) outside=(\d+) inside=(\d+)", run.output)
    assert len(found) == NPROCS, run.output[-3000:]
    for rank, outside, inside in found:
        assert outside == "0", f"rank {rank} opened {outside} spans with no profiler recording"
        recorded = len(spans(loaded["shapes", int(rank)])) + len(spans(loaded["plain", int(rank)]))
        assert int(inside) == recorded, (rank, inside, recorded)


@pytest.mark.parametrize("rank", range(NPROCS))
def test_each_ddp_backward_shows_its_all_reduce_with_torchs_fields(traces, rank):
    events = traces[1]["shapes", rank]
    reduces = [e for e in spans(events, "all_reduce") if e["args"]["In msg nelems"] == PARAMS]
    assert len(reduces) == STEPS, [e["name"] for e in spans(events)]
    for span in reduces:
        args = span["args"]
        assert args["Collective name"] == "allreduce"
        assert args["dtype"] == "Float"
        assert args["In msg nelems"] == args["Out msg nelems"] == PARAMS
        assert args["Group size"] == NPROCS
        assert args["Process Group Ranks"] == "[0, 1]"
        assert args["Process Group Description"] == "default_pg"
        assert args["Rank"] == rank
        assert args["Is asynchronized op"] == 1  # DDP's bucket all-reduce is asynchronous
        assert args["Path"] in CPU_PATHS
        assert span["dur"] > 0


@pytest.mark.parametrize("rank", range(NPROCS))
def test_every_operation_has_its_counts_root_peer_and_sequence(traces, rank):
    events = traces[1]["shapes", rank]
    (gather,) = spans(events, "all_gather_into_tensor")
    assert (gather["args"]["Collective name"], gather["args"]["In msg nelems"], gather["args"]["Out msg nelems"]) == (
        "_allgather_base", 3, 3 * NPROCS)
    (alltoall,) = spans(events, "all_to_all_single")
    sends = [rank + 1 + peer for peer in range(NPROCS)]
    receives = [peer + 1 + rank for peer in range(NPROCS)]
    assert alltoall["args"]["Collective name"] == "all_to_allv"  # NCCL's name when split sizes are given
    assert alltoall["args"]["In split size"] == str(sends)
    assert alltoall["args"]["Out split size"] == str(receives)
    assert alltoall["args"]["In msg nelems"] == sum(sends)
    # The blocking broadcast from the last rank: NCCL's "Rank" is the root.
    (broadcast,) = [e for e in spans(events, "broadcast") if e["args"]["Is asynchronized op"] == 0]
    assert broadcast["args"]["Rank"] == NPROCS - 1
    peer_op, field = ("send", "Dst Rank") if rank == 0 else ("recv", "Src Rank")
    (p2p,) = spans(events, peer_op)
    assert p2p["args"][field] == 1 - rank
    numbers = [e["args"]["Seq"] for e in sorted(spans(events), key=lambda e: e["ts"])]
    assert numbers == sorted(set(numbers)), numbers  # one number per operation, in call order


@pytest.mark.parametrize("rank", range(NPROCS))
def test_spans_are_on_the_calling_thread_inside_the_call(traces, rank):
    events = traces[1]["shapes", rank]
    (caller,) = {e["tid"] for e in events if e["name"] == "DistributedDataParallel.forward"}
    assert {e["tid"] for e in spans(events)} == {caller}
    calls = [e for e in events if e["name"].startswith("c10d::")]
    if not _backend_is_subclassable():
        # torch <= 2.13 calls hpccomm's Python ProcessGroup directly: its trace has no c10d:: events, and
        # hpccomm's spans are all it shows of the communication.
        assert not calls, {e["name"] for e in calls}
        return
    for span in spans(events):
        enclosing = [c for c in calls if c["tid"] == span["tid"] and c["ts"] <= span["ts"] <= c["ts"] + c["dur"]]
        assert enclosing, f"{span['name']} starts outside every c10d:: call on its thread"
        if span["args"]["Is asynchronized op"] == 0:
            call = enclosing[-1]
            assert span["ts"] + span["dur"] <= call["ts"] + call["dur"] + 1, span["name"]


@pytest.mark.parametrize("rank", range(NPROCS))
def test_an_async_span_ends_when_the_operation_completes_not_later(traces, rank):
    events = traces[1]["shapes", rank]
    (gather,) = spans(events, "all_gather_into_tensor")
    (waited,) = [e for e in events if e["name"] == "waited"]
    assert gather["ts"] < waited["ts"]
    assert gather["ts"] + gather["dur"] <= waited["ts"] + waited["dur"], "the span outlived the wait() that completed it"
    # Completed by the progress thread, at the latest while the caller slept (it may be done before the sleep
    # began): the span ends then, not when the profiler stops.
    late = [e for e in spans(events, "all_reduce") if e["args"]["In msg nelems"] == 3]
    (idle,) = [e for e in events if e["name"] == "idle"]
    assert len(late) == 1 and late[0]["ts"] + late[0]["dur"] < idle["ts"] + idle["dur"], (late, idle)


def test_without_shapes_the_spans_are_there_without_fields(traces):
    _, loaded = traces
    for rank in range(NPROCS):
        shaped, plain = spans(loaded["shapes", rank]), spans(loaded["plain", rank])
        assert sorted(e["name"] for e in plain) == sorted(e["name"] for e in shaped)
        assert not any("Collective name" in e.get("args", {}) for e in plain)


def test_the_example_writes_each_ranks_trace_and_draws_a_step(tmp_path):
    """examples/profile_ddp.py, which made the picture in docs/observability.md."""
    example = Path(__file__).parents[1] / "examples" / "profile_ddp.py"
    picture = tmp_path / "step.png"
    run = run_ranks(NPROCS, str(example), "--out", str(tmp_path), "--steps", "1", "--plot", str(picture))
    assert run.returncode == 0 and not run.timed_out, run.output[-4000:]
    for rank in range(NPROCS):
        events = json.loads((tmp_path / f"rank{rank}.json").read_text())["traceEvents"]
        assert [e for e in events if e.get("name", "").startswith("ProfilerStep#")], "no step marked for HTA"
        assert spans([e for e in events if e.get("ph") == "X"], "all_reduce"), "no hpccomm:all_reduce span"
    assert picture.read_bytes().startswith(b"\x89PNG"), "no picture drawn"


def test_every_pending_names_the_path_that_serves_it():
    """The profiler's ``Path`` comes from each Pending class: one without a path would show its class name."""
    import importlib
    import inspect
    import pkgutil

    import hpccomm
    from hpccomm.profiling import path_of
    from hpccomm.transports.device_gated import GatedPending
    from hpccomm.transports.mpi import MPIPending

    modules = [importlib.import_module(info.name)
               for info in pkgutil.walk_packages(hpccomm.__path__, "hpccomm.")
               if not info.name.startswith(("hpccomm.cli", "hpccomm.ucc"))]
    pendings = {cls for module in modules for _, cls in inspect.getmembers(module, inspect.isclass)
                if cls.__module__ == module.__name__ and callable(getattr(cls, "finish", None))
                and ("test" in getattr(cls, "__slots__", ()) or callable(getattr(cls, "test", None)))
                and cls.__name__ != "Pending"}
    assert len(pendings) >= 10, sorted(cls.__name__ for cls in pendings)
    assert all(hasattr(cls, "path") for cls in pendings), [cls.__name__ for cls in pendings if not hasattr(cls, "path")]
    # A device operation is named for the transport that moves its data (UCC, or CUDA-aware MPI).
    assert path_of(GatedPending(None, 0, None, MPIPending([], []))) == "mpi"


def test_an_operation_goes_on_where_the_profiler_refuses_its_events(monkeypatch, capsys):
    """The operation is already posted when its span opens: a failure there must not fail it (peers wait on it)."""
    import torch
    from hpccomm import profiling
    from torch.profiler import ProfilerActivity, profile

    class Unreadable:
        _rank, _group_name = 0, "0"

        def global_ranks(self):
            raise RuntimeError("no ranks to read")

    monkeypatch.setattr(profiling, "_refused", False)
    with profile(activities=[ProfilerActivity.CPU]):
        for _ in range(2):
            assert profiling.begin("all_reduce", Unreadable(), 1, object(), [torch.ones(1)], [], False, None, -1) is None
    assert capsys.readouterr().err.count("refused an operation's events") == 1
