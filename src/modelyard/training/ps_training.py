"""Parameter-server training driven by modelyard's coordinator loop: synchronous with backup
workers, or asynchronous with staleness control.

Both loops get their gradients from ``GradientSource``: computations scheduled on the
workers through TF's ClusterCoordinator, each returning its gradients, its loss, the step it
read from the parameter servers, and which worker produced it (read from that worker's own
TF_CONFIG). The coordinator decides what to apply and applies it to the variables on the
parameter servers; ``step`` (on the parameter servers) counts the updates.

- **Backup workers** (Chen et al. 2016, ``strategy.backup_workers: b``, W workers): each step
  starts with every worker computing on the current weights; the mean of the first
  N = W - b fresh gradients is applied. The b slowest are not waited for: when they arrive
  they were computed on an older step and are dropped, never applied (TF1's
  SyncReplicasOptimizer rule, gone from TF2). ``b = 0`` is plain synchronous training.
  A worker that dies only removes one producer while N remain.
- **Asynchronous with staleness control** (``strategy.staleness: {...}``): every gradient is
  applied as it arrives. Its staleness tau is the number of updates applied since its worker
  read the weights. ``drop_older_than: k`` drops gradients with tau > k; ``scale: inverse``
  multiplies a gradient by 1 / max(tau, 1) (Zhang et al. 2016, staleness-aware async SGD);
  ``single_replica_epochs: e`` keeps one computation in flight for the first e epochs (tau is
  then 0), as the chapter advises for the start of training.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

SCALES = ("none", "inverse")


@dataclass
class EpochStats:
    """What happened to an epoch's gradients: applied or dropped, by worker, and their staleness."""

    applied: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    staleness: list[int] = field(default_factory=list)  # tau of every gradient that arrived

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "applied_by_worker": {str(k): v for k, v in sorted(self.applied.items())},
            "dropped_by_worker": {str(k): v for k, v in sorted(self.dropped.items())},
            "applied": sum(self.applied.values()), "dropped": sum(self.dropped.values()),
        }
        if self.staleness:
            out["staleness_counts"] = {str(k): v for k, v in sorted(Counter(self.staleness).items())}
            out["staleness_mean"] = sum(self.staleness) / len(self.staleness)
            out["staleness_max"] = max(self.staleness)
        return out

MAX_LOST_IN_A_ROW = 20  # results lost with their workers in a row before the cluster is taken for gone


@dataclass(frozen=True)
class _Lost:
    """A computation that finished on a worker which then died before its result was copied."""

    error: BaseException


class GradientSource:
    """Gradient computations on the workers, their results arriving on a queue."""

    def __init__(self, strategy, model, dataset_fn: Callable):
        import tensorflow as tf

        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="ps_step")
        per_worker = self.coordinator.create_per_worker_dataset(
            lambda: strategy.distribute_datasets_from_function(dataset_fn))
        self.iterator = iter(per_worker)
        variables = model.trainable_variables
        step = self.step

        @tf.function
        def compute(iterator):
            x, y = next(iterator)
            worker = _worker_index()
            read_step = step.read_value()  # the weights below are at least this step's
            with tf.GradientTape() as tape:
                y_pred = model(x, training=True)
                loss = model.compute_loss(x, y, y_pred, None)
            grads = tape.gradient(loss, variables)
            grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]
            return read_step, worker, loss, grads

        self._compute = compute
        self.results: queue.Queue = queue.Queue()
        self.in_flight = 0

    def launch(self) -> None:
        import tensorflow as tf

        remote = self.coordinator.schedule(self._compute, args=(self.iterator,))
        self.in_flight += 1

        def wait() -> None:  # fetch blocks until the worker is done: one thread per computation
            try:
                self.results.put(remote.fetch())
            except tf.errors.UnavailableError as exc:
                # The coordinator retries a computation whose worker dies while it runs, but not
                # one that finished there: its outputs stay on the worker until fetch copies them,
                # and a worker that dies in between takes them along. Computed again, elsewhere.
                self.results.put(_Lost(exc))
            except BaseException as exc:  # the step itself failed: the loop decides
                self.results.put(exc)

        threading.Thread(target=wait, daemon=True, name="ps-training-fetch").start()

    def next(self) -> tuple[int, int, float, list]:
        """The next computation to finish: ``(read_step, worker, loss, grads)``.

        A computation whose result was lost with its worker is scheduled again in its place,
        up to ``MAX_LOST_IN_A_ROW`` times in a row (past that the cluster is not coming back).
        """
        lost = 0
        while isinstance(result := self.results.get(), _Lost):
            self.in_flight -= 1
            lost += 1
            if lost > MAX_LOST_IN_A_ROW:
                raise result.error
            self.launch()
        self.in_flight -= 1
        if isinstance(result, BaseException):
            raise result
        read_step, worker, loss, grads = result
        return int(read_step), int(worker), float(loss), grads


