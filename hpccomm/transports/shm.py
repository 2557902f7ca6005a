"""Node-local all-reduce through shared memory.

Between ranks of one node, MPI libraries move a medium or large all-reduce
through their point-to-point protocols (rendezvous handshakes, single-copy
CMA, a temporary buffer), which at large sizes costs far more than the memory
traffic itself. When every rank of a group shares a node, hpccomm reduces large
tensors through a shared segment instead (a file in /dev/shm that every rank
maps, created and named through MPI), in three phases per chunk:

1. each rank copies its tensor into its own slot of the window;
2. each rank reduces its 1/n of the elements across all slots into its own
   slot (so every element is reduced by exactly one rank, and all ranks get
   the same bits) and into its tensor;
3. each rank copies every other rank's reduced part into its tensor.

A rank's own part never goes through the segment on the way in (it reads it
from its tensor), which saves 1/n of the copying.

Phases are separated by per-rank progress counters in the same segment,
published with release stores and polled with acquire loads
(``hpccomm._shm_sync``), not by MPI messages. A rank starts a chunk only when
every rank has finished the previous one, so one slot per rank suffices.
Tensors larger than a slot go through in slot-sized chunks. All-reduces on a
group's segment complete in the order they were posted; each one first drives
its predecessor, so no order of waits can deadlock.

Polling happens in :meth:`Pending.test`, so the usual machinery applies: a
blocking call drives it inline, asynchronous work is driven by the progress
engine, and timeouts and departed peers are noticed as for any other work.

Not a window from ``MPI_Win_allocate_shared``: freeing one is collective and
synchronising, so a group aborted on some ranks only would hang; unmapping a
file is local.
"""

from __future__ import annotations

import mmap
import os
import secrets
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..config import settings
from ..world import mpi
from . import half_reduce

try:
    from .. import _shm_sync as _sync
except ImportError:  # built without a C compiler: all-reduce stays on MPI
    _sync = None

RedOpType = dist.ReduceOp.RedOpType
_SHM_DIR = "/dev/shm"
_LINE = 64  # bytes: one progress counter per cache line, so ranks never share one
_COUNTER_STRIDE = _LINE // 8  # in int64s
_PHASES = 3
_BINARY = {
    RedOpType.SUM: torch.add,
    RedOpType.PRODUCT: torch.mul,
    RedOpType.MIN: torch.minimum,
    RedOpType.MAX: torch.maximum,
}
_KERNELS = {
    RedOpType.SUM: torch.Tensor.add_,
    RedOpType.PRODUCT: torch.Tensor.mul_,
    RedOpType.MIN: lambda out, other: torch.minimum(out, other, out=out),
    RedOpType.MAX: lambda out, other: torch.maximum(out, other, out=out),
}


