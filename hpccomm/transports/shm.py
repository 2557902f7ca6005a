"""Node-local all-reduce through shared memory.

Between ranks of one node, MPI libraries move a medium or large all-reduce
through their point-to-point protocols (rendezvous handshakes, single-copy
CMA, a temporary buffer), which costs far more than the memory traffic
itself. When every rank of a group shares a node, hpccomm reduces tensors
through a shared segment instead: a file in /dev/shm that every rank maps,
created and named through MPI, holding per-rank progress counters and a slot
per rank.

The all-reduce itself runs in C (``cffi_build/shm_allreduce.c``, module
``hpccomm._shm_allreduce``): the tensor goes through in chunks, pipelined over
a few buffers per slot, and per chunk each rank copies its elements in, reduces
its 1/n of them across all slots (every element has one owner, so all ranks
get the same bits), and copies the others' reduced parts out. Ranks wait for
each other on the counters (release/acquire atomics), not on MPI messages.

Polling happens in :meth:`ShmAllreduce.test`, which calls the engine for a
bounded number of polls, so the usual machinery applies: a blocking call drives
it inline, asynchronous work is driven by the progress engine, and timeouts
and departed peers are noticed as for any other work. All-reduces on a group's
segment complete in the order they were posted; each one first drives its
predecessor, so no order of waits can deadlock.

Not a window from ``MPI_Win_allocate_shared``: freeing one is collective and
synchronising, so a group aborted on some ranks only would hang; unmapping a
file is local.
"""

from __future__ import annotations

import mmap
import os
import secrets
import threading
from typing import Any

import torch
import torch.distributed as dist

from ..config import settings
from ..world import mpi
from . import half_reduce

try:
    from .. import _shm_allreduce as _engine
except ImportError:  # built without a C compiler: all-reduce stays on MPI
    _engine = None

RedOpType = dist.ReduceOp.RedOpType
_UNPLANNED = object()
_SHM_DIR = "/dev/shm"
_LINE = 64  # bytes: one progress counter per cache line, so ranks never share one
_COUNTERS_PER_RANK = 3
#: Chunks a slot holds: how far a rank may run ahead of the slowest one.
_BUFFERS = 4
#: Padding after each chunk buffer and each slot, in bytes: with power-of-two
#: strides every buffer would map to the same cache sets (and the same 4 KiB
#: page offset, which stalls loads behind stores), and at 128 KiB chunks an
#: all-reduce ran 4-9x slower than with these offsets.
_BUFFER_PAD = 17 * _LINE
_SLOT_PAD = 33 * _LINE
#: Chunk size for all-reduces of up to _CHUNKS_PER_ALLREDUCE chunks (capped at
#: a quarter buffer); larger ones use larger chunks, up to a buffer (a quarter
#: slot): every chunk costs hand-offs, and where ranks outnumber cores each
#: hand-off may wait for a context switch. 256 KiB was fastest at 1-4 MiB.
_CHUNK_BYTES = 256 << 10
_CHUNKS_PER_ALLREDUCE = 16
#: Polls per :meth:`ShmAllreduce.test` before it returns to Python's checks.
_POLLS_PER_TEST = 256
_OP_CODES = {RedOpType.SUM: 0, RedOpType.PRODUCT: 1, RedOpType.MIN: 2, RedOpType.MAX: 3}
# The engine's own element types (cffi_build/shm_allreduce.h); 16-bit floats
# use hpccomm._half_reduce's kernels, bool stays on MPI.
_DTYPE_CODES = {
    torch.float32: 0,
    torch.float64: 1,
    torch.int8: 2,
    torch.uint8: 3,
    torch.int16: 4,
    torch.int32: 5,
    torch.int64: 6,
    torch.complex64: 7,
    torch.complex128: 8,
}


