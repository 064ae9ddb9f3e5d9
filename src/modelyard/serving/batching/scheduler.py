"""Dynamic batching: a Servable wrapper that merges concurrent requests along dimension 0.

``BatchingServable(inner, params)`` has the ``Servable`` interface, so REST, gRPC and
warmup run through it unchanged. How it behaves, after TF Serving's BatchingSession:

- Requests join a queue keyed by signature, input aliases, output aliases and each
  input's dtype and inner shape (only its rank with ``pad_variable_length_inputs``).
  A batch closes when it holds ``max_batch_size`` rows or ``batch_timeout_micros``
  after its first request arrived; ``num_batch_threads`` threads run closed batches.
- Inputs are concatenated along dimension 0 and, with ``allowed_batch_sizes``, padded
  up to the next allowed size by repeating the batch's first row; the model runs once
  and every request gets back exactly its own rows. Padding rows never leave here.
- ``pad_variable_length_inputs``: inputs whose dimensions past 0 differ are padded to
  the largest in the batch with their own first element (TF Serving's rule), so a
  request's outputs then carry the padded lengths, as in TF Serving.
- A request larger than ``max_batch_size`` is split into chunks of at most that size
  (TF Serving's large-batch splitting), run in as many batches, and reassembled.
  One that could not fit even in an empty queue is refused (INVALID_ARGUMENT).
- A full queue answers at once with RESOURCE_EXHAUSTED (HTTP 429): never a wait.
- Deadlines: ``run(..., deadline=)`` or the per-request deadline the protocol adapters
  set (``set_request_timeout`` / ``bind_request_timeout``). When a request's deadline
  passes it is answered at once with DEADLINE_EXCEEDED "Timed out waiting for
  notification" (TensorFlow's message for a Session.run past its RunOptions timeout,
  the error TF Serving's REST clients see): its queued rows leave the queue, freeing
  room, and a running batch's rows for it are dropped. (TF Serving notices a deadline
  only when the batch is dequeued, and answers a request that expired in the queue with
  RESOURCE_EXHAUSTED "Run() timeout exceeded while waiting in batching queue" then; a
  gRPC client sees its own DEADLINE_EXCEEDED either way.)
- Every output must keep the batch dimension (dimension 0 == rows in the batch);
  otherwise the batch fails with FAILED_PRECONDITION rather than hand one request
  values computed from other requests' rows.
- Inputs that cannot be batched (a scalar, or inputs whose dimension 0 sizes differ
  or are 0) run directly on the inner servable, unbatched.
- An error from the model fails every request of that batch with that error.
- ``close()`` fails still-queued requests with UNAVAILABLE, stops the threads, then
  closes the inner servable.
- Two entry points share one queue: ``run()`` blocks its thread until the answer;
  ``submit()`` returns a ``BatchFuture`` at once (the REST server completes its HTTP
  response from the future's callback, holding no thread per queued request). A
  future's deadline is enforced when its batch is dequeued, and at once when its holder
  calls ``BatchFuture.expire()`` (the REST server's timer does, at the deadline).
- Batch threads are woken only when there is something to do: a new batch opened
  (its timeout starts) or a batch became full; every wait stays bounded.

Threads belong to one servable (TF Serving shares one pool across models).
"""
from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections import deque
from concurrent.futures import Executor, Future
from typing import Callable, Protocol

import numpy as np

from modelyard.errors import Code, ServingError
from modelyard.serving.batching.batch_future import BatchFuture, settle_all
from modelyard.serving.batching.config import BatchingParams
from modelyard.model.runtime.servable import Servable
from modelyard.model.signatures import Signature

log = logging.getLogger("modelyard.serving")

QUEUE_FULL = "The batch scheduling queue to which this task was submitted is full"
# TensorFlow's DirectSession, word for word, when a run outlives its RunOptions timeout.
DEADLINE_MESSAGE = "Timed out waiting for notification"
# Waits poll at least this often so no thread ever sleeps unbounded on a missed wake-up.
_MAX_WAIT_S = 1.0
_JOIN_TIMEOUT_S = 10.0

# ---- per-request deadlines, set by the protocol adapters ---------------------------------------
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("modelyard_deadline", default=None)


def set_request_timeout(seconds: float | None) -> None:
    """Start this thread's request with ``seconds`` left (None: no deadline).

    Call it at the top of every request handler: it replaces the previous request's value.
    """
    _deadline.set(None if seconds is None else time.monotonic() + seconds)