class SharedMemoryChannel:
    """One group's shared-memory segment and the order of the all-reduces through it.

    Create it with :meth:`for_group`, on every rank of the group at once.

    Args:
        comm: the group's communicator; all its ranks share this node.
        segment: the mapped segment, ``_LINE * size + slot_bytes * size`` bytes.
        slot_bytes: the size of each rank's slot (a multiple of 64).
        min_bytes: smaller tensors stay on MPI's all-reduce.
    """

    def __init__(self, comm: Any, segment: mmap.mmap, slot_bytes: int, min_bytes: int) -> None:
        self._size = comm.Get_size()
        self._rank = comm.Get_rank()
        self._segment = segment
        self._slot_bytes = slot_bytes
        self.min_bytes = max(min_bytes, 1)
        self._header = _LINE * self._size
        self._window: torch.Tensor | None = torch.frombuffer(segment, dtype=torch.uint8)
        # The file was created empty, so every counter starts at zero.
        self._counters = _sync.ffi.cast("int64_t *", self._window.data_ptr())
        self._my_counter = self._counters + self._rank * _COUNTER_STRIDE
        self._slots: dict[torch.dtype, list[torch.Tensor]] = {}
        self._next_seq = 0
        self._tail: ShmAllreduce | None = None
        # Held while a step touches the segment, and by close(): the progress
        # thread and a waiter may both poll, and an abort must not unmap the
        # segment under a poll.
        self.lock = threading.Lock()
        self.closed = False

    @classmethod
    def for_group(cls, comm: Any) -> SharedMemoryChannel | None:
        """A channel for ``comm`` when all its ranks share a node, else None. Collective.

        None too where shared memory is turned off (``HPCCOMM_SHM_SLOT_BYTES=0``),
        the counters module was not built, or some rank cannot map the segment;
        every rank reaches the same answer.
        """
        slot_bytes = settings.shm_slot_bytes // _LINE * _LINE
        if slot_bytes == 0 or _sync is None or comm.Get_size() < 2:
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
        segment = _map_segment(comm, _LINE * comm.Get_size() + slot_bytes * comm.Get_size())
        if segment is None:
            return None
        return cls(comm, segment, slot_bytes, settings.shm_min_bytes)

    def accepts(self, tensor: torch.Tensor, kind: Any) -> bool:
        """Whether an all-reduce of ``tensor`` (contiguous, CPU) with ``kind`` goes through shared memory."""
        return tensor.nbytes >= self.min_bytes and kind in _KERNELS and tensor.dtype != torch.bool

    def allreduce(self, tensor: torch.Tensor, kind: Any) -> ShmAllreduce:
        """Post an in-place all-reduce of the contiguous ``tensor``; it runs as it is polled."""
        flat = tensor.view(-1)
        per_chunk = self._slot_bytes // tensor.element_size()
        chunks = max(1, -(-flat.numel() // per_chunk))
        work = ShmAllreduce(self, flat, _part_reducer(kind, tensor.dtype), self._next_seq, chunks, self._tail)
        self._next_seq += chunks
        self._tail = work
        return work

    def close(self) -> None:
        """Unmap the segment (local: ranks may close at different times).

        All-reduces still pending never complete after this: their waiters
        see the group closed and fail.
        """
        with self.lock:
            self.closed = True
            self._slots.clear()
            self._window = None
            self._tail = None
            try:
                self._segment.close()
            except BufferError:
                pass  # something still exports it; unmapped when that is freed

    # -- used by ShmAllreduce -------------------------------------------------

    def slots(self, dtype: torch.dtype) -> list[torch.Tensor]:
        """Every rank's slot, viewed as ``dtype``."""
        views = self._slots.get(dtype)
        if views is None:
            start = self._header
            views = [
                self._window[start + k * self._slot_bytes : start + (k + 1) * self._slot_bytes].view(dtype)
                for k in range(self._size)
            ]
            self._slots[dtype] = views
        return views

    def publish(self, value: int) -> None:
        """Tell the other ranks this rank has reached ``value``."""
        _sync.lib.hpccomm_shm_publish(self._my_counter, value)

    def reached(self, value: int) -> bool:
        """Whether every rank has reached ``value``."""
        return bool(_sync.lib.hpccomm_shm_reached(self._counters, self._size, _COUNTER_STRIDE, value))

    @property
    def chunks_posted(self) -> int:
        """How many chunks all-reduces have posted through this channel so far."""
        return self._next_seq

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size


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


def _part_reducer(kind: Any, dtype: torch.dtype) -> Callable[[torch.Tensor, torch.Tensor, list[torch.Tensor]], None]:
    """``reduce(out, mine, others)``: out = mine (kind) others[0] (kind) ..., element-wise."""
    if dtype in half_reduce.HALF_DTYPES:
        combine = half_reduce.tensor_reducer(kind, dtype)

        def reduce_half(out: torch.Tensor, mine: torch.Tensor, others: list[torch.Tensor]) -> None:
            combine(out, mine, others[0])
            for other in others[1:]:
                combine(out, out, other)

        return reduce_half
    binary, in_place = _BINARY[kind], _KERNELS[kind]

    def reduce_torch(out: torch.Tensor, mine: torch.Tensor, others: list[torch.Tensor]) -> None:
        binary(mine, others[0], out=out)
        for other in others[1:]:
            in_place(out, other)

    return reduce_torch


class ShmAllreduce:
    """One all-reduce through a :class:`SharedMemoryChannel`: a Pending.

    Args:
        channel: the group's channel.
        flat: the tensor, flattened (a view: results land in the caller's tensor).
        reduce_part: reduces one rank's part across all slots (see :func:`_part_reducer`).
        first_seq: the channel sequence number of its first chunk.
        chunks: how many slot-sized chunks it takes.
        previous: the all-reduce posted before it on the channel, driven first.
    """

    def __init__(
        self,
        channel: SharedMemoryChannel,
        flat: torch.Tensor,
        reduce_part: Any,
        first_seq: int,
        chunks: int,
        previous: ShmAllreduce | None,
    ) -> None:
        self._channel = channel
        self._flat = flat
        self._reduce_part = reduce_part
        self._first_seq = first_seq
        self._seq = first_seq
        self._end_seq = first_seq + chunks
        self._phase = 0
        self._per_chunk = -(-flat.numel() // chunks) if chunks else 0
        self._previous = previous

    def test(self) -> bool:
        """Advance as far as the other ranks allow; True once every chunk is done."""
        if self._seq == self._end_seq:
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
            while self._seq < self._end_seq:
                if not self._step():
                    return False
            self._flat = self._reduce_part = None  # done: hold no tensor
            return True
        finally:
            lock.release()

    def finish(self) -> None:
        pass

    def _step(self) -> bool:
        """Run the current phase of the current chunk if every rank is ready for it."""
        channel, seq, phase = self._channel, self._seq, self._phase
        if not channel.reached(_PHASES * seq + phase):
            # Another rank is still copying or reducing: if it shares this core
            # (more ranks and threads than cores), spinning would only delay it.
            os.sched_yield()
            return False
        rank, size = channel.rank, channel.size
        offset = (seq - self._first_seq) * self._per_chunk
        chunk = self._flat[offset : offset + self._per_chunk]
        count = chunk.numel()
        slots = channel.slots(chunk.dtype)
        lo, hi = count * rank // size, count * (rank + 1) // size  # the part this rank reduces
        mine = slots[rank]
        if phase == 0:
            # The others read their parts from this slot; this rank reads its own from the tensor.
            mine[:lo].copy_(chunk[:lo])
            mine[hi:count].copy_(chunk[hi:])
        elif phase == 1:
            if hi > lo:
                others = [slots[k][lo:hi] for k in range(size) if k != rank]
                self._reduce_part(mine[lo:hi], chunk[lo:hi], others)
                chunk[lo:hi].copy_(mine[lo:hi])
        else:
            for k in range(size):
                k_lo, k_hi = count * k // size, count * (k + 1) // size
                if k != rank and k_hi > k_lo:
                    chunk[k_lo:k_hi].copy_(slots[k][k_lo:k_hi])
        channel.publish(_PHASES * seq + phase + 1)
        if phase == _PHASES - 1:
            self._phase = 0
            self._seq += 1
        else:
            self._phase = phase + 1
        return True
