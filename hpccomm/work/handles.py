"""The Work objects hpccomm returns: :class:`HpcWork` for a posted operation, :data:`COMPLETED` for a blocking one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.futures import Future

from .. import callbacks
from ..tracing import untraced
from .errors import CommTimeoutError, timeout_error
from .pending import Label, Pending
from .waiting import NAP_S, check_abandoned, drive


def complete_inline(pending: Pending, label: Label, timeout_s: float) -> "CompletedWork":
    """Drive a blocking operation to completion on this thread.

    Raises:
        CommTimeoutError: it did not complete within ``timeout_s``.
        PeerExitedError: a rank it needs has left the job.
    """
    # Not getattr(pending, "test_inline", pending.test), which makes both bound methods every call.
    test = getattr(pending, "test_inline", None) or pending.test
    # Most small operations complete within two polls: skip the clock read then.
    if not test() and not test() and not drive(test, time.monotonic() + timeout_s, label):
        raise timeout_error(label, timeout_s)
    pending.finish()
    return COMPLETED


class _Probe(threading.local):
    """While active, an hpccomm Work's ``get_future()`` names itself instead (see :func:`work_behind`)."""

    active = False
    found: dist.Work | None = None
    #: What get_future() hands back while probing; nobody waits on it.
    answer = Future()

    def found_in(self, work: dist.Work) -> Future:
        self.found = work
        return self.answer


_probe = _Probe()


def work_behind(holder: dist.Work) -> dist.Work | None:
    """The hpccomm Work inside torch's holder, or None when ``holder`` holds another backend's Work.

    torch >= 2.14 wraps the Work a Python backend returns in a C++ holder that
    passes only ``wait()`` and ``get_future()`` on; ``get_future()`` reaches
    the hpccomm Work, which, while probed, names itself and does nothing else.
    """
    _probe.active, _probe.found = True, None
    try:
        holder.get_future()
    except Exception:  # another backend's Work without a future
        return None
    finally:
        _probe.active = False
    found, _probe.found = _probe.found, None
    return found


@untraced
class CompletedWork(dist.Work):
    """The Work of a blocking operation, which has completed before it is returned.

    torch's blocking API only calls ``wait()`` on it; one shared instance
    saves a Work object per call on the latency-critical path.
    """

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return None

    def get_future(self) -> Future:
        if _probe.active:
            return _probe.found_in(self)
        raise RuntimeError(
            "hpccomm: this operation ran blocking (async_op=False) and has completed; "
            "pass async_op=True to get a Work with a future"
        )


COMPLETED = CompletedWork()


