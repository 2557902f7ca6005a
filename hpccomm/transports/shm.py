"""Node-local collectives through shared memory: the segment and the engine that runs them.

Between ranks of one node, MPI libraries move medium and large messages
through their point-to-point protocols (rendezvous handshakes, single-copy
CMA, temporary buffers), which costs far more than the memory traffic itself.
The ranks of a group on one node share a segment instead: a file in /dev/shm
that every rank maps, created and named through MPI, holding per-rank progress
counters and a slot per rank.

One engine in C (``cffi_build/shm_collectives.c``, module
``hpccomm._shm_collectives``) runs all-reduce, reduce, broadcast, all-gather
and reduce-scatter through it: the data goes through in chunks, pipelined over
a few buffers per slot, each chunk in three phases per rank (copy in, reduce,
copy out) whose what depends on the collective. Ranks wait for each other on
the counters (release/acquire atomics), not on MPI messages. Reductions are
done by one owner per element, so every rank gets the same bits.

Both sizes that matter for speed follow each rank's share of the last-level
cache (:func:`cache_share_bytes`): a rank's chunks in flight (its pipeline
buffers) stay within a quarter of it, so a chunk one rank writes is still
cached when the others read it; and a result larger than the share is written
into the caller's tensors with non-temporal stores, so it neither reads each
destination line first nor evicts those chunks.

A :class:`SharedMemoryChannel` posts collectives on the segment; each is a
:class:`ShmOp`, a Pending whose :meth:`~ShmOp.test` calls the engine for a
bounded number of polls, so the usual machinery applies: a blocking call drives
it inline, asynchronous work is driven by the progress engine, and timeouts,
departed peers and aborts are noticed as for any other work. Collectives on a
channel complete in the order they were posted; each first drives its
predecessor, so no order of waits can deadlock. A collective may also wait for
a gate (an inter-node stage of a hierarchical collective, say) before it starts.

The channel works on addresses and element counts; the tensor-level
collectives (staging, AVG, aliasing) are :mod:`hpccomm.transports.node`'s.

Not a window from ``MPI_Win_allocate_shared``: freeing one is collective and
synchronising, so a group aborted on some ranks only would hang; unmapping a
file is local.
"""

from __future__ import annotations

import glob
import mmap
import os
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..config import settings
from ..world import mpi
from . import half_reduce

try:
    from .. import _shm_collectives as _engine
except ImportError:  # built without a C compiler: every collective stays on MPI
    _engine = None

RedOpType = dist.ReduceOp.RedOpType
#: The engine's collectives (cffi_build/shm_collectives.h).
ALLREDUCE, REDUCE, BROADCAST, ALLGATHER, REDUCE_SCATTER = range(5)
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
#: Bytes a chunk puts through a slot for collectives of up to _CHUNKS_PER_OP
#: chunks (capped at a quarter buffer); larger ones use larger chunks, up to a
#: buffer (a quarter slot): every chunk costs hand-offs, and where ranks
#: outnumber cores each hand-off may wait for a context switch. 256 KiB was
#: fastest for all-reduce at 1-4 MiB. Either is capped so that a rank's
#: buffers fill at most a quarter of its share of the last-level cache (see
#: SharedMemoryChannel.max_chunk_bytes).
_CHUNK_BYTES = 256 << 10
_CHUNKS_PER_OP = 16
#: The last-level cache size assumed where sysfs does not say.
_DEFAULT_CACHE_BYTES = 8 << 20
#: Polls per :meth:`ShmOp.test` before it returns to Python's checks.
_POLLS_PER_TEST = 256
_OP_CODES = {
    RedOpType.SUM: 0,
    RedOpType.PRODUCT: 1,
    RedOpType.MIN: 2,
    RedOpType.MAX: 3,
    RedOpType.BAND: 4,
    RedOpType.BOR: 5,
    RedOpType.BXOR: 6,
}
#: bool travels as 0/1 bytes, where "or" is MAX and "and" is MIN.
_BOOL_KINDS = {RedOpType.SUM: RedOpType.MAX, RedOpType.PRODUCT: RedOpType.MIN}
_BITWISE = (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR)
# The engine's own element types (cffi_build/shm_collectives.h); 16-bit floats
# are reduced by hpccomm._half_reduce's kernels.
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
    torch.bool: 3,
}

#: A block of a collective: (address, elements).
Block = tuple[int, int]


