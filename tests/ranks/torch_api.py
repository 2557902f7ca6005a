"""torch's group API on an hpccomm group, in whichever shell the installed torch takes.

On torch >= 2.14 (hpccomm a Backend that torch's ProcessGroup wraps):
split_group, new_group split from a default group with a bound device,
batch_isend_irecv through coalescing, receive from any rank, set_timeout,
abort hooks, the supports_* flags and the errors of what hpccomm does not
offer, the flight recorder's record of hpccomm's operations. On torch <= 2.13
(hpccomm a ProcessGroup): torch.distributed._dist2's new_group, its context
manager and collectives on the group it makes. ``--bound-device`` starts the
default group with ``device_id=cpu:0`` (torch then splits new groups from it);
``--backend=STRING`` passes another backend string, such as
``cpu:hpccomm,cuda:nccl``. Where torch 2.14 offers less than 2.15 (CPU groups
neither split nor bound; no flight recorder for plugin backends), the checks
assert torch's refusal instead.
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import sys
from datetime import timedelta

import hpccomm  # noqa: F401  (registers the backend)
import torch
import torch.distributed as dist
from hpccomm.groups import front_of
from hpccomm.registration import BACKEND_SHAPE
from rankcheck import check, expect_error, run_all

#: torch 2.15 splits and binds a default group on the CPU; 2.14, like 2.13, binds a group only to an
#: accelerator (device_id) and splits only a bound one, for every backend. What torch does, by release.
CPU_GROUPS_SPLIT = torch.torch_version.TorchVersion(torch.__version__) >= "2.15"
#: torch 2.15 records plugin backends' operations in its flight recorder; 2.14 records none.
RECORDS_PLUGINS = CPU_GROUPS_SPLIT
BOUND = "--bound-device" in sys.argv
BACKEND = next((arg.split("=", 1)[1] for arg in sys.argv if arg.startswith("--backend=")), "hpccomm")
if BOUND and not CPU_GROUPS_SPLIT:
    expect_error(ValueError, "accelerator", lambda: dist.init_process_group(BACKEND, device_id=torch.device("cpu", 0)))
dist.init_process_group(BACKEND, device_id=torch.device("cpu", 0) if BOUND and CPU_GROUPS_SPLIT else None)
RANK, SIZE = dist.get_rank(), dist.get_world_size()
WORLD = dist.group.WORLD


def summed(group: dist.ProcessGroup, value: float = 1.0) -> float:
    t = torch.full((3,), value)
    dist.all_reduce(t, group=group)
    return t[0].item()


@check
def the_shape_follows_what_torch_offers() -> None:
    from torch._C._distributed_c10d import Backend

    class Probe(Backend):
        pass

    try:
        Probe(0, 1)
        subclassable = True
    except TypeError:
        subclassable = False
    assert BACKEND_SHAPE == subclassable, (BACKEND_SHAPE, torch.__version__)
    front = front_of(WORLD)
    assert front is not None
    if BACKEND_SHAPE:
        assert type(WORLD) is dist.ProcessGroup, type(WORLD)
        assert WORLD._get_backend(torch.device("cpu")) is front
        assert front.describe().startswith(f"group '{WORLD.group_name}'"), front.describe()
    else:
        assert front is WORLD
    assert dist.get_backend() == BACKEND


@check
def a_mixed_backend_string_gives_cpu_tensors_to_hpccomm() -> None:
    if BACKEND == "hpccomm":
        return
    assert summed(WORLD) == SIZE
    if not BACKEND_SHAPE:
        # torch <= 2.13: hpccomm's ProcessGroup stands for the whole group; the other half is not made.
        assert front_of(WORLD) is WORLD
        return
    devices = {device.type for device in WORLD._device_types}
    assert devices == {"cpu", "cuda"}, devices
    assert WORLD._get_backend(torch.device("cpu")) is front_of(WORLD)
    cuda_backend = WORLD._get_backend(torch.device("cuda"))
    expected = {"gloo": "ProcessGroupGloo", "nccl": "ProcessGroupNCCL"}[BACKEND.split("cuda:")[1].split(",")[0]]
    assert type(cuda_backend).__name__.startswith(expected), type(cuda_backend)


# -- torch >= 2.14: hpccomm as a Backend --------------------------------------------------


def backend_only(fn):  # noqa: ANN001, ANN201
    """Register ``fn`` as a check that runs only where hpccomm is a Backend."""

    def run() -> None:
        if BACKEND_SHAPE:
            fn()

    run.__name__ = fn.__name__
    return check(run)


@backend_only
def split_group_makes_mpi_splits_in_the_given_order() -> None:
    if not CPU_GROUPS_SPLIT:
        # torch refuses before asking any backend, so no rank is left in a half-made split.
        expect_error(RuntimeError, "No device associated with the default pg", lambda: dist.split_group(split_ranks=[[0]]))
        assert summed(WORLD) == SIZE
        return
    halves = [list(range(0, SIZE, 2)), list(range(1, SIZE, 2))]
    halves = [half[::-1] for half in halves if half]  # reversed: the order sets the new ranks
    mine = next(half for half in halves if RANK in half)
    group = dist.split_group(split_ranks=halves, timeout=timedelta(seconds=30))
    assert group is not None and group != dist.GroupMember.NON_GROUP_MEMBER
    assert dist.get_process_group_ranks(group) == mine, (dist.get_process_group_ranks(group), mine)
    assert group.rank() == mine.index(RANK)
    assert summed(group, RANK + 1.0) == sum(r + 1.0 for r in mine)
    backend = group._get_backend(torch.device("cpu"))
    assert backend.global_ranks() == tuple(mine)
    assert backend.options._timeout == timedelta(seconds=30)
    # A rank in no split: torch would crash on the None a Python backend returns; hpccomm says why.
    if SIZE > 1:
        if RANK == 0:
            assert summed(dist.split_group(split_ranks=[[0]])) == 1.0
        else:
            expect_error(RuntimeError, "is in none of the new groups", lambda: dist.split_group(split_ranks=[[0]]))
    dist.destroy_process_group(group)


@backend_only
def new_group_with_a_bound_device_is_split_from_the_default_group() -> None:
    ranks = list(range(SIZE - 1)) or [0]
    group = dist.new_group(ranks)
    if RANK in ranks:
        assert summed(group) == len(ranks)
        dist.destroy_process_group(group)
    else:
        assert group == dist.GroupMember.NON_GROUP_MEMBER
    assert (BOUND and CPU_GROUPS_SPLIT) == (WORLD.bound_device_id is not None)


@backend_only
def batch_isend_irecv_coalesces_into_one_work() -> None:
    assert WORLD._get_backend(torch.device("cpu")).supports_coalescing
    after, before = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    sends = [torch.full((4,), float(RANK * 10 + i)) for i in range(2)]
    recvs = [torch.zeros(4) for _ in range(2)]
    ops = [dist.P2POp(dist.isend, t, after, tag=i) for i, t in enumerate(sends)]
    ops += [dist.P2POp(dist.irecv, t, before, tag=i) for i, t in enumerate(recvs)]
    works = dist.batch_isend_irecv(ops)
    assert len(works) == 1, works
    works[0].wait()
    for i, got in enumerate(recvs):
        assert torch.equal(got, torch.full((4,), float(before * 10 + i))), (i, got)
    # The pipelining schedule's metadata exchange: send_object_list through batch_isend_irecv.
    if SIZE >= 2 and RANK < 2:
        objects = [{"from": RANK}] if RANK == 0 else [None]
        if RANK == 0:
            dist.send_object_list(objects, dst=1, use_batch=True)
        else:
            dist.recv_object_list(objects, src=0, use_batch=True)
            assert objects == [{"from": 0}], objects
    dist.barrier()


@backend_only
def receive_from_any_rank_names_its_source() -> None:
    if SIZE < 2:
        return
    if RANK == 0:
        got = torch.zeros(2)
        sources = sorted(dist.recv(got) for _ in range(SIZE - 1))
        assert sources == list(range(1, SIZE)), sources
    else:
        dist.send(torch.full((2,), float(RANK)), dst=0)
    dist.barrier()


@backend_only
def set_timeout_bounds_later_operations() -> None:
    backend = WORLD._get_backend(torch.device("cpu"))
    before = backend.options._timeout
    WORLD.set_timeout(timedelta(seconds=1.5))
    assert backend.options._timeout == timedelta(seconds=1.5)
    if RANK == 0 and SIZE > 1:
        expect_error(RuntimeError, "Timed out waiting 1500ms", lambda: dist.recv(torch.zeros(1), src=1, tag=99))
    WORLD.set_timeout(before)
    dist.barrier()


@backend_only
def flags_tell_the_truth_and_missing_methods_say_why() -> None:
    backend = WORLD._get_backend(torch.device("cpu"))
    assert backend.supports_splitting and backend.supports_coalescing and backend.supports_abort_hooks
    assert not backend.supports_shrinking and not backend.supports_reconfigure and not backend.supports_window
    expect_error(RuntimeError, "hpccomm new_window", lambda: backend.new_window())
    expect_error(RuntimeError, "hpccomm get_reconfigure_handle", lambda: backend.get_reconfigure_handle())
    expect_error(TypeError, "does not support shrinking", lambda: dist.shrink_group([SIZE - 1]))


@backend_only
def abort_runs_the_abort_hooks_and_fails_later_calls() -> None:
    if BACKEND != "hpccomm":
        return  # torch registers a group's abort hook with each of its backends; Gloo refuses
    group = dist.new_group(list(range(SIZE)))
    ran = []
    group.register_abort_hook(7, lambda: ran.append(7))
    group.register_abort_hook(8, lambda: ran.append(8))
    group.unregister_abort_hook(8)
    assert summed(group) == SIZE
    group.abort()
    assert ran == [7], ran
    expect_error(RuntimeError, "was aborted", lambda: dist.all_reduce(torch.ones(1), group=group))


@backend_only
def the_flight_recorder_records_hpccomm_operations() -> None:
    import pickle

    if not RECORDS_PLUGINS:
        return  # torch 2.14's recorder serves its own C++ backends only
    dist.all_reduce(torch.ones(8))
    dist.broadcast(torch.ones(8), src=0)
    dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(includeCollectives=True, backend="hpccomm"))
    names = [entry["profiling_name"] for entry in dump["entries"]]
    assert names[-2:] == ["hpccomm:all_reduce", "hpccomm:broadcast"], names[-10:]
    assert dump["entries"][-1]["process_group"][0] == WORLD.group_name, dump["entries"][-1]


# -- torch <= 2.13: hpccomm as a ProcessGroup, and _dist2 ----------------------------------


@check
def dist2_new_group_context_manager_and_collectives() -> None:
    try:
        from torch.distributed import _dist2
    except ImportError:
        assert BACKEND_SHAPE, "torch without _dist2 must take the Backend shape"
        return
    group = _dist2.new_group("hpccomm", timeout=timedelta(seconds=60), device="cpu")
    assert front_of(group) is group and group.size() == SIZE
    with _dist2.process_group(group):
        assert _dist2.current_process_group() is group
    t = torch.full((2,), RANK + 1.0)
    group.allreduce([t]).wait()
    assert t[0].item() == SIZE * (SIZE + 1) / 2
    got = [torch.zeros(1) for _ in range(SIZE)]
    group.allgather([got], [torch.full((1,), float(RANK))]).wait()
    assert [g.item() for g in got] == list(range(SIZE))
    group.shutdown()


run_all(RANK, next((arg for arg in sys.argv[1:] if not arg.startswith("--")), None))
dist.destroy_process_group()
