"""What hpccomm shows torch's profiler: a span per operation, and its metadata.

While a ``torch.profiler`` (or ``torch.autograd.profiler``) records on the
calling thread, every hpccomm operation adds two events to its trace:

* a span named for hpccomm and the collective, as Gloo's are for Gloo
  (``hpccomm:all_reduce``, ``hpccomm:all_gather_into_tensor``, ...), from when
  the operation is posted to when it completes, on the calling thread. A
  blocking operation completes there, inside torch's own ``c10d::allreduce_``
  event. An asynchronous one (``async_op=True``, DDP's buckets) is completed
  by the progress thread or by whichever thread waits on it, and its span
  overlaps what the caller did meanwhile: this is how torch's own ``Work``
  records the MPI and UCC backends' operations (c10d's ``Work.cpp``: a
  RecordFunction begun when the work is made, ended by the thread that
  finishes it, with the caller's thread state). torch's profiler records only
  threads it was started on (its callbacks and state are thread-local): a
  span ended on another thread without that state keeps no end (measured: it
  then lasts until the profiler stops), and one begun there is not recorded
  at all. So an asynchronous operation's span is ended through a torch future
  that its completion settles (``_call_end_callbacks_on_jit_fut``, torch's RPC
  profiling), which runs the end under the calling thread's state
  (``at::wrapPropagateTLSState``) on whatever thread completes it. That made
  hpccomm's events cost about 45 us per operation where a blocking one's cost
  about 6 (measured alone on this 2-core VM, torch 2.15), so blocking ones do
  without;
* ``hpccomm:record_param_comms``, an instant at the start of the span holding
  the operation's metadata. Its arguments, shown where the profiler records
  shapes (``record_shapes=True``, as HTA's and Chakra's collection recipes
  ask), are the fields torch's profiler writes for NCCL's
  ``record_param_comms`` events (``saveNcclMeta`` in
  torch/csrc/profiler/util.cpp), under the same names and in the same form:
  ``Collective name``, ``dtype``, ``In msg nelems``, ``Out msg nelems``, ``In
  split size``, ``Out split size``, ``Global rank start``/``stride``, ``Group
  size``, ``Process Group Name``/``Description``/``Ranks``, ``Rank``, ``Src
  Rank``/``Dst Rank``, ``Seq``, ``Is asynchronized op``; plus ``Path``: the
  path that served the operation (``mpi``, ``shm``, ``hierarchical``, ``ucc``,
  ``staged``, ...). It takes no positional inputs: the tensors' shapes are
  on torch's own ``c10d::`` event where torch has one, and recording
  RECORD_PARAM_COMMS_DATA's positional tuples cost 36 us per event with
  shapes on (6 us for these fields). It is not named ``record_param_comms``:
  torch attaches that event's metadata from C++ state a Python backend cannot
  set, and a Python event of that name made torch 2.15's profiler warn on
  every event, drop its arguments, and crash the process under the execution
  trace observer.

Nothing of this runs while no profiler records: per operation the front reads
torch's own flag ``torch.autograd.profiler._is_profiler_enabled`` (set while any
profiler a Python program started records, "for fast python checks"), then,
only where it is set, asks :func:`recording` whether this thread records. A
profiler started from outside Python (on demand, through Kineto's daemon) sets
no flag, and hpccomm's events are then not recorded.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch._C._autograd import _profiler_enabled as recording
from torch._C._profiler import _RecordFunctionFast
from torch.futures import Future

__all__ = ["recording", "begin", "path_of", "COLLECTIVE_NAMES", "METADATA_EVENT"]

#: The event that holds an operation's metadata, at the start of its span.
METADATA_EVENT = "hpccomm:record_param_comms"

#: The collective names torch's backends record (``RECORD_PARAM_COMMS``'s ``collName``),
#: by the name of hpccomm's operation.
COLLECTIVE_NAMES = {
    "all_reduce": "allreduce",
    "all_reduce_coalesced": "allreduce_coalesced",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "all_gather": "all_gather",
    "all_gather_coalesced": "allgather_coalesced",
    "all_gather_into_tensor": "_allgather_base",
    "all_gather_into_tensor_coalesced": "allgather_into_tensor_coalesced",
    "gather": "gather",
    "scatter": "scatter",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_allv",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
}
#: Names of dtypes as torch's profiler writes them (``c10::toString(ScalarType)``).
_DTYPE_NAMES = {
    torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short", torch.int32: "Int", torch.int64: "Long",
    torch.float16: "Half", torch.float32: "Float", torch.float64: "Double", torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble", torch.bool: "Bool", torch.bfloat16: "BFloat16",
}
#: torch's profiler shortens lists longer than this in its metadata (``kTruncatLength``).
_LIST_LIMIT = 30
#: Set once the profiler refused an operation's events (said once).
_refused = False


def path_of(pending: Any) -> str:
    """The path that serves a posted operation: its Pending's ``path``, else its class's name."""
    return getattr(pending, "path", None) or type(pending).__name__


def _listed(values: Sequence[int]) -> str:
    """A list as torch's profiler formats one (``format_list``): '[0, 1]', shortened past 30 items."""
    shown = ", ".join(str(value) for value in values[:_LIST_LIMIT])
    return f"[{shown}, ...]" if len(values) > _LIST_LIMIT else f"[{shown}]"