class SyncTrainer:
    """Backup workers: each step applies the mean of the first N fresh gradients."""

    def __init__(self, source: GradientSource, model, workers: int, backup_workers: int):
        self.source, self.model = source, model
        self.workers, self.required = workers, workers - backup_workers

    def train_step(self, stats: EpochStats) -> float:
        """One synchronous update from the first N fresh gradients; returns their mean loss."""
        import numpy as np

        source = self.source
        current = int(source.step.numpy())
        fresh: list = []
        while source.in_flight < self.workers:  # the step starts with every worker computing
            source.launch()
        while len(fresh) < self.required:
            if source.in_flight == 0:
                source.launch()
            read_step, worker, loss, grads = source.next()
            if read_step < current:
                stats.dropped[worker] += 1  # computed on older weights: never applied
                source.launch()  # its worker is free: give it this step's weights
                continue
            # A fresh gradient frees its worker too, but new work now would only be stale by the
            # time it returns if the other computations complete the step: no relaunch until then.
            fresh.append((worker, loss, grads))
        mean = [np.mean([g[i] for _, _, g in fresh], axis=0) for i in range(len(fresh[0][2]))]
        self.model.optimizer.apply_gradients(zip(mean, self.model.trainable_variables))
        source.step.assign_add(1)
        for worker, _, _ in fresh:
            stats.applied[worker] += 1
        return float(np.mean([loss for _, loss, _ in fresh]))


@dataclass(frozen=True)
class StalenessPolicy:
    """What asynchronous training does with a gradient of staleness tau."""

    drop_older_than: int | None = None
    scale: str = "none"
    single_replica_epochs: float = 0.0

    def weight(self, tau: int) -> float:
        """0 to drop the gradient, else the factor it is applied with."""
        if self.drop_older_than is not None and tau > self.drop_older_than:
            return 0.0
        return 1.0 / max(tau, 1) if self.scale == "inverse" else 1.0


class AsyncTrainer:
    """Asynchronous updates, one per arriving gradient, under a staleness policy."""

    def __init__(self, source, model, workers: int, policy: StalenessPolicy):
        self.source, self.model, self.workers, self.policy = source, model, workers, policy
        self.parallel = workers

    def arrive(self, read_step: int, worker: int, loss: float, grads, stats: EpochStats) -> bool:
        """Apply (or drop) one arrived gradient; True when it made an update."""
        import numpy as np

        tau = int(self.source.step.numpy()) - read_step
        stats.staleness.append(tau)
        weight = self.policy.weight(tau)
        if weight == 0.0:
            stats.dropped[worker] += 1
            return False
        scaled = grads if weight == 1.0 else [np.asarray(g) * weight for g in grads]
        self.model.optimizer.apply_gradients(zip(scaled, self.model.trainable_variables))
        self.source.step.assign_add(1)
        stats.applied[worker] += 1
        return True

    def train_step(self, stats: EpochStats) -> float:
        """Wait for gradients until one is applied; returns its loss."""
        while True:
            while self.source.in_flight < self.parallel:
                self.source.launch()
            read_step, worker, loss, grads = self.source.next()
            if self.arrive(read_step, worker, loss, grads, stats):
                return loss


