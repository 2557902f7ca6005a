"""Runtime settings, read from the environment once.

Every knob hpccomm understands lives here, so a reader has one place to look;
the documentation's configuration table is generated from :class:`Config`.
Values are read when this module is first imported; tests that need other
values set the environment before launching the ranks.

The MPI library settings hpccomm applies before MPI starts
(``library_defaults``) live in the launcher's package, ``hpccomm_run``, which
must start without importing this package (and torch).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _flag(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


#: Devices hpccomm routes tensors of, and the transports that may serve them.
DEVICES = ("cpu", "cuda")
TRANSPORTS = ("auto", "mpi", "ucc", "staged")


def _transports(name: str) -> tuple[tuple[str, str], ...]:
    """``HPCCOMM_TRANSPORT``: (device, transport) pairs; a bare transport name applies to every device."""
    value = os.environ.get(name, "").strip().lower() or "auto"
    routes = dict.fromkeys(DEVICES, "auto")
    for item in filter(None, (part.strip() for part in value.split(","))):
        device, _, transport = item.rpartition(":")
        if transport not in TRANSPORTS or (device and device not in DEVICES):
            raise ValueError(
                f"hpccomm: {name}={value!r}: {item!r} is not a transport ({', '.join(TRANSPORTS)}) "
                f"or device:transport (devices {', '.join(DEVICES)}), e.g. cpu:mpi,cuda:ucc"
            )
        if transport == "staged" and device != "cuda":
            raise ValueError(f"hpccomm: {name}={value!r}: 'staged' moves CUDA tensors only; write cuda:staged")
        for target in [device] if device else DEVICES:
            routes[target] = transport
    return tuple(routes.items())


def _size(name: str, default: int | None) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"hpccomm: {name}={value!r} is not a whole number of bytes") from None


def _count(name: str, default: int = 0) -> int:
    """A whole number of at least 0 (``default`` when unset)."""
    value = os.environ.get(name, "").strip()
    try:
        count = int(value or default)
    except ValueError:
        count = -1
    if count < 0:
        raise ValueError(f"hpccomm: {name}={value!r} is not a whole number of at least 0")
    return count


def _choice(name: str, choices: tuple[str, ...]) -> str:
    """The value of ``name``, one of ``choices`` (the first when unset)."""
    value = os.environ.get(name, "").strip().lower() or choices[0]
    if value not in choices:
        raise ValueError(f"hpccomm: {name}={value!r}; use {', '.join(choices)}")
    return value


#: Where CUDA tensors go to UCC on device memory, the largest message of each collective that still goes
#: through host memory (None: every size does), unless ``HPCCOMM_CUDA_STAGED_MAX_BYTES`` sets one limit for all.
#: Measured, not estimated: the GPU acceptance run of 2026-11-27 (tests/gpu/acceptance.sh: one H100 shared by
#: 2 ranks without MPS, torch 2.11, UCC 1.8.0 with tl/nccl kept out; benchmarks/cuda_allreduce.py --compare,
#: 4 B to 64 MiB), each the largest size measured at which the staged path beat UCC's: all-reduce 1,147 against
#: 1,285 us at 4 MiB, UCC from 16 MiB (1,353 against 4,857 us); all-gather 4.9 against 5.1 ms at 16 MiB, UCC at
#: 64 MiB (19.7 against 21.7 ms); broadcast 2.8 against 3.6 ms at 16 MiB, UCC at 64 MiB (14.6 against 17.0).
#: UCC never beat the staged path at reduce-scatter (16.3 against 19.5 ms at 64 MiB); reduce, gather and scatter
#: have not been timed on a GPU. An all-to-all has no size every rank sees alike (each rank's pieces are its
#: own), so it takes one path at every size (BySize): UCC (0), 1.6-25x faster than staging from 4 MiB (0.82
#: against 1.27 ms; 1.02 against 25.6 ms at 64 MiB), 1.2-4.9x slower below. The UCC path passed tests/gpu four
#: times in two runs that day. With one GPU per rank (no context switches between ranks, tl/nccl in the team)
#: UCC's side gains most: measure there and set the variable.
CUDA_STAGED_MAX_BYTES: dict[str, int | None] = {
    "all_reduce": 4 << 20,
    "all_gather": 16 << 20,
    "broadcast": 16 << 20,
    "all_to_all": 0,
    "reduce_scatter": None,
    "reduce": None,
    "gather": None,
    "scatter": None,
}


@dataclass(frozen=True)
class Config:
    """Settings that shape hpccomm's behaviour.

    Each entry below names its environment variable first: the documentation's
    configuration table is generated from these entries and the defaults
    :func:`_read` gives (``docs/hooks/config_table.py``).

    Attributes:
        debug: ``HPCCOMM_DEBUG``: ``1`` (or ``TORCH_DISTRIBUTED_DEBUG=DETAIL``)
            checks across ranks, before each collective, that op, sequence
            number, dtype, element counts, reduce op and root agree; a
            mismatch raises ``CollectiveMismatchError`` on every rank with a
            table of each rank's call, and nothing is posted. Costs two small
            nonblocking all-gathers per collective (about 50-65 us).
        progress_thread: ``HPCCOMM_PROGRESS_THREAD``: ``0`` disables the
            background thread that drives asynchronous operations; they then
            progress only while a thread of the rank waits on an operation,
            theirs or another.
        half_kernels: ``HPCCOMM_HALF_KERNELS``: which code reduces bfloat16
            and float16 inside MPI: ``auto`` (the fastest compiled vector path
            the CPU has, else torch), or at most ``avx512bf16``, ``avx512``,
            ``avx2`` or ``torch`` (for tests and comparisons).
        shm_slot_bytes: ``HPCCOMM_SHM_SLOT_BYTES``: each rank's slot in the
            shared segment the ranks of a group on one node communicate
            through, four pipeline buffers of a quarter each; ``0`` turns
            shared memory off.
        shm_min_bytes: ``HPCCOMM_SHM_MIN_BYTES``: when set, the smallest
            collective that goes through shared memory, for every collective;
            unset, each collective's own measured threshold
            (``hpccomm/transports/collective_paths.py``).
        shm_stream_min_bytes: ``HPCCOMM_SHM_STREAM_MIN_BYTES``: results of at
            least this many bytes per rank (an all-gather's output, an
            all-reduce's or broadcast's tensor) are written into the caller's
            tensors with non-temporal stores (x86-64), bypassing the cache;
            unset, the rank's share of the last-level cache (its size divided
            by the group's ranks that share one); ``0`` streams every result.
        algo: ``HPCCOMM_ALGO``: ``auto`` (the selector picks flat MPI, shared
            memory or hierarchical per call, by size), ``flat`` (MPI's own
            collectives on the whole group, always; no shared-memory segment
            is made) or ``hier`` (shared memory and the hierarchy wherever
            they apply, at every size).
        transports: ``HPCCOMM_TRANSPORT``: which transport serves each
            device: ``auto`` (CPU: MPI; CUDA, where torch sees a GPU: UCC on
            device memory where hpccomm's UCC has CUDA, else MPI on device
            memory where the MPI is CUDA-aware, else through host memory),
            ``mpi`` or ``ucc`` for every device, or per device
            (``cpu:mpi,cuda:staged``); ``staged`` (CUDA only) copies CUDA
            tensors to host memory and back around the CPU path; ``ucc``
            needs hpccomm built with UCC (for CUDA tensors, a UCC and UCX
            with CUDA).
        cuda_staged_max_bytes: ``HPCCOMM_CUDA_STAGED_MAX_BYTES``: where CUDA
            tensors go to device memory (UCC or a CUDA-aware MPI),
            collectives of at most this many bytes go through host memory
            instead; ``0`` sends every collective there (but barriers, and a
            CUDA-aware MPI's 16-bit float reductions; UCC's point-to-point
            is staged too). Unset (None), each collective has its own limit,
            measured on a GPU (:data:`CUDA_STAGED_MAX_BYTES`: all-reduce
            4 MiB, all-gather and broadcast 16 MiB, all-to-all on UCC at
            every size (it has no size every rank shares), reduce-scatter,
            reduce, gather and scatter always staged; one H100 shared by 2
            ranks, 2026-11-27); ``python
            benchmarks/cuda_allreduce.py --compare`` measures them on the
            machine at hand.
        ucc_triggered: ``HPCCOMM_UCC_TRIGGERED``: ``1`` posts UCC's CUDA
            collectives on an execution engine on the device's gate stream
            (``ucc_collective_triggered_post``, as PyTorch's ProcessGroupUCC)
            instead of once the host sees the inputs ready. It hung on a GPU:
            on an H100 (2026-11-27) its first all-reduce never ended (the
            likely cause, UCC's executor launch under CUDA's lazy loading, is
            worked around since, and has not run on a GPU:
            :mod:`hpccomm.transports.ucc_cuda`).
        ucc_in_place: ``HPCCOMM_UCC_IN_PLACE``: how UCC runs a reduction into
            the caller's CUDA tensor (all-reduce, reduce at the root):
            ``scratch`` reduces out of place into a buffer the group keeps
            (torch's allocator, freed with the group), then copies it back on
            the stream; ``native`` passes UCC's in-place flag (tl/ucp then
            pipelines it in 1 MiB fragments: many times slower on a GPU);
            ``tuned`` passes the flag with UCC's pipelining off and its CUDA
            pool's elements at 64 MiB (set before UCC starts unless you set
            ``UCC_TL_UCP_ALLREDUCE_SRA_KN_PIPELINE`` or
            ``UCC_MC_CUDA_MPOOL_ELEM_SIZE``). The GPU acceptance run measures
            all three.
        ft: ``HPCCOMM_FT``: ``1`` is fault-tolerant mode (``hpccomm-run
            --ft`` sets it): a rank's death no longer ends the job; the
            survivors' operations on groups that contain it raise
            ``hpccomm.PeerFailure``, whose ``failed_ranks`` they all agree
            on, and ``dist.shrink_group`` (torch >= 2.14) rebuilds the group
            without them. Needs MPI's ULFM (Open MPI 5, started with
            ``--with-ft ulfm``); CPU tensors only.
        ft_keep_bytes: ``HPCCOMM_FT_KEEP_BYTES``: in fault-tolerant mode, the
            largest result of an all-reduce, broadcast or all-gather of which
            each rank keeps a copy (its newest 16), to complete the operation
            on survivors whose copy failed when others completed it
            (:mod:`hpccomm.fault_tolerance.kept_results`). Each copy costs a pass over the
            result's memory; larger results are held by reference instead,
            usable while unchanged (their version counter, and no later
            operation posted on the same memory).
        ft_spares: ``HPCCOMM_FT_SPARES`` (``hpccomm-run --ft --spares K``
            sets it): in fault-tolerant mode, how many of the job's processes,
            the last ones, are spares: not ranks, waiting inside
            ``init_process_group`` until a dead rank's place is theirs
            (:mod:`hpccomm.fault_tolerance.spares`). 0 by default.
        goodbye_tree_from: ``HPCCOMM_GOODBYE_TREE_FROM``: from this many
            ranks up, a rank that leaves tells the others over a tree of the
            ranks, each passing the news on (:mod:`hpccomm.goodbye_tree`), not
            each rank itself; ``0`` never. A thread of each rank passes news
            on while the rank is busy outside hpccomm; it needs
            ``MPI_THREAD_MULTIPLE``. In fault-tolerant mode, from as many ranks
            of a group, the survivors' stops travel a tree of the group's
            ranks too (:mod:`hpccomm.fault_tolerance.stop_points`).
        store: ``HPCCOMM_STORE``: the job's store, where MASTER_ADDR and
            MASTER_PORT are not set (:mod:`hpccomm.rendezvous`): ``auto``
            (served over MPI by a thread of rank 0, :mod:`hpccomm.store`,
            where MPI provides ``MPI_THREAD_MULTIPLE``; else a file on one
            node, a TCPStore across nodes), ``mpi``, ``file`` (one node only)
            or ``tcp`` (torch's TCPStore on rank 0, on a port the kernel
            picks: it listens on every interface).
    """

    debug: bool
    progress_thread: bool
    half_kernels: str
    shm_slot_bytes: int
    shm_min_bytes: int | None
    shm_stream_min_bytes: int | None
    algo: str
    transports: tuple[tuple[str, str], ...]
    cuda_staged_max_bytes: int | None
    ucc_triggered: bool
    ucc_in_place: str
    ft: bool
    ft_keep_bytes: int
    ft_spares: int
    goodbye_tree_from: int
    store: str


def _read() -> Config:
    return Config(
        debug=_flag("HPCCOMM_DEBUG")
        or os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL",
        progress_thread=_flag("HPCCOMM_PROGRESS_THREAD", default=True),
        half_kernels=os.environ.get("HPCCOMM_HALF_KERNELS", "").strip().lower() or "auto",
        shm_slot_bytes=_size("HPCCOMM_SHM_SLOT_BYTES", 4 << 20),
        shm_min_bytes=_size("HPCCOMM_SHM_MIN_BYTES", None),
        shm_stream_min_bytes=_size("HPCCOMM_SHM_STREAM_MIN_BYTES", None),
        algo=_choice("HPCCOMM_ALGO", ("auto", "flat", "hier")),
        transports=_transports("HPCCOMM_TRANSPORT"),
        cuda_staged_max_bytes=_size("HPCCOMM_CUDA_STAGED_MAX_BYTES", None),
        ucc_triggered=_flag("HPCCOMM_UCC_TRIGGERED"),
        ucc_in_place=_choice("HPCCOMM_UCC_IN_PLACE", ("scratch", "native", "tuned")),
        ft=_flag("HPCCOMM_FT"),
        ft_keep_bytes=_size("HPCCOMM_FT_KEEP_BYTES", 64 << 10),
        ft_spares=_count("HPCCOMM_FT_SPARES"),
        goodbye_tree_from=_count("HPCCOMM_GOODBYE_TREE_FROM", 64),
        store=_choice("HPCCOMM_STORE", ("auto", "mpi", "file", "tcp")),
    )


def cuda_staged_limits(config: Config | None = None) -> dict[str, int | None]:
    """The largest message of each CUDA collective that goes through host memory (None: every size).

    ``HPCCOMM_CUDA_STAGED_MAX_BYTES`` where set, for every collective; else :data:`CUDA_STAGED_MAX_BYTES`.
    """
    override = (config or settings).cuda_staged_max_bytes
    if override is None:
        return dict(CUDA_STAGED_MAX_BYTES)
    return dict.fromkeys(CUDA_STAGED_MAX_BYTES, override)


settings: Config = _read()