class SharedMemoryChannel:
    """The shared segment of a group's ranks on one node, and the order of the collectives through it.

    Create it with :meth:`create`, on every rank of the node's communicator at once.

    Args:
        comm: the communicator of the ranks on this node (all of them share it).
        segment: the mapped segment: ``_COUNTERS_PER_RANK`` lines of counters
            per rank, then one slot per rank (see :func:`_slot_layout`).
        slot_bytes: the data bytes each rank's slot holds (a multiple of
            64 * ``_BUFFERS``).
        cache_share: each rank's share of the last-level cache it uses
            (:func:`cache_share_bytes`), the same on every rank: chunk sizes
            derive from it and must agree.
    """

    def __init__(self, comm: Any, segment: mmap.mmap, slot_bytes: int, cache_share: int) -> None:
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()
        self._segment = segment
        self._slot_bytes = slot_bytes
        self._buffer_stride, self._slot_stride = _slot_layout(slot_bytes)
        # The file was created empty, so every counter starts at zero.
        self._window: torch.Tensor | None = torch.frombuffer(segment, dtype=torch.uint8)
        address = self._window.data_ptr()
        self._counters = _engine.ffi.cast("int64_t *", address)
        self._slots = _engine.ffi.cast("char *", address + _LINE * _COUNTERS_PER_RANK * self.size)
        self._plans: dict[tuple[torch.dtype, Any], Any] = {}
        #: The largest chunk: this rank's buffers in flight fill at most a
        #: quarter of its share of the cache, so a chunk is still cached when
        #: the other ranks read it (larger chunks ran up to 1.7x slower, 2-4 ranks).
        self.max_chunk_bytes = min(self.buffer_bytes, max(_LINE, cache_share // (4 * _BUFFERS)))
        #: Results of at least this many bytes are streamed into the caller's
        #: tensors (non-temporal stores): this rank's share of the cache.
        #: Replaceable, e.g. by a benchmark comparing both ways.
        self.stream_min_bytes = (
            settings.shm_stream_min_bytes if settings.shm_stream_min_bytes is not None else cache_share
        )
        # Resolved once: all_reduce's hot path makes one engine state per call.
        self._new = _engine.ffi.new
        self._state_type = _engine.ffi.typeof("hpccomm_shm_op *")
        self._next_chunk = 0
        self._tail: ShmOp | None = None
        # Held while the engine touches the segment, and by close(): the
        # progress thread and a waiter may both poll, and an abort must not
        # unmap the segment under a poll. Re-entrant: a hierarchical
        # collective holds it while it drives its stages.
        self.lock = threading.RLock()
        self.closed = False

    @classmethod
    def create(cls, comm: Any) -> SharedMemoryChannel | None:
        """A channel for ``comm``, whose ranks all share this node, or None. Collective.

        None where shared memory is turned off (``HPCCOMM_SHM_SLOT_BYTES=0``),
        the engine was not built, ``comm`` has one rank, or some rank cannot
        map the segment; every rank reaches the same answer.
        """
        granule = _LINE * _BUFFERS
        slot_bytes = settings.shm_slot_bytes // granule * granule
        if slot_bytes == 0 or _engine is None or comm.Get_size() < 2:
            return None
        size = comm.Get_size()
        segment = _map_segment(comm, (_LINE * _COUNTERS_PER_RANK + _slot_layout(slot_bytes)[1]) * size)
        if segment is None:
            return None
        cache_share = comm.allreduce(cache_share_bytes(size), op=mpi().MIN)
        return cls(comm, segment, slot_bytes, cache_share)

    # -- what the engine can do ---------------------------------------------

    def plan(self, dtype: torch.dtype, kind: Any) -> Any:
        """The engine's settings for collectives of ``dtype`` reduced with ``kind`` (None: no reduction).

        Everything but the collective and its data; made once per pair. None
        where the engine cannot reduce the pair (``kind`` is SUM, ..., BXOR).
        The reducing collectives take the plan, so a caller learns that before
        it stages, premultiplies or posts anything.
        """
        key = (dtype, kind)
        plan = self._plans.get(key, _UNPLANNED)
        if plan is not _UNPLANNED:
            return plan
        ffi, lib = _engine.ffi, _engine.lib
        if kind is None:
            reducer = (ffi.NULL, 0, 0, 0)
        elif dtype == torch.bool:
            kind = _BOOL_KINDS.get(kind, kind)
            reducer = (ffi.addressof(lib, "hpccomm_shm_reduce_into"), _DTYPE_CODES[dtype], _OP_CODES[kind], 0)
        elif dtype in half_reduce.HALF_DTYPES:
            half = half_reduce.compiled_reducer(kind, dtype) if kind not in _BITWISE else None
            # None where torch reduces them: those stay on MPI.
            reducer = None if half is None else (ffi.cast("hpccomm_shm_reducer", half[0]), *half[1:])
        elif dtype in _DTYPE_CODES and (kind == RedOpType.SUM or not dtype.is_complex):
            reducer = (ffi.addressof(lib, "hpccomm_shm_reduce_into"), _DTYPE_CODES[dtype], _OP_CODES[kind], 0)
        else:
            reducer = None
        plan = None
        if reducer is not None:
            plan = ffi.new("hpccomm_shm_op *")
            plan.counters, plan.slots = self._counters, self._slots
            plan.slot_stride, plan.buffer_stride = self._slot_stride, self._buffer_stride
            plan.size, plan.rank = self.size, self.rank
            plan.buffers = _BUFFERS
            plan.elem_size = dtype.itemsize
            plan.reduce, plan.dtype, plan.op, plan.path = reducer
        self._plans[key] = plan
        return plan

    def fits(self, dtype: torch.dtype, units: int) -> bool:
        """Whether a chunk of one element in each of ``units`` places fits a buffer."""
        return units * dtype.itemsize <= self.buffer_bytes

    # -- posting ------------------------------------------------------------

    def allreduce(self, tensor: torch.Tensor, plan: Any) -> ShmOp:
        """Post an in-place all-reduce of the contiguous CPU ``tensor``; it runs as it is polled.

        Args:
            plan: :meth:`plan` of the tensor's dtype and the reduction (not None).
        """
        return self._post(plan, ALLREDUCE, "all_reduce", tensor.numel(), 1, data=tensor.data_ptr(),
                          count=tensor.numel(), result_bytes=tensor.nbytes, keep=(tensor,))

    def reduce(self, tensor: torch.Tensor, root: int, plan: Any) -> ShmOp:
        """Post a reduce of the contiguous ``tensor`` into the root's (the others' stay as they are).

        Args:
            plan: :meth:`plan` of the tensor's dtype and the reduction (not None).
        """
        return self._post(plan, REDUCE, "reduce", tensor.numel(), 1, data=tensor.data_ptr(), count=tensor.numel(),
                          root=root, result_bytes=tensor.nbytes, keep=(tensor,))

    def broadcast(self, tensor: torch.Tensor, root: int, gate: Callable[[], bool] | None = None) -> ShmOp:
        """Post a broadcast of the root's contiguous ``tensor`` into the others'.

        Args:
            gate: polled before the broadcast starts; it starts once that returns True.
        """
        plan = self.plan(tensor.dtype, None)
        return self._post(plan, BROADCAST, "broadcast", tensor.numel(), 1, data=tensor.data_ptr(),
                          count=tensor.numel(), root=root, result_bytes=tensor.nbytes, gate=gate, keep=(tensor,))

    def allgather(
        self,
        dtype: torch.dtype,
        blocks: Sequence[Block],
        source: int = 0,
        blocks_per_rank: int = 1,
        gate: Callable[[], bool] | None = None,
        keep: tuple[Any, ...] = (),
    ) -> ShmOp:
        """Post an all-gather: every rank's blocks end up in every rank's output.

        Args:
            dtype: the element type.
            blocks: ``blocks_per_rank`` output blocks per rank, rank-major:
                where each rank's data lands, in every rank's output (each
                rank passes its own output's addresses).
            source: the address of this rank's data (its blocks back to back),
                or 0 when it is in its output blocks already (in place).
            blocks_per_rank: blocks each rank contributes.
            gate: polled before the all-gather starts; it starts once that returns True.
            keep: objects to hold until it completes (the tensors behind the addresses).
        """
        plan = self.plan(dtype, None)
        longest = max(count for _, count in blocks)
        output_bytes = sum(count for _, count in blocks) * dtype.itemsize
        return self._post(plan, ALLGATHER, "all_gather", longest, blocks_per_rank, data=source, blocks=blocks,
                          blocks_per_rank=blocks_per_rank, result_bytes=output_bytes, gate=gate, keep=keep)

    def reduce_scatter(
        self,
        plan: Any,
        blocks: Sequence[Block],
        output: int,
        blocks_per_rank: int = 1,
        keep: tuple[Any, ...] = (),
    ) -> ShmOp:
        """Post a reduce-scatter: each rank reduces its blocks of every rank's input into its output.

        Args:
            plan: :meth:`plan` of the element type and the reduction (not None).
            blocks: ``blocks_per_rank`` input blocks per rank, rank-major: the
                blocks each rank reduces, in this rank's input.
            output: the address where this rank's reduced blocks go, back to
                back. With one block per rank it may be one of the input
                blocks, of the same size (each chunk of a block is read before
                it is written); it must not overlap the input otherwise.
            blocks_per_rank: blocks each rank reduces.
            keep: objects to hold until it completes.
        """
        longest = max(count for _, count in blocks)
        return self._post(plan, REDUCE_SCATTER, "reduce_scatter", longest, self.size * blocks_per_rank,
                          data=output, blocks=blocks, blocks_per_rank=blocks_per_rank, keep=keep)

    def _post(
        self,
        plan: Any,
        kind: int,
        name: str,
        length: int,
        units: int,
        data: int = 0,
        count: int = 0,
        root: int = 0,
        blocks: Sequence[Block] | None = None,
        blocks_per_rank: int = 1,
        result_bytes: int = 0,
        gate: Callable[[], bool] | None = None,
        keep: tuple[Any, ...] = (),
    ) -> ShmOp:
        """Fill in an engine state from ``plan`` and queue it behind the channel's last collective.

        ``length`` elements of every one of ``units`` places go through each
        slot in chunks; every rank computes the same chunks, so the segment's
        chunk numbers stay in step. ``result_bytes`` is what the engine copies
        into the caller's memory on this rank (none for a reduce-scatter,
        whose reduction writes its output): streamed from
        :attr:`stream_min_bytes`.
        """
        op = self._new(self._state_type, plan[0])
        op.kind = kind
        op.root = root
        op.data = data
        op.count = count
        unit_bytes = units * plan.elem_size
        chunk = max(1, self.chunk_bytes // unit_bytes)
        if length > _CHUNKS_PER_OP * chunk:
            # Fewer, larger chunks for large tensors (up to a buffer): each chunk costs hand-offs.
            chunk = max(chunk, min(self.max_chunk_bytes // unit_bytes, -(-length // _CHUNKS_PER_OP)))
        op.chunk_elems = chunk
        op.stream = result_bytes >= self.stream_min_bytes
        op.chunks = chunks = -(-length // chunk)
        op.base = self._next_chunk
        self._next_chunk += chunks
        if blocks is not None:
            ffi = _engine.ffi
            addresses = ffi.new("uintptr_t[]", [address for address, _ in blocks])
            counts = ffi.new("size_t[]", [n for _, n in blocks])
            op.block_addr, op.block_count, op.blocks = addresses, counts, blocks_per_rank
            keep = (*keep, addresses, counts)
        work = ShmOp(self, op, name, keep, self._tail, gate)
        self._tail = work
        return work

    def close(self) -> None:
        """Unmap the segment (local: ranks may close at different times).

        Collectives still pending never complete after this: their waiters
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
    def slot_bytes(self) -> int:
        """The data bytes each rank's slot carries."""
        return self._slot_bytes

    @property
    def buffer_bytes(self) -> int:
        """The most data bytes one pipeline chunk carries through a slot (a quarter slot)."""
        return self._slot_bytes // _BUFFERS

    @property
    def chunk_bytes(self) -> int:
        """The bytes a chunk puts through a slot in collectives of up to ``_CHUNKS_PER_OP`` chunks."""
        return min(_CHUNK_BYTES, self.buffer_bytes // 4, self.max_chunk_bytes)

    @property
    def chunks_posted(self) -> int:
        """How many chunks collectives have posted through this channel so far."""
        return self._next_chunk


def cache_share_bytes(ranks: int) -> int:
    """Each of ``ranks`` ranks' share of the last-level cache, in bytes.

    The ranks are taken to spread evenly over the node's last-level caches
    (one per chiplet or socket on many nodes; CPUs are not pinned).
    """
    cache, sharing = last_level_cache()
    caches = max(1, (os.cpu_count() or sharing) // sharing)
    return cache // -(-ranks // caches)


def last_level_cache() -> tuple[int, int]:
    """This CPU's last-level data cache: (bytes, CPUs sharing it), from sysfs.

    The largest level of CPU 0's data or unified caches; where sysfs does not
    say, a default size shared by every CPU.
    """
    found: tuple[int, int, int] = (0, 0, 0)  # (level, bytes, CPUs sharing it)
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(os.path.join(index, "type")) as kind:
                if kind.read().strip() == "Instruction":
                    continue
            with open(os.path.join(index, "level")) as level, open(os.path.join(index, "size")) as size:
                entry = (int(level.read()), _bytes(size.read().strip()), _cpus_sharing(index))
        except (OSError, ValueError):
            continue
        found = max(found, entry)
    if not found[1]:
        return _DEFAULT_CACHE_BYTES, os.cpu_count() or 1
    return found[1], found[2]


def _cpus_sharing(index: str) -> int:
    """How many CPUs share the cache sysfs describes at ``index`` ('0-7,64-71' counts 16)."""
    with open(os.path.join(index, "shared_cpu_list")) as listed:
        count = 0
        for part in listed.read().strip().split(","):
            first, _, last = part.partition("-")
            count += int(last or first) - int(first) + 1
    return max(count, 1)


def _bytes(size: str) -> int:
    """sysfs's cache size ('8192K', '32M', '512') in bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if size[-1:].upper() in units:
        return int(size[:-1]) * units[size[-1:].upper()]
    return int(size)


def _slot_layout(slot_bytes: int) -> tuple[int, int]:
    """``(buffer stride, slot stride)`` in bytes for slots carrying ``slot_bytes`` of data each."""
    buffer_stride = slot_bytes // _BUFFERS + _BUFFER_PAD
    return buffer_stride, buffer_stride * _BUFFERS + _SLOT_PAD


def _map_segment(comm: Any, nbytes: int) -> mmap.mmap | None:
    """Map one new shared file of ``nbytes`` zero bytes on every rank, or None on all. Collective.

    Rank 0 creates it (0600, in /dev/shm), everyone maps it, then rank 0
    removes the name: the mappings stay, and nothing is left behind at exit.
    The name goes also where the call raises (a peer died while the group was
    built, and fault-tolerant mode goes on); only a rank 0 killed between its
    creation and the others' mapping leaves it.
    """
    MPI = mpi()
    made = None  # the name this rank created: removed below, whatever happens in between
    offered = None  # rank 0's: the name, once the file has its size
    fd = -1
    if comm.Get_rank() == 0:
        try:
            name = os.path.join(_SHM_DIR, f"hpccomm-{os.getpid()}-{secrets.token_hex(8)}")
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            made = name
            os.ftruncate(fd, nbytes)
            offered = made
        except OSError:
            pass
    segment = None
    try:
        path = comm.bcast(offered, root=0)
        if path is not None:
            try:
                if fd < 0:
                    fd = os.open(path, os.O_RDWR)
                segment = mmap.mmap(fd, nbytes)
            except OSError:
                segment = None
        mapped_everywhere = comm.allreduce(segment is not None, op=MPI.LAND)
    finally:
        # Also where this raised (a peer died in the bcast, say): no file outlives the call.
        if fd >= 0:
            os.close(fd)
        if made is not None:
            os.unlink(made)
    if not mapped_everywhere:
        if segment is not None:
            segment.close()
        return None
    return segment


class ShmOp:
    """One collective through a :class:`SharedMemoryChannel`: a Pending.

    Args:
        channel: the channel it runs on.
        op: the engine's state for it (``hpccomm_shm_op``), filled in.
        name: the collective's name, for errors.
        keep: what it reads or writes (tensors, address arrays), held until it completes.
        previous: the collective posted before it on the channel, driven first.
        gate: polled before it starts; it starts once that returns True.
    """

    #: The path that serves it, as the profiler names it (:mod:`hpccomm.profiling`).
    path = "shm"

    __slots__ = ("_channel", "_op", "_name", "_keep", "_previous", "_gate", "after")

    def __init__(
        self,
        channel: SharedMemoryChannel,
        op: Any,
        name: str,
        keep: tuple[Any, ...],
        previous: ShmOp | None,
        gate: Callable[[], bool] | None = None,
    ) -> None:
        self._channel = channel
        self._op = op
        self._name = name
        self._keep: tuple[Any, ...] | None = keep
        self._previous = previous
        self._gate = gate
        #: Local steps to run once it completes (copy-back, AVG's division), in order.
        self.after: list[Callable[[], None]] = []

    def test(self) -> bool:
        """Advance as far as the other ranks allow; True once every chunk is done."""
        if self._keep is None:
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
            gate = self._gate
            if gate is not None:
                if not gate():
                    return False
                self._gate = None
            state = _engine.lib.hpccomm_shm_progress(self._op, _POLLS_PER_TEST)
        finally:
            lock.release()
        if state < 0:
            raise RuntimeError(f"hpccomm {self._name}: the shared-memory engine could not reduce these elements")
        if state == 0:
            return False
        self._keep = None  # done: hold no tensor
        return True

    def finish(self) -> None:
        for step in self.after:
            step()
