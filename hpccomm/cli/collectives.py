"""The collectives the bench sweeps: sizes, bus-bandwidth factors, buffers and expected results.

Sizes and bandwidths follow nccl-tests (its doc/PERFORMANCE.md): the size of
a row is the bytes of the whole array, which for all_gather is the output
(every rank's part), for reduce_scatter the input and for all_to_all one
rank's buffer; ``algbw = size / time`` and ``busbw = algbw x factor`` with the
factor of :func:`bus_factor`, so that busbw can be compared with the
hardware's link bandwidth whatever the number of ranks.

A :class:`Case` holds the tensors of one (collective, size, placement) on
this rank, shared by every contender so that they all move the same bytes. It
fills the inputs with a small rank-dependent pattern (values 0-3, or 1-2 for
PRODUCT, periodic in the element index), which keeps every result exact in
every dtype, and counts the elements of a result that differ from the
expected values computed here, locally.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

OUT_OF_PLACE = "out-of-place"
IN_PLACE = "in-place"
PLACEMENTS = (OUT_OF_PLACE, IN_PLACE)

RedOpType = dist.ReduceOp.RedOpType

#: Reduce ops by their nccl-tests name.
REDUCE_OPS = {
    "sum": RedOpType.SUM,
    "prod": RedOpType.PRODUCT,
    "min": RedOpType.MIN,
    "max": RedOpType.MAX,
    "avg": RedOpType.AVG,
}

#: dtypes by name: nccl-tests' names and torch's.
DTYPES = {
    "float": torch.float32,
    "float32": torch.float32,
    "double": torch.float64,
    "float64": torch.float64,
    "half": torch.float16,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int": torch.int32,
    "int64": torch.int64,
}

# Every pattern repeats with this period in the element index.
_PERIOD = 4


@dataclass(frozen=True)
class Collective:
    """What the bench needs to know about one collective.

    Attributes:
        name: the name on the command line and in the tables.
        placements: which of out-of-place / in-place torch's API offers.
        reduces: takes a reduce op.
        rooted: takes a root rank.
        split: the count must divide evenly among the ranks.
        legs: messages per timed call; the time reported is per leg
            (send/recv ping-pong: a round trip is two legs).
        min_ranks: the fewest ranks it runs on.
    """

    name: str
    placements: tuple[str, ...]
    reduces: bool = False
    rooted: bool = False
    split: bool = False
    legs: int = 1
    min_ranks: int = 1


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        # torch's all_reduce, broadcast and reduce have no out-of-place form.
        Collective("all_reduce", (IN_PLACE,), reduces=True),
        Collective("all_gather", PLACEMENTS, split=True),
        Collective("reduce_scatter", PLACEMENTS, reduces=True, split=True),
        Collective("all_to_all", (OUT_OF_PLACE,), split=True),
        Collective("broadcast", (IN_PLACE,), rooted=True),
        Collective("reduce", (IN_PLACE,), reduces=True, rooted=True),
        Collective("sendrecv", (OUT_OF_PLACE,), legs=2, min_ranks=2),
    )
}

#: torch's names for the collectives, accepted on the command line too.
ALIASES = {
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "send_recv": "sendrecv",
    "pingpong": "sendrecv",
}


def bus_factor(name: str, nranks: int) -> float:
    """nccl-tests' busbw / algbw factor for collective ``name`` on ``nranks`` ranks.

    Args:
        name: a key of :data:`COLLECTIVES`.
        nranks: the number of ranks taking part.
    """
    if name == "all_reduce":
        return 2 * (nranks - 1) / nranks
    if name in ("all_gather", "reduce_scatter", "all_to_all"):
        return (nranks - 1) / nranks
    if name in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise KeyError(f"hpccomm bench: no collective named {name!r}")


def bandwidths(name: str, nbytes: int, time_s: float | None, nranks: int) -> tuple[float | None, float | None]:
    """algbw and busbw (GB/s) of a row of ``name``: ``nbytes`` in ``time_s`` (None, None without a time)."""
    if not time_s:
        return None, None
    algbw = nbytes / time_s / 1e9
    return algbw, algbw * bus_factor(name, nranks)


def element_count(collective: Collective, nbytes: int, itemsize: int, nranks: int) -> int:
    """Elements of the whole array for a requested size: a whole number of elements, at least one per rank.

    Args:
        collective: the collective.
        nbytes: the size asked for, in bytes.
        itemsize: bytes per element.
        nranks: the number of ranks.
    """
    count = max(nbytes // itemsize, 1)
    if collective.split:
        count = max(count // nranks, 1) * nranks
    return count


def _rank_tile(rank: int, op: RedOpType | None) -> torch.Tensor:
    """One period of the values ``rank`` contributes, as exact int64."""
    index = torch.arange(_PERIOD, dtype=torch.int64)
    if op == RedOpType.PRODUCT:
        return 1 + (index + rank) % 2
    return (index + 3 * rank) % _PERIOD


def _reduced_tile(nranks: int, op: RedOpType, dtype: torch.dtype) -> torch.Tensor:
    """One period of the reduction of every rank's values, in ``dtype`` as hpccomm computes it."""
    tiles = torch.stack([_rank_tile(r, op) for r in range(nranks)])
    if op == RedOpType.PRODUCT:
        exact = tiles.prod(dim=0)
    elif op == RedOpType.MIN:
        exact = tiles.min(dim=0).values
    elif op == RedOpType.MAX:
        exact = tiles.max(dim=0).values
    else:
        exact = tiles.sum(dim=0)
    result = _cast(exact, dtype)
    if op == RedOpType.AVG:
        # Summed exactly, then divided in the dtype, as an MPI SUM and div_ do.
        if dtype.is_floating_point:
            return result.div(nranks)
        return result.div(nranks, rounding_mode="trunc")
    return result


