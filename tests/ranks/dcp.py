"""torch.distributed.checkpoint (DCP) on hpccomm: save/load, async_save, broadcast_from_rank0.

DCP picks devices from the group's ``_device_types`` (empty on a bare Python
process group): these failed before hpccomm reported it.
Usage: dcp.py [name-filter]
"""

from __future__ import annotations

import shutil
import sys
import tempfile

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from rankcheck import check, run_all
from training import make_model

dist.init_process_group("hpccomm")
RANK, SIZE = dist.get_rank(), dist.get_world_size()


def shared_directory() -> str:
    box = [tempfile.mkdtemp(prefix="hpccomm-dcp-") if RANK == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def scrambled(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(RANK + 100.0)
    return model


def assert_same_state(model: torch.nn.Module, reference: torch.nn.Module, what: str) -> None:
    for (name, got), want in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(got, want), f"{what}: {name} differs"


@check
def the_group_reports_its_device_types() -> None:
    assert dist.group.WORLD._device_types == [torch.device("cpu")], dist.group.WORLD._device_types
    assert dist.distributed_c10d._get_pg_default_device() == torch.device("cpu")


@check
def full_state_dict_broadcast_from_rank_0() -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model = scrambled(make_model())
    full = make_model().state_dict() if RANK == 0 else {}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=options)
    assert_same_state(model, make_model(), "broadcast_from_rank0")


@check
def save_then_load() -> None:
    path = shared_directory()
    dcp.save({"model": make_model().state_dict()}, checkpoint_id=path)
    model = scrambled(make_model())
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=path)
    model.load_state_dict(state["model"])
    assert_same_state(model, make_model(), "save/load")
    dist.barrier()
    if RANK == 0:
        shutil.rmtree(path)


@check
def async_save_then_load() -> None:
    path = shared_directory()
    dcp.async_save({"model": make_model().state_dict()}, checkpoint_id=path).result()
    model = scrambled(make_model())
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=path)
    model.load_state_dict(state["model"])
    assert_same_state(model, make_model(), "async_save/load")
    dist.barrier()
    if RANK == 0:
        shutil.rmtree(path)


run_all(RANK, sys.argv[1] if len(sys.argv) > 1 else None)
dist.destroy_process_group()
