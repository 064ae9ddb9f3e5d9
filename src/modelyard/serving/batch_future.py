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
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from modelyard.errors import ServingError

log = logging.getLogger("modelyard.serving")

_PENDING, _RESULT, _ERROR = 0, 1, 2


class BatchFuture:
    """A one-shot result or error, settled by a batch thread, read by the request's owner."""

    __slots__ = ("_lock", "_state", "_value", "_callbacks", "_waiter", "_expire")

    def __init__(self, expire: Callable[[BaseException | None], None] | None = None):
        self._lock = threading.Lock()
        self._state = _PENDING
        self._value = None
        self._callbacks: list[Callable[["BatchFuture"], object]] | None = None
        self._waiter: threading.Event | None = None
        self._expire = expire

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
        with self._lock:
            if self._state == _PENDING:
                if self._callbacks is None:
                    self._callbacks = [callback]
                else:
                    self._callbacks.append(callback)
                return
        _call(callback, self)

    # ---- settling ---------------------------------------------------------------------------
    def set_result(self, value) -> bool:
        return self._settle(_RESULT, value)

    def set_exception(self, error: BaseException) -> bool:
        return self._settle(_ERROR, error)

    def _settle(self, state: int, value) -> bool:
        with self._lock:
            if self._state != _PENDING:
                return False
            self._state, self._value = state, value
            callbacks, self._callbacks = self._callbacks, None
            # The expire hook refers back to the queue's task, which holds this future: drop it so
            # reference counting frees a finished request at once, not the cyclic GC later.
            self._expire = None
            waiter = self._waiter
        if waiter is not None:
            waiter.set()
        if callbacks:
            for callback in callbacks:
                _call(callback, self)
        return True

    # ---- the queue's side -------------------------------------------------------------------
    def expire(self, error: BaseException | None = None) -> None:
        """Answer ``error`` (default DEADLINE_EXCEEDED) now unless answered: queued rows leave the
        queue, running rows are dropped."""
        expire = self._expire
        if expire is not None and self._state == _PENDING:
            expire(error)


def _fresh(error: BaseException) -> BaseException:
    # Each caller raises its own copy: several threads may raise one batch's error at once, and
    # raising the stored error would tie its traceback (so the frames that hold this future) to
    # the future, a reference cycle that only the cyclic GC frees, with the request's tensors.
    if type(error) is ServingError:
        return ServingError(error.code, error.message)
    return error


def _call(callback: Callable[[BatchFuture], object], future: BatchFuture) -> None:
    # One failing callback must not keep the others (or the batch thread) from running.
    try:
        callback(future)
    except Exception:
        log.exception("A batching future's done-callback failed")