@untraced
class HpcWork(dist.Work):
    """Handle for one posted operation.

    Args:
        pending: the posted communication and its follow-up.
        outputs: the tensors the operation writes; the future's value.
        label: (op name, group, sequence number, peers), for error messages.
        timeout_s: the group's timeout in seconds; bounds every wait on this work.
        ended: called once when the work ends, however it ends, on the thread
            that ends it (the profiler's span, :mod:`hpccomm.profiling`).
        on_host: every tensor it reads or writes is in host memory, so any
            thread may poll it; else (the default) only hpccomm's own threads
            and its own waiters do (:mod:`hpccomm.own_threads`).
    """

    def __init__(
        self,
        pending: Pending,
        outputs: list[torch.Tensor],
        label: Label,
        timeout_s: float,
        ended: Callable[[], None] | None = None,
        on_host: bool = False,
    ) -> None:
        super().__init__()
        self._pending = pending
        self.on_host = on_host
        self._ended = ended
        self._outputs = outputs
        self._label = label
        self._timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s
        # Re-entrant: a future callback run on completion may call wait().
        self._claim = threading.RLock()
        # Orders the future's creation with the work's end, so one of them settles it, once; never held
        # while driving, so get_future() returns at once while another thread's wait() holds the claim.
        self._future_lock = threading.Lock()
        self._done = False
        self._error: BaseException | None = None
        # Settled with the outputs or a _Failed; callers get _public_future, chained to it.
        self._future: Future | None = None
        self._public_future: Future | None = None
        # Threads inside wait(): each drives the work itself, so the progress
        # thread leaves it alone rather than contend with them for the GIL.
        self.waiters = 0
        # Set by the progress engine once its thread has taken this work on: it then
        # completes with nobody waiting, and its future settles by itself.
        self.driven = False

    # -- driving ---------------------------------------------------------

    def poll(self, defer_callbacks: bool = False) -> bool:
        """Progress once without blocking; True when the work has ended.

        Skips a work some waiter is driving.

        Args:
            defer_callbacks: settle the future (and so run its callbacks) on a
                :mod:`~hpccomm.callbacks` runner thread instead of this one:
                the progress thread must never block in a user's callback.
        """
        if self._done:
            return True
        if not self._claim.acquire(blocking=False):
            return False
        try:
            if not self._done:
                if self._pending.test():
                    self._complete(None, defer_callbacks)
                elif time.monotonic() > self._deadline:
                    self._complete(self._timeout_error(self._timeout_s), defer_callbacks)
                else:
                    check_abandoned(self._label)
        except Exception as exc:  # noqa: BLE001
            # The work ends with it, whatever it is: raised here it would end the progress thread, which
            # drives every other work (a bug once did that, and DDP's next backward waited forever).
            self._complete(exc, defer_callbacks)
        finally:
            self._claim.release()
        return self._done

    @property
    def collective(self) -> bool:
        """Whether every rank of its group takes part (not a point-to-point operation)."""
        return self._label[3] is None

    def ended_when_posted(self) -> bool:
        """Test the just-posted work once, completing it if its communication is done.

        Only for a work no other thread can see yet, which needs neither
        :meth:`poll`'s claim nor its clock and departed-peer checks: 0.6-0.9 us
        against poll's 9-12 us on a receive still waiting for its message.
        """
        if self._pending.test():
            self._complete(None)
        return self._done

    def wait_posted(self) -> None:
        """Drive the work until its communication has gone out (not until it ends), within the group's timeout.

        For an operation its path posts only once its inputs are ready
        (a Pending's ``posted``: a device path's deferred post), before a
        blocking MPI call of hpccomm's own, which polls nothing, while a peer
        may wait for this operation before it joins that call. An error, or
        the timeout, ends the work; without a deferred post it returns at once.
        """
        posted = getattr(self._pending, "posted", None)
        if posted is None:
            return
        # A thread in wait() drives it out itself, maybe until it ends (a peer may receive only after this rank's
        # blocking call): not waited for; a poll holds the claim for a moment.
        while not self._claim.acquire(timeout=NAP_S):
            if self.waiters or self._done or time.monotonic() > self._deadline:
                return
        try:
            if not self._done:
                self.waiters += 1  # so the wait's own moves of other works leave this one alone
                try:
                    if not drive(posted, self._deadline, self._label):
                        self._complete(self._timeout_error(self._timeout_s))
                finally:
                    self.waiters -= 1
        except Exception as exc:  # a departed peer, a closed group: the work ends with it
            self._complete(exc)
        finally:
            self._claim.release()

    def _complete(self, error: BaseException | None, defer_callbacks: bool = False) -> None:
        if error is None:
            try:
                self._pending.finish()
            except BaseException as exc:  # surfaced through wait() and the future
                error = exc
        self._error = error
        if self._ended is not None:  # before the work reads as done: a waiter that sees it done sees it ended
            self._ended()
        with self._future_lock:
            self._done = True
            future = self._future
        if future is not None:
            if defer_callbacks:
                callbacks.runner().submit(lambda: self._settle_future(future))
            else:
                self._settle_future(future)

    def _settle_future(self, future: Future) -> None:
        future.set_result(self._outputs if self._error is None else _Failed(self._error))

    def _timeout_error(self, waited_s: float, final: bool = True) -> CommTimeoutError:
        return timeout_error(self._label, waited_s, final)

    # -- torch.distributed.Work API ---------------------------------------

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the work ends; raise its error, or a timeout error.

        Args:
            timeout: wait at most this long (never past the group timeout);
                None or zero means the group timeout.
        """
        if not self._done:
            limit = self._deadline
            waited = self._timeout_s
            if timeout is not None and timeout.total_seconds() > 0:
                waited = timeout.total_seconds()
                limit = min(limit, time.monotonic() + waited)
            # Another thread's wait may hold the claim past this one's limit: within the group's timeout, whose end
            # that thread reaches too, the claim is awaited to the end.
            if not self._claim.acquire(timeout=-1 if limit >= self._deadline else max(limit - time.monotonic(), 0)):
                if not self._done:
                    raise self._timeout_error(waited, final=False)
            else:
                try:
                    if not self._done:
                        self.waiters += 1  # counted under the claim, so concurrent waiters never race on it
                        try:
                            self._drive_until(limit, waited)
                        finally:
                            self.waiters -= 1
                finally:
                    self._claim.release()
        if self._error is not None:
            raise self._error
        return True

    def _drive_until(self, limit: float, waited: float) -> None:
        """Drive the work (claimed) until it ends or ``limit``; past the group deadline it fails."""
        try:
            finished = drive(self._pending.test, limit, self._label)
        except Exception as exc:  # a departed peer, a closed group, or anything else: the work ends with it
            self._complete(exc)
            raise
        if finished:
            self._complete(None)
        elif limit >= self._deadline:
            self._complete(self._timeout_error(self._timeout_s))
        else:
            raise self._timeout_error(waited, final=False)

    def is_completed(self) -> bool:
        return self.poll()

    def is_success(self) -> bool:
        return self.poll() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        return self._outputs

    def get_future(self) -> Future:
        """A future holding the output tensors once the work completes.

        Where no progress thread took the work on (:attr:`driven`), nothing
        would complete the future while the caller waits on it, so the work is
        driven to completion first.
        """
        if _probe.active:
            return _probe.found_in(self)
        if not self._done and not self.driven:
            try:
                self.wait()
            except RuntimeError:
                pass  # recorded in self._error; the future carries it
        with self._future_lock:
            created = self._future is None
            if created:
                self._future = Future()
                self._public_future = self._future.then(_raise_failure)
            ended = self._done
        if created and ended:  # else the work's end settles it
            self._settle_future(self._future)
        return self._public_future

    def _source_rank(self) -> int:
        return getattr(self._pending, "source_rank", -1)


class _Failed:
    """What a work's inner future holds when the work failed: the error, raised by :func:`_raise_failure`."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _raise_failure(future: Future) -> list[torch.Tensor]:
    """The outputs, or the work's error raised, so the future it settles fails in C++ too.

    ``Future.set_exception`` stores the error as the value and raises it from
    the Python object's ``wait()``; torch >= 2.14 hands a Python backend's
    future on through C++, whose fresh Python object then returned the error
    as the value. An error raised in a ``then`` callback fails the future
    itself, whichever object waits on it.
    """
    value = future.value()
    if isinstance(value, _Failed):
        raise value.error
    return value