def bind_request_timeout(fn: Callable, seconds: float | None) -> Callable:
    """Wrap ``fn`` to run (on any thread) under a deadline counted from now."""
    deadline = None if seconds is None else time.monotonic() + seconds

    def call(*args, **kwargs):
        token = _deadline.set(deadline)
        try:
            return fn(*args, **kwargs)
        finally:
            _deadline.reset(token)

    return call


def current_deadline() -> float | None:
    """The running request's deadline as a ``time.monotonic()`` value, if any."""
    return _deadline.get()


# ---- the queue's pieces -------------------------------------------------------------------------
class BatchRecorder(Protocol):
    """Where a batching servable reports what it does (the server's metrics)."""

    def queued(self, seconds: float) -> None:
        """A request waited ``seconds`` in the queue before its batch ran."""

    def batch(self, rows: int, padded: int) -> None:
        """A batch of ``rows`` rows ran, padded to ``padded`` (an allowed batch size)."""


class _Task:
    """One request: its rows, its deadline, and the future its answer (or error) lands in."""

    __slots__ = ("inputs", "size", "deadline", "pending", "parts", "result", "error", "finished", "key", "future",
                 "queued_at")

    def __init__(self, inputs: dict[str, np.ndarray], size: int, deadline: float | None, future: BatchFuture):
        self.inputs = inputs
        self.size = size
        self.deadline = deadline
        self.pending = 0  # pieces still to run
        self.parts: list[tuple[int, dict[str, np.ndarray]]] = []
        self.result: dict[str, np.ndarray] | None = None
        self.error: BaseException | None = None
        self.finished = False  # under the lock: answered (the future is settled outside it)
        self.key: tuple | None = None  # the queue it waits in
        self.future = future
        self.queued_at = time.monotonic()


def _settle(tasks: list[_Task]) -> None:
    """Complete the futures of finished tasks (outside the lock: their callbacks run here)."""
    if tasks:
        settle_all([(task.future, task.error, task.result) for task in tasks])


class _Piece:
    """Rows ``start:stop`` of one task; a task larger than max_batch_size has several."""

    __slots__ = ("task", "start", "stop")

    def __init__(self, task: _Task, start: int, stop: int):
        self.task, self.start, self.stop = task, start, stop


class _Batch:
    __slots__ = ("pieces", "size", "opened_at")

    def __init__(self, opened_at: float):
        self.pieces: list[_Piece] = []
        self.size = 0
        self.opened_at = opened_at


class _Queue:
    """Batches of compatible requests; the last one is open, the ones before it are closed."""

    __slots__ = ("signature", "input_aliases", "output_aliases", "batches")

    def __init__(self, signature: Signature, input_aliases: tuple[str, ...], output_aliases: tuple[str, ...]):
        self.signature = signature
        self.input_aliases = input_aliases
        self.output_aliases = output_aliases
        self.batches: deque[_Batch] = deque()


def _chunks(size: int, limit: int) -> list[int]:
    if size <= limit:  # nearly every request
        return [size]
    return [min(limit, size - start) for start in range(0, size, limit)]