def _stride(ranks: Sequence[int]) -> tuple[int, int]:
    """(first world rank, stride) where the group's world ranks are evenly strided, else (-1, 0), as NCCL records."""
    if len(ranks) == 1:
        return ranks[0], 1
    step = ranks[1] - ranks[0]
    if step > 0 and all(b - a == step for a, b in zip(ranks, ranks[1:])):
        return ranks[0], step
    return -1, 0


def _numel(tensors: Sequence[torch.Tensor]) -> int:
    return sum(tensor.numel() for tensor in tensors)


def _group_desc(group_name: str) -> str:
    """torch's description of the group (``default_pg``, ``undefined``...), where this torch can say."""
    try:
        return torch._C._distributed_c10d._resolve_process_group(group_name).group_desc
    except (AttributeError, RuntimeError, ValueError, TypeError):
        return ""


def _group_fields(group: Any) -> dict[str, Any]:
    """The fields that describe the group, worked out once per group (and again should torch rename it)."""
    fields = getattr(group, "_profiled_fields", None)
    name = group._group_name
    if fields is None or fields["Process Group Name"] != name:
        ranks = list(group.global_ranks())
        fields = {"Group size": len(ranks), "Process Group Name": name, "Process Group Ranks": _listed(ranks)}
        start, stride = _stride(ranks)
        if start >= 0:
            fields["Global rank start"] = start
            fields["Global rank stride"] = stride
        desc = _group_desc(name)
        if desc:
            fields["Process Group Description"] = desc
        group._profiled_fields = fields
    return fields


def begin(
    op: str,
    group: Any,
    seq: int,
    pending: Any,
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    async_op: bool,
    about: tuple | None,
    peer: int | None,
) -> Callable[[], None] | None:
    """Open the span of one operation just posted and record its metadata.

    Returns what ends the span, to call once when the operation has ended (on
    any thread); None where the profiler refused the events: the operation,
    already posted, goes on unrecorded (said once on stderr).

    Args:
        op: hpccomm's name of the operation (``all_reduce``...).
        group: the operation's :class:`~hpccomm.front.Front`.
        seq: the operation's number on the group.
        pending: the posted operation (its ``path``).
        inputs, outputs: the tensors it reads and writes.
        async_op: whether the caller asked for a Work to wait on later.
        about: (root, input split sizes, output split sizes) where the operation has them
            (split sizes only where the caller gave them), else None.
        peer: the group rank a send or receive pairs with (None: any), or -1.
    """
    global _refused
    try:
        root, in_splits, out_splits = about or (-1, (), ())
        collective = COLLECTIVE_NAMES.get(op, op)
        if collective == "all_to_allv" and not (in_splits or out_splits):
            collective = "all_to_all"  # NCCL's name where no split sizes were given
        dtype = next((tensor.dtype for tensor in (*inputs, *outputs)), None)
        # NCCL's "Rank" is the root of a rooted collective and the peer of a send or receive.
        rank = group._rank if root < 0 and peer == -1 else (root if root >= 0 else (-1 if peer is None else peer))
        meta = dict(_group_fields(group))
        meta.update({
            "Collective name": collective,
            "dtype": _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch.")) if dtype is not None else "Byte",
            "In msg nelems": _numel(inputs),
            "Out msg nelems": _numel(outputs),
            "In split size": _listed(in_splits),
            "Out split size": _listed(out_splits),
            "Rank": rank,
            "Seq": seq,
            "Is asynchronized op": int(async_op),
            "Path": path_of(pending),
        })
        if collective in ("send", "recv") and 0 <= rank < meta["Group size"]:
            meta["Dst Rank" if collective == "send" else "Src Rank"] = group.global_ranks()[rank]
        title = f"hpccomm:{op}"
        if async_op:  # may end on another thread: ended under this thread's state, through a future
            handle = torch.ops.profiler._record_function_enter_new(title, None)
            ended: Future = Future()
            torch.ops.profiler._call_end_callbacks_on_jit_fut(handle, ended)
            end = partial(ended.set_result, None)
        else:  # ends on this thread
            span = _RecordFunctionFast(title)
            span.__enter__()
            end = partial(span.__exit__, None, None, None)
        with _RecordFunctionFast(METADATA_EVENT, [], meta):
            pass
        return end
    except Exception as exc:  # noqa: BLE001 -- the peers wait on this operation: it must go on
        if not _refused:
            _refused = True
            print(f"hpccomm: torch's profiler refused an operation's events, which go unrecorded: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return None
