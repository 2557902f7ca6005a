"""Argument checks that run before any communication is posted.

A bad argument on one rank must never leave the others waiting inside a
collective, so the front checks everything it can check locally first and
raises ValueError (bad value) or RuntimeError (no route for the device), each
naming the op and the argument. Checks that need the other ranks' arguments
live in :mod:`hpccomm.debug`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch


class LayoutError(ValueError):
    """A tensor is not dense (strided); all_reduce takes sparse COO tensors through another path."""


def fail(op: str, message: str) -> ValueError:
    """A ValueError worded the hpccomm way: ``hpccomm <op>: <message>``."""
    return ValueError(f"hpccomm {op}: {message}")


def check_tensor(op: str, arg: str, tensor: object, routes: Collection[str]) -> torch.Tensor:
    """Check ``tensor`` is a dense tensor on a device this group can move.

    Args:
        op: the collective's name, for the message.
        arg: the argument's name, for the message.
        tensor: the value to check.
        routes: device types this group has a transport for.
    """
    if not isinstance(tensor, torch.Tensor):
        raise fail(op, f"{arg} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout is not torch.strided:
        raise LayoutError(f"hpccomm {op}: {arg} is a {tensor.layout} tensor; only dense (strided) tensors are supported")
    if tensor.is_cpu and "cpu" in routes:
        return tensor  # the common case, without the slower tensor.device lookup
    return check_device(op, arg, tensor, routes)


def check_device(op: str, arg: str, tensor: torch.Tensor, routes: Collection[str]) -> torch.Tensor:
    """Check this group has a transport for ``tensor``'s device type (RuntimeError if not)."""
    device = tensor.device.type
    if device not in routes:
        raise RuntimeError(
            f"hpccomm {op}: {arg} is on device '{tensor.device}', but this group has no transport "
            f"for '{device}' tensors (routes: {', '.join(sorted(routes))}); the UCC transport for "
            f"CUDA is not available in this installation, so move the tensor to the CPU"
        )
    return tensor


def check_tensors(op: str, arg: str, tensors: object, routes: Collection[str]) -> list[torch.Tensor]:
    """Check a list of tensors share one dtype and device, each as :func:`check_tensor`."""
    if not isinstance(tensors, (list, tuple)):
        raise fail(op, f"{arg} must be a list of tensors, got {type(tensors).__name__}")
    checked = [check_tensor(op, f"{arg}[{i}]", t, routes) for i, t in enumerate(tensors)]
    if checked:
        first = checked[0]
        for i, t in enumerate(checked[1:], start=1):
            if t.dtype != first.dtype or t.device != first.device:
                raise fail(
                    op,
                    f"{arg}[{i}] is {t.dtype} on {t.device} but {arg}[0] is {first.dtype} on "
                    f"{first.device}; all must match",
                )
    return checked


def check_single(op: str, arg: str, tensors: object, routes: Collection[str]) -> torch.Tensor:
    """Unwrap torch's one-element tensor list, checking it has exactly one tensor."""
    if type(tensors) is list and len(tensors) == 1:
        tensor = tensors[0]
        # Hot path of every small collective: a dense CPU tensor.
        if isinstance(tensor, torch.Tensor) and tensor.is_cpu and tensor.layout is torch.strided and "cpu" in routes:
            return tensor
    checked = check_tensors(op, arg, tensors, routes)
    if len(checked) != 1:
        raise fail(op, f"{arg} must hold exactly one tensor per process, got {len(checked)}")
    return checked[0]


def check_length(op: str, arg: str, items: Sequence[object], expected: int) -> None:
    """Check a per-rank list has one entry per rank in the group."""
    if len(items) != expected:
        raise fail(op, f"{arg} has {len(items)} entries but the group has {expected} ranks")