class SharedMemoryChannel:
    """One group's shared-memory segment and the order of the all-reduces through it.

    Create it with :meth:`for_group`, on every rank of the group at once.

    Args:
        comm: the group's communicator; all its ranks share this node.
        segment: the mapped segment: ``_COUNTERS_PER_RANK`` lines of counters
            per rank, then one slot per rank (see :func:`_slot_layout`).
        slot_bytes: the tensor bytes each rank's slot holds (a multiple of
            64 * ``_BUFFERS``).
        min_bytes: smaller tensors stay on MPI's all-reduce.
    """

    def __init__(self, comm: Any, segment: mmap.mmap, slot_bytes: int, min_bytes: int) -> None:
        self._size = comm.Get_size()
        self._rank = comm.Get_rank()
        self._segment = segment
        self._slot_bytes = slot_bytes
        self._buffer_stride, self._slot_stride = _slot_layout(slot_bytes)
        self.min_bytes = max(min_bytes, 1)
        # The file was created empty, so every counter starts at zero.
        self._window: torch.Tensor | None = torch.frombuffer(segment, dtype=torch.uint8)
        address = self._window.data_ptr()
        self._counters = _engine.ffi.cast("int64_t *", address)
        self._slots = _engine.ffi.cast("char *", address + _LINE * _COUNTERS_PER_RANK * self._size)
        self._plans: dict[tuple[torch.dtype, Any], Any] = {}
        # Resolved once: all_reduce's hot path makes one engine state per call.
        self._new_state = _engine.ffi.new
        self._state_type = _engine.ffi.typeof("hpccomm_shm_allreduce *")
        self._next_chunk = 0
        self._tail: ShmAllreduce | None = None
        # Held while the engine touches the segment, and by close(): the
        # progress thread and a waiter may both poll, and an abort must not
        # unmap the segment under a poll.
        self.lock = threading.Lock()
        self.closed = False

    @classmethod
    def for_group(cls, comm: Any) -> SharedMemoryChannel | None:
        """A channel for ``comm`` when all its ranks share a node, else None. Collective.

        None too where shared memory is turned off (``HPCCOMM_SHM_SLOT_BYTES=0``),
        the engine was not built, or some rank cannot map the segment; every
        rank reaches the same answer.
        """
        granule = _LINE * _BUFFERS
        slot_bytes = settings.shm_slot_bytes // granule * granule
        if slot_bytes == 0 or _engine is None or comm.Get_size() < 2:
            return None
        MPI = mpi()
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            one_node = node.Get_size() == comm.Get_size()
        finally:
            node.Free()
        # A rank alone on its node sees a node of one: agree before mapping anything.
        if not comm.allreduce(one_node, op=MPI.LAND):
            return None
        size = comm.Get_size()
        segment = _map_segment(comm, (_LINE * _COUNTERS_PER_RANK + _slot_layout(slot_bytes)[1]) * size)
        if segment is None:
            return None
        return cls(comm, segment, slot_bytes, settings.shm_min_bytes)

    def allreduce(self, tensor: torch.Tensor, kind: Any) -> ShmAllreduce | None:
        """Post an in-place all-reduce of the contiguous CPU ``tensor``; it runs as it is polled.

        Returns:
            the pending all-reduce, or None where this path does not take the
            dtype/op pair (then nothing was posted: use MPI).
        """
        plan = self._plans.get((tensor.dtype, kind), _UNPLANNED)
        if plan is _UNPLANNED:
            plan = self._plan(tensor.dtype, kind)
        if plan is None:
            return None
        ar = self._new_state(self._state_type, plan[0])
        ar.data = tensor.data_ptr()
        ar.count = count = tensor.numel()
        ar.base = self._next_chunk
        if count > _CHUNKS_PER_ALLREDUCE * ar.chunk_elems:
            # Fewer, larger chunks for large tensors (up to a buffer): each chunk costs hand-offs.
            ar.chunk_elems = min(self.buffer_bytes // tensor.element_size(), -(-count // _CHUNKS_PER_ALLREDUCE))
        ar.chunks = chunks = -(-count // ar.chunk_elems)
        self._next_chunk += chunks
        work = ShmAllreduce(self, ar, tensor, self._tail)
        self._tail = work
        return work

    def _plan(self, dtype: torch.dtype, kind: Any) -> Any:
        """The engine's settings for all-reduces of ``dtype`` with ``kind``, or None if it cannot do them.

        Everything but the tensor and the chunk numbers; made once per pair.
        """
        ffi, lib = _engine.ffi, _engine.lib
        if kind not in _OP_CODES:
            reducer = None
        elif dtype in half_reduce.HALF_DTYPES:
            half = half_reduce.compiled_reducer(kind, dtype)  # None where torch reduces them
            reducer = None if half is None else (ffi.cast("hpccomm_shm_reducer", half[0]), *half[1:])
        elif dtype in _DTYPE_CODES and (kind == RedOpType.SUM or not dtype.is_complex):
            reducer = (ffi.addressof(lib, "hpccomm_shm_reduce_into"), _DTYPE_CODES[dtype], _OP_CODES[kind], 0)
        else:
            reducer = None  # bool, and complex beyond SUM, stay on MPI
        plan = None
        if reducer is not None:
            plan = ffi.new("hpccomm_shm_allreduce *")
            plan.counters, plan.slots = self._counters, self._slots
            plan.slot_stride, plan.buffer_stride = self._slot_stride, self._buffer_stride
            plan.size, plan.rank = self._size, self._rank
            plan.elem_size = dtype.itemsize
            plan.chunk_elems = self.chunk_bytes // dtype.itemsize
            plan.buffers = _BUFFERS
            plan.reduce, plan.dtype, plan.op, plan.path = reducer
        self._plans[dtype, kind] = plan
        return plan

    def close(self) -> None:
        """Unmap the segment (local: ranks may close at different times).

        All-reduces still pending never complete after this: their waiters
        see the group closed and fail.
        """
        with self.lock:
            self.closed = True
            self._plans.clear()
            self._window = None
            self._tail = None
            try:
                self._segment.close()
            except BufferError:
                pass  # something still exports it; unmapped when that is freed

    @property
    def buffer_bytes(self) -> int:
        """The most tensor bytes one pipeline chunk carries (a quarter slot)."""
        return self._slot_bytes // _BUFFERS

    @property
    def chunk_bytes(self) -> int:
        """How many tensor bytes a chunk carries in an all-reduce of up to ``_CHUNKS_PER_ALLREDUCE`` chunks."""
        return min(_CHUNK_BYTES, self.buffer_bytes // 4)

    @property
    def chunks_posted(self) -> int:
        """How many chunks all-reduces have posted through this channel so far."""
        return self._next_chunk


def _slot_layout(slot_bytes: int) -> tuple[int, int]:
    """``(buffer stride, slot stride)`` in bytes for slots carrying ``slot_bytes`` of tensor each."""
    buffer_stride = slot_bytes // _BUFFERS + _BUFFER_PAD
    return buffer_stride, buffer_stride * _BUFFERS + _SLOT_PAD


def _map_segment(comm: Any, nbytes: int) -> mmap.mmap | None:
    """Map one new shared file of ``nbytes`` zero bytes on every rank, or None on all. Collective.

    Rank 0 creates it (0600, in /dev/shm), everyone maps it, then rank 0
    removes the name: the mappings stay, and nothing is left behind at exit.
    """
    MPI = mpi()
    path = None
    fd = -1
    if comm.Get_rank() == 0:
        try:
            path = os.path.join(_SHM_DIR, f"hpccomm-{os.getpid()}-{secrets.token_hex(8)}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(fd, nbytes)
        except OSError:
            path = None
    path = comm.bcast(path, root=0)
    segment = None
    if path is not None:
        try:
            if fd < 0:
                fd = os.open(path, os.O_RDWR)
            segment = mmap.mmap(fd, nbytes)
        except OSError:
            segment = None
        finally:
            if fd >= 0:
                os.close(fd)
    mapped_everywhere = comm.allreduce(segment is not None, op=MPI.LAND)
    if comm.Get_rank() == 0 and path is not None:
        os.unlink(path)
    if not mapped_everywhere:
        if segment is not None:
            segment.close()
        return None
    return segment


class ShmAllreduce:
    """One all-reduce through a :class:`SharedMemoryChannel`: a Pending.

    Args:
        channel: the group's channel.
        ar: the engine's state for it (``hpccomm_shm_allreduce``), filled in.
        tensor: the tensor it reduces in place, held until it completes.
        previous: the all-reduce posted before it on the channel, driven first.
    """

    __slots__ = ("_channel", "_ar", "_tensor", "_previous")

    def __init__(self, channel: SharedMemoryChannel, ar: Any, tensor: torch.Tensor, previous: ShmAllreduce | None) -> None:
        self._channel = channel
        self._ar = ar
        self._tensor: torch.Tensor | None = tensor
        self._previous = previous

    def test(self) -> bool:
        """Advance as far as the other ranks allow; True once every chunk is done."""
        if self._tensor is None:
            return True
        previous = self._previous
        if previous is not None:
            if not previous.test():
                return False
            self._previous = None
        lock = self._channel.lock
        if not lock.acquire(blocking=False):
            return False
        try:
            if self._channel.closed:
                return False  # the group was aborted or shut down: the waiter raises
            state = _engine.lib.hpccomm_shm_allreduce_progress(self._ar, _POLLS_PER_TEST)
        finally:
            lock.release()
        if state < 0:
            raise RuntimeError(f"hpccomm all_reduce: the shared-memory engine could not reduce {self._tensor.dtype}")
        if state == 0:
            return False
        self._tensor = None  # done: hold no tensor
        return True

    def finish(self) -> None:
        pass