def _cast(exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``exact`` (int64) in ``dtype``; integers wrap as MPI's fixed-width arithmetic does."""
    if dtype.is_floating_point:
        return exact.to(torch.float64).to(dtype)
    return exact.to(dtype)


def _periodic(tile: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """``length`` elements of the periodic sequence ``tile``, from index ``start``."""
    shifted = torch.roll(tile, -(start % _PERIOD))
    return shifted.repeat(-(-length // _PERIOD))[:length]


def pattern(rank: int, start: int, length: int, dtype: torch.dtype, op: RedOpType | None = None) -> torch.Tensor:
    """The values ``rank`` puts at elements ``start .. start+length`` of its input.

    Args:
        rank: the contributing rank.
        start: index of the first element.
        length: number of elements.
        dtype: the tensor's dtype.
        op: the reduce op (PRODUCT gets values 1-2, everything else 0-3).
    """
    return _periodic(_cast(_rank_tile(rank, op), dtype), start, length)


class Case:
    """This rank's tensors for one (collective, count, placement), and the expected result.

    Args:
        collective: the collective.
        count: elements of the whole array (see :func:`element_count`).
        dtype: element type.
        op: the reduce op (ignored by collectives that do not reduce).
        root: the root rank of broadcast and reduce.
        placement: :data:`OUT_OF_PLACE` or :data:`IN_PLACE`.
        rank: this rank.
        nranks: the number of ranks.
    """

    def __init__(
        self,
        collective: Collective,
        count: int,
        dtype: torch.dtype,
        op: RedOpType,
        root: int,
        placement: str,
        rank: int,
        nranks: int,
    ) -> None:
        self.collective = collective
        self.count = count
        self.dtype = dtype
        self.op = op if collective.reduces else None
        self.root = root
        self.placement = placement
        self.rank = rank
        self.nranks = nranks
        self.chunk = count // nranks if collective.split else count
        #: The ping-pong partner (-1: this rank sits out, an odd rank left over).
        self.peer = self._partner()
        self.input, self.output = self._allocate()
        self._sentinel = self._sentinel_value()
        self.expected = self._expected()

    def _partner(self) -> int:
        if self.collective.name != "sendrecv":
            return -1
        peer = self.rank ^ 1
        return peer if peer < self.nranks else -1

    def _allocate(self) -> tuple[torch.Tensor, torch.Tensor]:
        name, count, chunk, rank = self.collective.name, self.count, self.chunk, self.rank
        empty = lambda n: torch.empty(n, dtype=self.dtype)  # noqa: E731
        if name == "all_gather":
            out = empty(count)
            inp = out[rank * chunk : (rank + 1) * chunk] if self.placement == IN_PLACE else empty(chunk)
            return inp, out
        if name == "reduce_scatter":
            inp = empty(count)
            out = inp[rank * chunk : (rank + 1) * chunk] if self.placement == IN_PLACE else empty(chunk)
            return inp, out
        if self.placement == IN_PLACE:
            buf = empty(count)
            return buf, buf
        return empty(count), empty(count)

    def _sentinel_value(self) -> float:
        # Never a valid result: patterns and their reductions are small and non-negative.
        return 255 if self.dtype == torch.uint8 else -7

    def reset(self) -> None:
        """Fill the input with this rank's pattern and the rest of the output with a sentinel."""
        name = self.collective.name
        if self.placement == OUT_OF_PLACE or name == "all_gather":
            self.output.fill_(self._sentinel)
        # all_gather: each rank's part sits at its own offset of the whole array.
        start = self.rank * self.chunk if name == "all_gather" else 0
        self.input.copy_(pattern(self.rank, start, self.input.numel(), self.dtype, self.op))

    def _expected(self) -> torch.Tensor | None:
        """What this rank's output must hold after one call from :meth:`reset`; None if nothing."""
        name, dtype, chunk, rank, nranks = self.collective.name, self.dtype, self.chunk, self.rank, self.nranks
        if name == "all_reduce" or (name == "reduce" and rank == self.root):
            return _periodic(_reduced_tile(nranks, self.op, dtype), 0, self.count)
        if name == "reduce":
            return None  # torch leaves a non-root's tensor unspecified
        if name == "reduce_scatter":
            return _periodic(_reduced_tile(nranks, self.op, dtype), rank * chunk, chunk)
        if name == "all_gather":
            return torch.cat([pattern(r, r * chunk, chunk, dtype) for r in range(nranks)])
        if name == "all_to_all":
            # Part r of rank j's input lands as part j of rank r's output.
            return torch.cat([pattern(j, rank * chunk, chunk, dtype) for j in range(nranks)])
        if name == "broadcast":
            return pattern(self.root, 0, self.count, dtype)
        if name == "sendrecv":
            return None if self.peer < 0 else pattern(self.peer, 0, self.count, dtype)
        raise KeyError(name)

    def wrong(self, output: torch.Tensor | None = None) -> int:
        """Elements of ``output`` (default: the case's output) that differ from the expected result.

        Args:
            output: where the contender left its result, if not in :attr:`output`
                (MPI's in-place reduce_scatter writes the first part of the buffer).
        """
        if self.expected is None:
            return 0
        got = self.output if output is None else output
        return int(torch.ne(got, self.expected).sum())


#: Makes one blocking call of a case; built once per (contender, case).
Call = Callable[[], None]