def distinct_per_worker(dataset_fn: Callable, workers: int) -> Callable:
    """``dataset_fn`` with each worker reading its own share of the batches.

    Parameter-server workers all run one trace of the dataset function, and the input context
    tells each of them "pipeline 0 of 1", so the built-in pipeline would hand every worker the
    same batches in the same order (N workers computing one gradient N times). Each worker
    keeps every N-th batch instead, starting at its own index, read at run time.
    """
    def per_worker(context):
        import tensorflow as tf

        index = tf.math.floormod(tf.maximum(_worker_index(), 0), workers)
        return dataset_fn(context).shard(workers, index)

    return per_worker


# A task's own TF_CONFIG, where a graph op it runs can read it: /proc/self/fd/TASK_FD (see _worker_index).
TASK_FD = 1000


def expose_task(task_type: str, index: int) -> None:
    """Put this process's task (``{"task": {"type": ..., "index": ...}}``) in an in-memory file at
    ``TASK_FD``, for ``_worker_index``'s graph op to read.

    ``/proc/self/environ`` is the environment a process was *started* with: a task forked from a
    warm interpreter (``modelyard launch``'s default) shows the interpreter's there, without its own
    TF_CONFIG, so every worker would read index -1 (the same batches, gradients credited to no
    worker). Each serving task calls this before its server starts. When the descriptor is taken or
    beyond the process's limit, the op falls back to ``/proc/self/environ`` (right for a cold start)."""
    import fcntl
    import json
    import os

    try:
        fcntl.fcntl(TASK_FD, fcntl.F_GETFD)
        return  # in use by something else: leave it alone
    except OSError:
        pass
    try:
        fd = os.memfd_create("modelyard-task", os.MFD_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, json.dumps({"task": {"type": task_type, "index": index}}).encode())
        os.dup2(fd, TASK_FD, inheritable=False)
    except OSError:
        pass
    finally:
        os.close(fd)


def _worker_index():
    """The index of the worker this graph runs on, read from its own TF_CONFIG (-1 if unknown).

    A scheduled function cannot ask the ClusterCoordinator where it runs, and every worker
    runs the same trace; but a file read by a graph op is read by the process executing it: the
    TF_CONFIG that process exposed at ``TASK_FD`` (``expose_task``), else its ``/proc/self/environ``
    (a task started with TF_CONFIG in its environment, as ``modelyard launch --cold`` starts it).
    """
    import tensorflow as tf

    exposed = f"/proc/self/fd/{TASK_FD}"
    text = tf.cond(tf.size(tf.io.matching_files(exposed)) > 0, lambda: tf.io.read_file(exposed),
                   lambda: tf.io.read_file("/proc/self/environ"))
    found = tf.strings.regex_replace(text, r'(?s).*"task": \{"type": "worker", "index": (\d+)\}.*', r"\1")
    known = tf.strings.regex_full_match(found, r"\d{1,6}")
    return tf.cond(known, lambda: tf.strings.to_number(found, tf.int64), lambda: tf.constant(-1, tf.int64))


def fit(trainer, epochs: int, steps_per_epoch: int, evaluate: Callable | None = None,
        on_epoch: Callable | None = None) -> list[dict[str, Any]]:
    """Train ``epochs`` x ``steps_per_epoch`` updates; one record per epoch."""
    history = []
    for epoch in range(epochs):
        if isinstance(trainer, AsyncTrainer):
            trainer.parallel = 1 if epoch < trainer.policy.single_replica_epochs else trainer.workers
        stats = EpochStats()
        start = time.perf_counter()
        losses = [trainer.train_step(stats) for _ in range(steps_per_epoch)]
        seconds = time.perf_counter() - start
        record = {"epoch": epoch + 1, "loss": sum(losses) / len(losses), "seconds": seconds,
                  "steps_per_sec": steps_per_epoch / seconds, **stats.as_dict()}
        if evaluate is not None:
            record.update(evaluate())
        history.append(record)
        if on_epoch is not None:
            on_epoch(record, stats)
    return history
