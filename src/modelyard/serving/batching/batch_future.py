"""The answer to a queued batching request: a small future, cheaper than ``concurrent.futures.Future``.

A REST predict on a batching model creates one per request on the event loop, so its
cost is paid on the server's busiest thread: ``concurrent.futures.Future`` builds a
``threading.Condition`` (two locks and a deque) per instance; this one holds one plain
lock and builds an ``Event`` only for a caller that blocks in ``result()``.

It keeps the part of ``Future``'s interface the server uses: ``done``, ``result``,
``exception``, ``add_done_callback`` (callbacks run on the completing thread, or at
once when already done), ``set_result`` / ``set_exception`` (the first one wins; later
ones return False instead of raising). There is no ``cancel``: requests leave the queue
through ``expire``, which answers DEADLINE_EXCEEDED.

``call_on_loop`` registers a callback to run on an asyncio loop instead. A batch thread
settles its whole batch with ``settle_all``, which hands every loop its callbacks in one
``call_soon_threadsafe``: one wake-up and one handle per batch instead of one per request,
so the batch thread, the bottleneck under batched load, is back at the model sooner.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable, Iterable

from modelyard.errors import ServingError

log = logging.getLogger("modelyard.serving")

_PENDING, _RESULT, _ERROR = 0, 1, 2


class BatchFuture:
    """A one-shot result or error, settled by a batch thread, read by the request's owner."""

    __slots__ = ("_lock", "_state", "_value", "_callbacks", "_waiter", "_expire", "settled_at")

    def __init__(self, expire: Callable[[BaseException | None], None] | None = None):
        self._lock = threading.Lock()
        self._state = _PENDING
        self._value = None
        self._callbacks: list[Callable[["BatchFuture"], object]] | None = None
        self._waiter: threading.Event | None = None
        self._expire = expire
        self.settled_at: float | None = None  # time.perf_counter() when settled

    # ---- reading ----------------------------------------------------------------------------
    def done(self) -> bool:
        return self._state != _PENDING

    def result(self, timeout: float | None = None):
        """The result, or raise the error; wait up to ``timeout`` seconds (TimeoutError after)."""
        self._settled_within(timeout)
        if self._state == _ERROR:
            raise _fresh(self._value)
        return self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._settled_within(timeout)
        return self._value if self._state == _ERROR else None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until settled or ``timeout`` seconds pass; whether it is settled."""
        if self._state != _PENDING:
            return True
        with self._lock:
            if self._state != _PENDING:
                return True
            if self._waiter is None:
                self._waiter = threading.Event()
            waiter = self._waiter
        return waiter.wait(timeout)

    def _settled_within(self, timeout: float | None) -> None:
        if not self.wait(timeout):
            raise TimeoutError(f"no answer from the batching queue within {timeout} s")

    def add_done_callback(self, callback: Callable[["BatchFuture"], object]) -> None:
        """Call ``callback(self)`` once settled: on the settling thread, or now if settled already."""
        if not self._kept(callback):
            _run_each([(callback, (self,))], "done-callback")

    def call_on_loop(self, loop: asyncio.AbstractEventLoop, callback: Callable, *args,
                     if_closed: Callable[[], object] | None = None) -> None:
        """Run ``callback(*args, self)`` on ``loop`` once settled (see ``loop_bridge``).

        When ``loop`` has closed by then, ``if_closed()`` runs instead, on the settling thread.
        """
        call = _LoopCall(loop, callback, args, if_closed)
        if not self._kept(call):
            _post(loop, [(call, self)])

    def _kept(self, callback) -> bool:
        """Keep ``callback`` for the settling if still pending; False when the caller must run it now."""
        with self._lock:
            if self._state != _PENDING:
                return False
            if self._callbacks is None:
                self._callbacks = [callback]
            else:
                self._callbacks.append(callback)
            return True

    # ---- settling ---------------------------------------------------------------------------
    def set_result(self, value) -> bool:
        return settle_all([(self, None, value)]) == 1

    def set_exception(self, error: BaseException) -> bool:
        return settle_all([(self, error, None)]) == 1

    def _take(self, state: int, value, now: float) -> list | None:
        """Settle (the first settling wins) and hand back the callbacks to run; None if settled already."""
        with self._lock:
            if self._state != _PENDING:
                return None
            self._state, self._value, self.settled_at = state, value, now
            callbacks, self._callbacks = self._callbacks, None
            # The expire hook refers back to the queue's task, which holds this future: drop it so
            # reference counting frees a finished request at once, not the cyclic GC later.
            self._expire = None
            waiter = self._waiter
        if waiter is not None:
            waiter.set()
        return callbacks or _NONE

    # ---- the queue's side -------------------------------------------------------------------
    def expire(self, error: BaseException | None = None) -> None:
        """Answer ``error`` (default DEADLINE_EXCEEDED) now unless answered: queued rows leave the
        queue, running rows are dropped."""
        expire = self._expire
        if expire is not None and self._state == _PENDING:
            expire(error)


_NONE: list = []


class _LoopCall:
    """A callback ``call_on_loop`` registered: where and what to run once the future settles."""

    __slots__ = ("loop", "callback", "args", "if_closed")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable, args: tuple,
                 if_closed: Callable[[], object] | None):
        self.loop, self.callback, self.args, self.if_closed = loop, callback, args, if_closed


def settle_all(outcomes: Iterable[tuple[BatchFuture, BaseException | None, object]]) -> int:
    """Settle each ``(future, error, result)`` (error None: the result); how many were still pending.

    Once every future is settled, plain callbacks run here, in order, and each loop's
    ``call_on_loop`` callbacks reach it together, in one ``call_soon_threadsafe``.
    """
    now = time.perf_counter()
    settled = 0
    plain: list = []
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for future, error, value in outcomes:
        callbacks = future._take(_RESULT if error is None else _ERROR, value if error is None else error, now)
        if callbacks is None:
            continue
        settled += 1
        for callback in callbacks:
            if type(callback) is _LoopCall:
                calls = by_loop.get(callback.loop)
                if calls is None:
                    by_loop[callback.loop] = [(callback, future)]
                else:
                    calls.append((callback, future))
            else:
                plain.append((callback, (future,)))
    try:
        _run_each(plain, "done-callback")
    finally:  # whatever a callback raised, every loop still gets its answers
        for loop, calls in by_loop.items():
            _post(loop, calls)
    return settled


def _post(loop: asyncio.AbstractEventLoop, calls: list) -> None:
    try:
        loop.call_soon_threadsafe(_run_on_loop, calls)
    except RuntimeError:  # the loop has closed: the server is stopping
        _run_each([(call.if_closed, ()) for call, _future in calls if call.if_closed is not None], "if_closed callback")


def _run_on_loop(calls: list) -> None:
    _run_each([(call.callback, call.args + (future,)) for call, future in calls], "loop callback")


def _run_each(calls: list, what: str) -> None:
    """Call each ``fn(*args)``; one failing must not keep the others (each a request's answer) from running.

    An ``Exception`` is logged; the first other ``BaseException`` is raised again once all have run.
    """
    escaped = None
    for fn, args in calls:
        try:
            fn(*args)
        except Exception:
            log.exception("A batching future's %s failed", what)
        except BaseException as exc:
            if escaped is None:
                escaped = exc
    if escaped is not None:
        raise escaped


def _fresh(error: BaseException) -> BaseException:
    # Each caller raises its own copy: several threads may raise one batch's error at once, and
    # raising the stored error would tie its traceback (so the frames that hold this future) to
    # the future, a reference cycle that only the cyclic GC frees, with the request's tensors.
    if type(error) is ServingError:
        return ServingError(error.code, error.message)
    return error

