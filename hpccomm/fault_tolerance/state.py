"""The training state a replacement rank needs, sent from a survivor over hpccomm's own collectives.

After :func:`~hpccomm.fault_tolerance.spares.repair`, the survivors and the
replacements agree on the latest completed step, and the ranks behind it (a
replacement knows none; a survivor whose step's all-reduce failed is one
behind) receive the state of the rank that has it: the ``state_dict()`` of
each registered object (the model, the optimizer, and whatever else the user
registers: a data loader's position, RNG state), in memory, without a file.
The small tensors travel as one broadcast per dtype of their bytes end to end;
the rest (shapes, dtypes, the optimizer's hyperparameters) as one pickled
object first; a large tensor goes straight into the receiver's own tensor
of that shape where it has one. This is torchft's live recovery (a healthy peer's weights for a
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

    def __eq__(self, other: object) -> bool:  # the same tensor's place in two states: its number may differ
        return isinstance(other, _Slot) and (self.dtype, self.shape) == (other.dtype, other.shape)


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

        One pickled object (everything but the tensors' data) first. A tensor
        of at least :data:`_ALONE_BYTES` is then broadcast on its own, straight
        into the receiver's own tensor at the same place of its state when it
        has one of that shape and dtype (a model's parameters, an optimizer's
        buffers after its first step): no copy beyond the broadcast's. Smaller
        ones travel end to end, one broadcast per dtype.
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
        settled: set[str] = set()  # objects whose whole state arrives in place: nothing to load
        if me != source:
            found, settled = self._own_tensors(skeleton) if receive else ([None] * len(slots), set())  # type: ignore
        tensors: list[torch.Tensor] = list(found)
        small: dict[torch.dtype, list[_Slot]] = {}
        for slot in slots:
            size = torch.Size(slot.shape).numel()
            if size * slot.dtype.itemsize < _ALONE_BYTES:
                small.setdefault(slot.dtype, []).append(slot)
                continue
            tensor = tensors[slot.start]
            if me == source:
                tensor = tensor.detach().contiguous()
            elif tensor is None or not tensor.is_contiguous():
                tensor = torch.empty(slot.shape, dtype=slot.dtype)
            dist.broadcast(tensor, src=source, group=group)
            if me == source or tensors[slot.start] is None:
                tensors[slot.start] = tensor
            elif tensors[slot.start] is not tensor:
                tensors[slot.start].copy_(tensor)
        for dtype, mine in sorted(small.items(), key=lambda item: str(item[0])):
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
                if name not in settled:
                    obj.load_state_dict(_fill(skeleton[name], tensors))

    def _own_tensors(self, skeleton: Any) -> tuple[list[torch.Tensor | None], set[str]]:
        """This rank's own tensors at the places of the source's, object by object where every shape and dtype match.

        Returns:
            the tensors (None where the source's state has a tensor this rank's
            lacks), and the objects whose state is the source's but for the
            tensors' values, all received in place: nothing to load there.
        """
        own: list[torch.Tensor | None] = []
        settled = set()
        for name, obj in self._objects.items():
            theirs: list[_Slot] = []
            _collect(skeleton[name], theirs.append)
            found: list[torch.Tensor] = []
            stripped = _strip(obj.state_dict(), found)
            mine: list[_Slot] = []
            _collect(stripped, mine.append)
            if mine == theirs and all(t.device.type == "cpu" and t.is_contiguous() for t in found):
                own += [t.detach() for t in found]
                try:
                    if stripped == skeleton[name] and all(t.numel() * t.element_size() >= _ALONE_BYTES for t in found):
                        settled.add(name)
                except Exception:  # a value that cannot be compared: load it
                    pass
            else:
                own += [None] * len(theirs)
        return own, settled


#: A state's tensor this large or larger is broadcast alone, in place; smaller ones together.
_ALONE_BYTES = 1 << 20


def _collect(skeleton: Any, keep: Callable[[_Slot], None]) -> None:
    if isinstance(skeleton, _Slot):
        keep(skeleton)
    elif isinstance(skeleton, dict):
        for value in skeleton.values():
            _collect(value, keep)
    elif isinstance(skeleton, (list, tuple)):
        for value in skeleton:
            _collect(value, keep)