def check_lists(op: str, arg: str, lists: object, size: int, each: int) -> None:
    """``lists`` must be ``size`` lists (one per rank) of ``each`` items (an all-gather's outputs)."""
    if not isinstance(lists, (list, tuple)):
        raise fail(op, f"{arg} must be a list of lists, got {type(lists).__name__}")
    check_length(op, arg, lists, size)
    for rank, items in enumerate(lists):
        if not isinstance(items, (list, tuple)) or len(items) != each:
            got = f"{len(items)} tensors" if isinstance(items, (list, tuple)) else type(items).__name__
            raise fail(op, f"{arg}[{rank}] must hold one tensor per input ({each}), got {got}")


def check_pairs(op: str, outputs: Sequence[object], inputs: Sequence[object]) -> None:
    """A coalesced operation's outputs and inputs must pair up."""
    if len(outputs) != len(inputs):
        raise fail(op, f"{len(outputs)} outputs but {len(inputs)} inputs")


def check_rank(op: str, arg: str, rank: int, size: int) -> int:
    """Check ``rank`` names a member of a group of ``size`` ranks."""
    if not 0 <= rank < size:
        raise fail(op, f"{arg}={rank} is not a rank of this group (valid: 0..{size - 1})")
    return rank


def check_same_dtype(op: str, arg: str, tensor: torch.Tensor, reference: torch.Tensor, ref_arg: str) -> None:
    """Check an output matches its input's dtype."""
    if tensor.dtype != reference.dtype:
        raise fail(op, f"{arg} has dtype {tensor.dtype} but {ref_arg} has {reference.dtype}")


def check_numel(op: str, arg: str, tensor: torch.Tensor, expected: int, why: str) -> None:
    """Check a tensor holds exactly ``expected`` elements."""
    if tensor.numel() != expected:
        raise fail(op, f"{arg} has {tensor.numel()} elements but needs {expected} ({why})")


def check_root_list(
    op: str,
    arg: str,
    nested: list[list[torch.Tensor]],
    tensor: torch.Tensor,
    rank: int,
    root: int,
    size: int,
    role: str,
    routes: Collection[str],
) -> list[torch.Tensor] | None:
    """The per-rank list only the root passes (``gather_list``, ``scatter_list``), checked; None elsewhere.

    Args:
        op: the operation, for messages.
        arg: the list's argument name.
        nested: torch's one-element list around it (empty, or holding an empty list, off the root).
        tensor: this rank's own tensor, which each entry must match.
        rank: this rank in the group.
        root: the root's group rank.
        size: the group size.
        role: what the root is called in messages ("destination", "source").
        routes: the device types the group can carry.
    """
    if rank != root:
        if nested and nested[0]:
            raise fail(op, f"{arg} must only be given on the {role} rank")
        return None
    if len(nested) != 1:
        raise fail(op, f"{arg} must be given on the {role} rank")
    items = check_tensors(op, arg, nested[0], routes)
    check_length(op, arg, items, size)
    check_same_dtype(op, f"{arg}[0]", items[0], tensor, "tensor")
    check_numel(op, f"{arg}[{root}]", items[root], tensor.numel(), "the root's tensor")
    return items


def split_counts(op: str, arg: str, tensor: torch.Tensor, splits: Sequence[int], size: int) -> list[int]:
    """Element counts per rank for all_to_all_single's split sizes along dim 0.

    Args:
        op: the collective's name.
        arg: the tensor argument's name (``input`` or ``output``).
        tensor: the tensor being split.
        splits: rows per rank, or empty for an even split.
        size: the group size.
    """
    rows = tensor.size(0) if tensor.dim() > 0 else tensor.numel()
    per_row = tensor.numel() // rows if rows else 0
    if not splits:
        if rows % size:
            raise fail(op, f"{arg} has {rows} rows, which do not split evenly over {size} ranks; pass split sizes")
        return [rows // size * per_row] * size
    if len(splits) != size:
        raise fail(op, f"{arg}_split_sizes has {len(splits)} entries but the group has {size} ranks")
    if any(s < 0 for s in splits):
        raise fail(op, f"{arg}_split_sizes {list(splits)} has a negative entry")
    if sum(splits) != rows:
        raise fail(op, f"{arg}_split_sizes {list(splits)} sum to {sum(splits)} but {arg} has {rows} rows")
    return [s * per_row for s in splits]