class BatchingServable(Servable):
    """``inner`` with its concurrent ``run`` calls merged into batches (see the module docstring)."""

    # A call may wait for its batch: never run it on the event loop.
    inline_ok = False

    def __init__(self, inner: Servable, params: BatchingParams, recorder: BatchRecorder | None = None):
        super().__init__(inner.path, inner.signatures, inner.signature_def_map)
        self.inner = inner
        self.params = params.check()
        self.recorder = recorder  # the server sets it once it knows the model's name
        self.runtime = inner.runtime
        self._cond = threading.Condition()
        self._queues: dict[tuple, _Queue] = {}
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{params.thread_pool_name}-{i}", daemon=True)
            for i in range(params.num_batch_threads)
        ]
        for thread in self._threads:
            thread.start()

    def __getattr__(self, name: str):
        # Anything else a backend offers (e.g. runtime_of) is the inner servable's.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def queue_depth(self) -> tuple[int, int]:
        """(batches, rows) waiting in this servable's queues right now (shown by the console)."""
        with self._cond:
            batches = [batch for queue in self._queues.values() for batch in queue.batches]
            return len(batches), sum(batch.size for batch in batches)

    # ---- the request side ---------------------------------------------------------------------
    def run(
        self,
        signature: Signature,
        inputs: dict[str, np.ndarray],
        output_aliases: tuple[str, ...],
        deadline: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Queue the request, wait for its batch, return its own rows of every output."""
        if deadline is None:
            deadline = _deadline.get()
        future = self.submit(signature, inputs, output_aliases, deadline)
        while not future.done():
            timeout = _MAX_WAIT_S
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    future.expire()  # settled now, or by the batch thread that just finished it
                    break
                timeout = min(timeout, remaining)
            future.wait(timeout)
        return future.result()

    def submit(
        self,
        signature: Signature,
        inputs: dict[str, np.ndarray],
        output_aliases: tuple[str, ...],
        deadline: float | None = None,
        executor: Executor | None = None,
    ) -> BatchFuture:
        """Queue the request and return at once: a ``BatchFuture`` of what ``run`` would return.

        A request refused at the door (queue full, too large, past its deadline, closing)
        raises here, as ``run`` does. The deadline is checked when the batch is dequeued;
        call ``future.expire()`` at the deadline to answer at once. Inputs that cannot be
        batched run on ``executor`` (inline when None) on the inner servable.
        """
        key, size = self._key(signature, inputs, output_aliases)
        if key is None:
            future = BatchFuture()
            if executor is None:
                future.set_result(self.inner.run(signature, inputs, output_aliases))
            else:
                inner = executor.submit(self.inner.run, signature, inputs, output_aliases)
                inner.add_done_callback(lambda f: _copy_outcome(f, future))
            return future
        if deadline is not None and time.monotonic() >= deadline:
            raise _deadline_error()
        future = BatchFuture(lambda error: self._expire(task, error))
        task = _Task(inputs, size, deadline, future)
        self._schedule(key, signature, tuple(output_aliases), task)
        return future

    def _key(self, signature: Signature, inputs: dict[str, np.ndarray], output_aliases) -> tuple[tuple | None, int]:
        """The queue a request joins and its row count; ``(None, 0)`` when it cannot be batched."""
        size = None
        parts = []
        for alias in sorted(inputs):
            value = inputs[alias]
            if not isinstance(value, np.ndarray) or value.ndim == 0:
                return None, 0
            if size is None:
                size = value.shape[0]
            elif value.shape[0] != size:
                return None, 0
            # Strings of any length concatenate; other dtypes must match exactly.
            kind = value.dtype.kind if value.dtype.kind in "SU" else value.dtype.str
            inner = value.ndim if self.params.pad_variable_length_inputs else value.shape[1:]
            parts.append((alias, kind, inner))
        if not size:
            return None, 0
        return (signature.name, tuple(output_aliases), tuple(parts)), size

    def _schedule(self, key: tuple, signature: Signature, output_aliases: tuple[str, ...], task: _Task) -> None:
        p = self.params
        limit = p.max_batch_size
        chunks = _chunks(task.size, limit)
        if len(chunks) > p.max_enqueued_batches:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"Task size {task.size} is larger than maximum input batch size "
                f"{limit * p.max_enqueued_batches} (max_batch_size {limit} x max_enqueued_batches "
                f"{p.max_enqueued_batches}): send smaller requests or raise max_enqueued_batches",
            )
        with self._cond:
            if self._closed:
                raise _closed_error()
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = _Queue(signature, tuple(sorted(task.inputs)), output_aliases)
            batches = queue.batches
            before = len(batches)
            room = limit - batches[-1].size if batches else 0
            new_batches = 0
            for chunk in chunks:  # where each chunk would go: the open batch if it fits, else a new one
                if chunk <= room:
                    room -= chunk
                else:
                    new_batches += 1
                    room = limit - chunk
            if len(batches) + new_batches > p.max_enqueued_batches:
                raise ServingError(Code.RESOURCE_EXHAUSTED, QUEUE_FULL)
            now = time.monotonic()
            start = 0
            filled = False
            for chunk in chunks:
                if not batches or batches[-1].size + chunk > limit:
                    batches.append(_Batch(now))
                batch = batches[-1]
                batch.pieces.append(_Piece(task, start, start + chunk))
                batch.size += chunk
                filled = filled or batch.size >= limit
                start += chunk
            task.pending = len(chunks)
            task.key = key
            # Wake one batch thread only when what it waits for changed: a batch opened (its
            # timeout starts; the one before it, if any, is now closed) or one became full. A
            # request joining an open batch changes neither. A thread that picks a batch wakes
            # the next when more are ready (``_pick``); waits stay bounded (``_MAX_WAIT_S``).
            if filled or len(batches) != before:
                self._cond.notify()

    def _expire(self, task: _Task, error: BaseException | None = None) -> None:
        """Fail ``task`` with ``error`` (default DEADLINE_EXCEEDED) unless it is done already."""
        with self._cond:
            if task.finished:
                return  # answered just now
            # A running batch's rows are dropped; queued rows leave the queue now, freeing room.
            self._unqueue(task)
            self._finish(task, error=error or _deadline_error())
        _settle([task])

    def _unqueue(self, task: _Task) -> None:
        """Take a task that has not started out of its queue (under the lock)."""
        queue = self._queues.get(task.key)
        if queue is None:
            return
        for batch in list(queue.batches):
            kept = [piece for piece in batch.pieces if piece.task is not task]
            if len(kept) != len(batch.pieces):
                batch.pieces = kept
                batch.size = sum(piece.stop - piece.start for piece in kept)
                if not kept:
                    queue.batches.remove(batch)
        if not queue.batches:
            del self._queues[task.key]

    # ---- the batch threads ---------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    picked, wait_s = self._pick(time.monotonic())
                    if picked is not None:
                        break
                    self._cond.wait(min(wait_s, _MAX_WAIT_S))
            try:
                self._execute(*picked)
            except BaseException as exc:  # a bug here must fail the batch, never kill the thread
                log.exception("Batch failed unexpectedly")
                with self._cond:
                    failed = [piece.task for piece in picked[1].pieces if not piece.task.finished]
                    for task in failed:
                        self._finish(task, error=ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}"))
                _settle(failed)

    def _pick(self, now: float) -> tuple[tuple[_Queue, _Batch] | None, float]:
        """The oldest batch ready to run (under the lock), or how long until one may be."""
        timeout_s = self.params.batch_timeout_micros / 1e6
        limit = self.params.max_batch_size
        best: _Queue | None = None
        ready = 0
        wait_s = _MAX_WAIT_S
        for queue in self._queues.values():
            if not queue.batches:
                continue
            front = queue.batches[0]
            closed = len(queue.batches) > 1 or front.size >= limit
            due = front.opened_at + timeout_s
            if closed or now >= due:
                ready += 1
                if best is None or front.opened_at < best.batches[0].opened_at:
                    best = queue
            else:
                wait_s = min(wait_s, due - now)
        if best is None:
            return None, wait_s
        batch = best.batches.popleft()
        if not best.batches:
            # Drop empty queues so a stream of distinct shapes cannot grow the table forever.
            for key, queue in list(self._queues.items()):
                if queue is best:
                    del self._queues[key]
                    break
        else:
            front = best.batches[0]
            if len(best.batches) > 1 or front.size >= limit or now >= front.opened_at + timeout_s:
                ready += 1
        if ready > 1:
            self._cond.notify()  # more is ready: hand it to another (idle) batch thread
        return (best, batch), 0.0

    def _execute(self, queue: _Queue, batch: _Batch) -> None:
        now = time.monotonic()
        live: list[_Piece] = []
        finished: list[_Task] = []
        with self._cond:
            for piece in batch.pieces:
                task = piece.task
                if task.finished:  # failed, timed out, or its other pieces failed
                    continue
                if task.deadline is not None and now >= task.deadline:
                    self._finish(task, error=_deadline_error())
                    finished.append(task)
                    continue
                live.append(piece)
        _settle(finished)
        if not live:
            return
        if self.recorder is not None:
            for piece in live:
                if piece.start == 0:  # a task split over several batches waited once
                    self.recorder.queued(now - piece.task.queued_at)
        finished = []
        try:
            answers = self._run_pieces(queue, live)
        except Exception as exc:
            error = _detached(exc)
            with self._cond:
                for piece in live:
                    if not piece.task.finished:
                        self._finish(piece.task, error=error)
                        finished.append(piece.task)
            _settle(finished)
            return
        with self._cond:
            for piece, answer in zip(live, answers):
                task = piece.task
                if task.finished:
                    continue
                task.parts.append((piece.start, answer))
                task.pending -= 1
                if task.pending == 0:
                    self._finish(task)
                    finished.append(task)
        _settle(finished)

    def _run_pieces(self, queue: _Queue, pieces: list[_Piece]) -> list[dict[str, np.ndarray]]:
        """Concatenate, pad, run once, check, and slice back one answer per piece."""
        p = self.params
        rows = sum(piece.stop - piece.start for piece in pieces)
        padded = p.padded_size(rows)
        inputs = {}
        for alias in queue.input_aliases:
            parts = [piece.task.inputs[alias][piece.start:piece.stop] for piece in pieces]
            if p.pad_variable_length_inputs:
                parts = _pad_to_common_shape(parts)
            value = parts[0] if len(parts) == 1 else np.concatenate(parts)
            if padded > rows:
                value = np.concatenate([value, np.repeat(value[:1], padded - rows, axis=0)])
            inputs[alias] = value
        if self.recorder is not None:
            self.recorder.batch(rows, padded)
        outputs = self.inner.run(queue.signature, inputs, queue.output_aliases)
        for alias, value in outputs.items():
            if np.ndim(value) == 0 or value.shape[0] != padded:
                got = "a scalar" if np.ndim(value) == 0 else f"{value.shape[0]} rows"
                raise ServingError(
                    Code.FAILED_PRECONDITION,
                    f"Batched output tensor {alias} has {got} but its batch has {padded}: with --enable_batching "
                    "every output must keep the batch dimension (dimension 0)",
                )
        answers = []
        offset = 0
        for piece in pieces:
            n = piece.stop - piece.start
            answers.append({alias: value[offset:offset + n] for alias, value in outputs.items()})
            offset += n
        return answers

    def _finish(self, task: _Task, error: BaseException | None = None) -> None:
        """Complete ``task`` once (under the lock): its error, or its pieces joined in row order."""
        if task.finished:
            return
        if error is not None:
            task.error = error
        elif len(task.parts) == 1:
            task.result = task.parts[0][1]
        else:
            task.parts.sort(key=lambda part: part[0])
            task.result = {
                alias: np.concatenate([answer[alias] for _, answer in task.parts]) for alias in task.parts[0][1]
            }
        task.parts = []
        task.finished = True

    # ---- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Fail queued requests with UNAVAILABLE, stop the batch threads, close the inner servable."""
        failed: list[_Task] = []
        with self._cond:
            if self._closed:
                return
            self._closed = True
            for queue in self._queues.values():
                for batch in queue.batches:
                    for piece in batch.pieces:
                        if not piece.task.finished:
                            self._finish(piece.task, error=_closed_error())
                            failed.append(piece.task)
            self._queues.clear()
            self._cond.notify_all()
        _settle(failed)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(_JOIN_TIMEOUT_S)
        self.inner.close()


def _pad_to_common_shape(parts: list[np.ndarray]) -> list[np.ndarray]:
    """Pad every part's dimensions past 0 to the largest in the batch with its first element."""
    target = tuple(max(sizes) for sizes in zip(*(part.shape[1:] for part in parts)))
    padded = []
    for part in parts:
        if part.shape[1:] == target:
            padded.append(part)
            continue
        if part.size:
            fill = part.flat[0]
        else:
            fill = b"" if part.dtype.kind == "O" else np.zeros((), part.dtype)[()]
        grown = np.full((part.shape[0],) + target, fill, dtype=part.dtype)
        grown[tuple(slice(0, d) for d in part.shape)] = part
        padded.append(grown)
    return padded


def _copy_outcome(source: Future, target: BatchFuture) -> None:
    try:
        error = source.exception()
    except BaseException as exc:  # the source was cancelled (its executor shut down)
        error = exc
    if error is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())


def _detached(error: BaseException) -> BaseException:
    """``error`` without its traceback and context, to be stored in the batch's tasks.

    Its traceback's frames hold this batch's pieces, which hold the tasks that will hold the
    error: a reference cycle (with every request's tensors) that only the cyclic GC would free.
    Callers never see these: ``BatchFuture.result`` raises a fresh copy.
    """
    error.__traceback__ = error.__context__ = error.__cause__ = None
    return error


def _deadline_error() -> ServingError:
    return ServingError(Code.DEADLINE_EXCEEDED, DEADLINE_MESSAGE)


def _closed_error() -> ServingError:
    return ServingError(Code.UNAVAILABLE, "The servable is unloading: its batching queue has closed")


def maybe_batch(servable: Servable, version_path, policy) -> Servable:
    """Wrap a freshly loaded servable when batching is on (``policy`` None: off)."""
    if policy is None:
        return servable
    try:
        params = policy.params_for(version_path)
    except BaseException:
        servable.close()
        raise
    return BatchingServable(servable, params)
