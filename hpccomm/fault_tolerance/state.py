"""The training state a replacement rank needs, sent from a survivor over hpccomm's own collectives.

After :func:`~hpccomm.fault_tolerance.spares.repair`, the survivors and the
replacements agree on the latest completed step, and the ranks behind it (a
replacement knows none; a survivor whose step's all-reduce failed is one
behind) receive the state of the rank that has it: the ``state_dict()`` of
each registered object (the model, the optimizer, and whatever else the user
registers: a data loader's position, RNG state), in memory, without a file.
The tensors travel as one broadcast per dtype of their bytes laid end to end;
the rest (shapes, dtypes, the optimizer's hyperparameters) as one pickled
object first. This is torchft's live recovery (a healthy peer's weights for a
newcomer, the step deciding who is up to date) on MPI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist


class Stateful(Protocol):
    """What :class:`TrainingState` keeps: an object with ``state_dict`` and ``load_state_dict``."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


class _Slot:
    """Where a tensor of a state dict was: its place in its dtype's buffer."""

    def __init__(self, dtype: torch.dtype, shape: torch.Size, start: int) -> None:
        self.dtype, self.shape, self.start = dtype, tuple(shape), start


def _strip(state: Any, found: list[torch.Tensor]) -> Any:
    """``state`` with each tensor replaced by a :class:`_Slot` placeholder; the tensors appended to ``found``."""
    if isinstance(state, torch.Tensor):
        found.append(state)
        return _Slot(state.dtype, state.shape, len(found) - 1)
    if isinstance(state, dict):
        return type(state)((key, _strip(value, found)) for key, value in state.items())
    if isinstance(state, (list, tuple)):
        return type(state)(_strip(value, found) for value in state)
    return state


def _fill(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(skeleton, _Slot):
        return tensors[skeleton.start]
    if isinstance(skeleton, dict):
        return type(skeleton)((key, _fill(value, tensors)) for key, value in skeleton.items())
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(_fill(value, tensors) for value in skeleton)
    return skeleton


class TrainingState:
    """The state that makes a rank of a training job: handed to a replacement by a survivor.

    Args:
        objects: name -> object with ``state_dict()``/``load_state_dict()``
            (a module, an optimizer, a learning-rate scheduler, your own).

    Example::

        state = hpccomm.TrainingState(model=model, optimizer=optimizer)
        step = state.resume(0) if hpccomm.is_replacement() else 0
        ...
        except Exception:                    # a PeerFailure
            hpccomm.repair(hpccomm.failed_ranks())
            step = state.resume(step)
    """

    def __init__(self, **objects: Stateful) -> None:
        self._objects: dict[str, Stateful] = {}
        self._resumed = False
        for name, obj in objects.items():
            self.register(name, obj)

    def register(self, name: str, obj: Stateful) -> None:
        """Keep ``obj``'s state under ``name`` too (the same name on every rank)."""
        if not callable(getattr(obj, "state_dict", None)) or not callable(getattr(obj, "load_state_dict", None)):
            raise TypeError(f"hpccomm TrainingState: {name!r} has no state_dict()/load_state_dict()")
        self._objects[name] = obj

    def resume(self, step: int, group: dist.ProcessGroup | None = None) -> int:
        """Agree on the latest completed step and give its state to the ranks behind it. Collective.

        Args:
            step: the steps this rank has completed (a replacement: anything;
                it counts as none).
            group: default: the default group.

        Returns:
            the step every rank resumes from (the same on all).
        """
        from .spares import is_replacement  # the replacement's own count says nothing

        mine = -1 if is_replacement() and not self._resumed else int(step)
        self._resumed = True
        size = dist.get_world_size(group)
        steps = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
        dist.all_gather(steps, torch.tensor([mine], dtype=torch.int64), group=group)
        counts = [int(count) for count in steps]
        latest = max(counts)
        if latest < 0:
            raise RuntimeError("hpccomm TrainingState.resume: no rank has a state to give (every rank is new)")
        if min(counts) == latest:
            return latest  # every rank is there already
        source = counts.index(latest)  # the lowest such rank, the same on every rank
        self.send_state(dist.get_global_rank(group, source) if group is not None else source, group,
                        receive=counts[dist.get_rank(group)] < latest)
        return latest

    def send_state(self, source: int, group: dist.ProcessGroup | None = None, receive: bool = True) -> None:
        """Broadcast the state of rank ``source`` (a global rank) to the group; load it where ``receive``. Collective.

        One pickled object (everything but the tensors' data), then one
        broadcast per dtype of the tensors' bytes laid end to end.
        """
        me = dist.get_rank()
        found: list[torch.Tensor] = []
        skeleton = None
        if me == source:
            skeleton = {name: _strip(obj.state_dict(), found) for name, obj in self._objects.items()}
        holder = [skeleton]
        dist.broadcast_object_list(holder, src=source, group=group)
        skeleton = holder[0]
        slots: list[_Slot] = []
        _collect(skeleton, slots.append)
        tensors: list[torch.Tensor] = [torch.empty(0)] * len(slots)
        for dtype in sorted({slot.dtype for slot in slots}, key=str):
            mine = [slot for slot in slots if slot.dtype == dtype]
            sizes = [int(torch.Size(slot.shape).numel()) for slot in mine]
            if me == source:
                flat = torch.cat([found[slot.start].detach().reshape(-1).cpu() for slot in mine])
            else:
                flat = torch.empty(sum(sizes), dtype=dtype)
            dist.broadcast(flat, src=source, group=group)
            for slot, piece in zip(mine, flat.split(sizes)):
                tensors[slot.start] = piece.view(slot.shape)
        if receive and me != source:
            for name, obj in self._objects.items():
                obj.load_state_dict(_fill(skeleton[name], tensors))


def _collect(skeleton: Any, keep: Callable[[_Slot], None]) -> None:
    if isinstance(skeleton, _Slot):
        keep(skeleton)
    elif isinstance(skeleton, dict):
        for value in skeleton.values():
            _collect(value, keep)
    elif isinstance(skeleton, (list, tuple)):
        for value in skeleton:
            _collect(value, keep)