@untraced
class WorkList(dist.Work):
    """Several works handed out as one: torch's coalesced operations (``batch_isend_irecv``).

    Args:
        works: the works of the operations posted together; ends when all have.
    """

    def __init__(self, works: list[HpcWork]) -> None:
        super().__init__()
        self._works = works

    def wait(self, timeout: timedelta | None = None) -> bool:
        for work in self._works:
            work.wait(timeout)
        return True

    def is_completed(self) -> bool:
        return all([work.is_completed() for work in self._works])  # polls every one

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self) -> BaseException | None:
        return next((work.exception() for work in self._works if work.exception() is not None), None)

    def result(self) -> list[torch.Tensor]:
        return [tensor for work in self._works for tensor in work.result()]

    def get_future(self) -> Future:
        """A future holding every work's output tensors once all have completed."""
        if _probe.active:
            return _probe.found_in(self)

        def outputs(done: Future) -> list[torch.Tensor]:
            for future in done.value():
                future.value()  # raises the first work's error
            return self.result()

        return torch.futures.collect_all([work.get_future() for work in self._works]).then(outputs)


def finish_all(works: Iterable[HpcWork], limit_s: float | None = None) -> HpcWork | None:
    """Drive works to their end in order, each within its own timeout and all within ``limit_s``.

    An error stays with its work, for that work's own ``wait()`` to raise.

    Args:
        works: the works, in call order.
        limit_s: bounds the whole wait (a group's shutdown, a barrier's own
            timeout); None: only each work's own timeout.

    Returns:
        The first work that had not ended when the wait stopped; None once all have.
    """
    deadline = None if limit_s is None else time.monotonic() + limit_s
    for work in works:
        if work._done:
            continue
        limit = None
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return work
            limit = timedelta(seconds=max(left, 1e-6))  # under a microsecond, a timedelta is zero: "no limit"
        try:
            work.wait(limit)
        except Exception:  # its own error (its waiter sees it) or the limit's (the caller's answer: this work)
            pass
        if not work._done:
            return work
    return None
