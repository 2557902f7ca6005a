"""Work: the handle every hpccomm operation returns.

A transport turns an operation into a :class:`Pending`: communication already
posted (nonblocking MPI requests, say) plus local work to do once it lands
(copying a staging buffer back, dividing for AVG). :class:`HpcWork` drives a
Pending to completion from whichever thread gets there first:

* a blocking collective (torch's ``asyncOp`` false) is driven inline by
  :func:`complete_inline` on the calling thread, with no thread hop and no
  per-call Work object: it returns the shared :data:`COMPLETED`;
* the thread that calls :meth:`HpcWork.wait` polls it itself;
* the progress engine (:mod:`hpccomm.progress`, a layer above this one) polls
  asynchronous work that nobody is waiting on yet, so it overlaps with the
  caller's compute; it marks the work it takes on (:attr:`HpcWork.driven`).
  A thread that waits moves that work on between its own polls
  (:func:`while_waiting`): without the engine's thread, all of it, since a
  peer may be waiting for it; with the thread, work on host memory, while
  the thread stays off the GIL (:func:`driving`).

A per-work claim lock makes sure only one thread tests a request at a time,
as MPI requires. Every wait is bounded by the group's timeout. One idea a
module:

* :mod:`.pending`: what a transport hands back (:class:`Pending`);
* :mod:`.waiting`: how a thread waits for it (:func:`~.waiting.drive`);
* :mod:`.errors`: the errors a wait ends with (:class:`CommTimeoutError`);
* :mod:`.handles`: the Work objects themselves (:class:`HpcWork`).
"""

from __future__ import annotations

from .errors import CommTimeoutError, GroupClosedError, describe, timeout_error
from .handles import COMPLETED, CompletedWork, HpcWork, WorkList, complete_inline, finish_all, work_behind
from .pending import AllPending, Pending
from .waiting import NAP_S, SPIN_S, driving, while_waiting

__all__ = [
    "COMPLETED",
    "NAP_S",
    "SPIN_S",
    "AllPending",
    "CommTimeoutError",
    "CompletedWork",
    "GroupClosedError",
    "HpcWork",
    "Pending",
    "WorkList",
    "complete_inline",
    "describe",
    "driving",
    "finish_all",
    "timeout_error",
    "while_waiting",
    "work_behind",
]
