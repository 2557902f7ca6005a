"""The timing loop: contenders interleaved in rounds of back-to-back calls, slowest rank's median.

For one size, every (contender, placement) pair is a *variant*. The variants
take turns in rounds, in an order shuffled each round (the same order on every
rank: the seed is the round number): this machine's noise comes in phases of
seconds, and short rounds spread each phase over all contenders alike. In a
round each variant makes ``block`` calls in a row, so its times are of
back-to-back calls, as in nccl-tests' and OSU's loops, with the caches as that
library leaves them (one call between another library's calls inherits that
library's cache footprint instead).

Before a variant's block its inputs are written again (so in-place results
stay small and exact); after the block, one more call from freshly written
inputs is checked element by element against the expected result: ``#wrong``.
Neither is timed. Each call is timed on its own; after the last round the
ranks take the maximum of each call's time (the slowest rank decides when a
collective is done) and the median of those is the row's time.
"""

from __future__ import annotations

import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .collectives import Call, Case
from .console import StopSignal


@dataclass
class Variant:
    """One contender on one placement of a case.

    Attributes:
        contender: the contender's name.
        case: the tensors it works on (shared with the other contenders).
        call: one blocking call.
        result: where the call leaves its result (None: ``case.output``).
        unsupported: why it cannot run, or None.
    """

    contender: str
    case: Case
    call: Call | None
    result: torch.Tensor | None = None
    unsupported: str | None = None
    samples: list[float] = field(default_factory=list)
    wrong: int = 0


@dataclass
class Measurement:
    """What one variant gave at one size.

    Attributes:
        contender: the contender's name.
        placement: out-of-place or in-place.
        time_s: median over calls of the slowest rank's time per leg (None: not run).
        iterations: timed calls.
        wrong: wrong elements over every check, summed over ranks.
        unsupported: why it did not run, or None.
    """

    contender: str
    placement: str
    time_s: float | None
    iterations: int
    wrong: int
    unsupported: str | None


def measure(
    variants: list[Variant],
    iterations: int,
    warmup: int,
    block: int,
    check: bool,
    comm: Any,
    MPI: Any,
    stop: StopSignal,
    on_round: Callable[[], None] | None = None,
) -> list[Measurement]:
    """Time every variant at one size; collective over ``comm``.

    Args:
        variants: the variants, in the same order on every rank.
        iterations: timed calls per variant.
        warmup: untimed calls per variant first.
        block: calls in a row per variant and round.
        check: count wrong elements after each block.
        comm: the bench's own MPI communicator (for the agreement steps).
        MPI: the mpi4py module.
        stop: the stop request; the loop ends early, after a whole round, once
            every rank agrees.
        on_round: called after each round (the progress bar).
    """
    for variant in variants:
        _warm_up(variant, warmup)
    _agree_on_unsupported(variants, comm, MPI)
    live = [v for v in variants if v.unsupported is None]
    rounds = -(-iterations // max(block, 1))
    for index in range(rounds):
        calls = min(block, iterations - index * block)
        order = list(live)
        random.Random(index).shuffle(order)  # the same order on every rank
        for variant in order:
            _timed_block(variant, calls)
            if check:
                variant.case.reset()
                variant.call()
                variant.wrong += variant.case.wrong(variant.result)
        if on_round is not None:
            on_round()
        if stop.should_stop(comm, MPI):
            break
    return [_summarise(v, comm, MPI) for v in variants]


def _warm_up(variant: Variant, calls: int) -> None:
    if variant.unsupported is not None:
        return
    try:
        variant.case.reset()
        for _ in range(max(calls, 1)):
            variant.call()
    except Exception as exc:  # the contender lacks this op/dtype: reported as n/a
        variant.unsupported = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]


def _agree_on_unsupported(variants: list[Variant], comm: Any, MPI: Any) -> None:
    """A variant that failed its warm-up on any rank sits out on every rank."""
    failed = np.array([v.unsupported is not None for v in variants], dtype=np.int32)
    comm.Allreduce(MPI.IN_PLACE, failed, op=MPI.MAX)
    for variant, flag in zip(variants, failed):
        if flag and variant.unsupported is None:
            variant.unsupported = "failed on another rank"


def _timed_block(variant: Variant, calls: int) -> None:
    variant.case.reset()
    time_calls(variant.call, calls, variant.samples)


def time_calls(call: Callable[[], None], calls: int, samples: list[float]) -> None:
    """Make ``calls`` calls in a row, appending each one's time to ``samples``."""
    clock = time.perf_counter
    for _ in range(calls):
        start = clock()
        call()
        samples.append(clock() - start)


def slowest_median(samples: list[float], comm: Any, MPI: Any) -> float:
    """Median over calls of the slowest rank's time (every rank made the same calls); collective over ``comm``."""
    times = np.array(samples, dtype=np.float64)
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)  # per call: the slowest rank
    return float(np.median(times))


def _summarise(variant: Variant, comm: Any, MPI: Any) -> Measurement:
    placement = variant.case.placement
    wrong = comm.allreduce(variant.wrong, op=MPI.SUM)
    if variant.unsupported is not None or not variant.samples:
        return Measurement(variant.contender, placement, None, 0, wrong, variant.unsupported)
    median = slowest_median(variant.samples, comm, MPI) / variant.case.collective.legs
    return Measurement(variant.contender, placement, median, len(variant.samples), wrong, None)
