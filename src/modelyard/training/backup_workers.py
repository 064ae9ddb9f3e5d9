"""Synchronous parameter-server training with backup workers (Chen et al. 2016).

``strategy: {name: parameter_server, backup_workers: b}`` with W workers: each step the
coordinator keeps W gradient computations in flight, applies the mean of the first
N = W - b gradients computed on the current weights, and moves on. The b slowest are not
waited for; when they arrive they were computed on an older step and are dropped, never
applied (TF1's SyncReplicasOptimizer rule, gone from TF2). A worker that dies only removes
one producer: training continues while N remain (the ClusterCoordinator re-runs its work
elsewhere).

Each gradient computation runs on a worker (scheduled through the ClusterCoordinator) and
returns its gradients, its loss, the step it read from the parameter servers, and which
worker produced it (read from that worker's own TF_CONFIG), so the coordinator can
tell fresh from stale and report who was dropped. The update itself runs on the coordinator
against the variables on the parameter servers.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class StepStats:
    """What happened to the gradients of an epoch: applied or dropped, and by which worker."""

    applied: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {"applied_by_worker": {str(k): v for k, v in sorted(self.applied.items())},
                "dropped_by_worker": {str(k): v for k, v in sorted(self.dropped.items())},
                "applied": sum(self.applied.values()), "dropped": sum(self.dropped.values())}


class BackupWorkerTrainer:
    """The coordinator's loop: W computations in flight, the first N fresh ones make a step."""

    def __init__(self, strategy, model, dataset_fn: Callable, workers: int, backup_workers: int):
        import tensorflow as tf

        self.strategy, self.model = strategy, model
        self.workers, self.required = workers, workers - backup_workers
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="sync_step")

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
        self._results: queue.Queue = queue.Queue()
        self._in_flight = 0

    def _launch(self) -> None:
        remote = self.coordinator.schedule(self._compute, args=(self.iterator,))
        self._in_flight += 1

        def wait() -> None:  # fetch blocks until the worker is done: one thread per computation
            try:
                self._results.put(remote.fetch())
            except BaseException as exc:  # a worker lost for good, or the step failed: the loop decides
                self._results.put(exc)

        threading.Thread(target=wait, daemon=True, name="backup-workers-fetch").start()

    def train_step(self, stats: StepStats) -> float:
        """One synchronous update from the first N fresh gradients; returns their mean loss."""
        import numpy as np

        current = int(self.step.numpy())
        fresh: list = []
        while self._in_flight < self.workers:  # the step starts with every worker computing
            self._launch()
        while len(fresh) < self.required:
            if self._in_flight == 0:
                self._launch()
            result = self._results.get()
            self._in_flight -= 1
            if isinstance(result, BaseException):
                raise result
            read_step, worker, loss, grads = result
            if int(read_step) < current:
                stats.dropped[int(worker)] += 1  # computed on older weights: never applied
                self._launch()  # its worker is free: give it this step's weights
                continue
            # A fresh gradient frees its worker too, but new work now would only be stale by the
            # time it returns if the other computations complete the step: no relaunch until then.
            fresh.append((int(worker), float(loss), grads))
        mean = [np.mean([g[i] for _, _, g in fresh], axis=0) for i in range(len(fresh[0][2]))]
        self.model.optimizer.apply_gradients(zip(mean, self.model.trainable_variables))
        self.step.assign_add(1)
        for worker, _, _ in fresh:
            stats.applied[worker] += 1
        return float(np.mean([loss for _, loss, _ in fresh]))


def _worker_index():
    """The index of the worker this graph runs on, read from its own TF_CONFIG (-1 if unknown).

    A scheduled function cannot ask the ClusterCoordinator where it runs, and every worker
    runs the same trace; but ``/proc/self/environ`` read by a graph op is the environment of
    the process executing it, whose TF_CONFIG (set by ``modelyard launch``) names its task.
    """
    import tensorflow as tf

    environ = tf.io.read_file("/proc/self/environ")
    found = tf.strings.regex_replace(environ, r'(?s).*"task": \{"type": "worker", "index": (\d+)\}.*', r"\1")
    known = tf.strings.regex_full_match(found, r"\d{1,6}")
    return tf.cond(known, lambda: tf.strings.to_number(found, tf.int64), lambda: tf.constant(-1, tf.int64))


def fit(trainer: BackupWorkerTrainer, epochs: int, steps_per_epoch: int, evaluate: Callable | None = None,
        on_epoch: Callable | None = None) -> list[dict[str, Any]]:
    """Train ``epochs`` x ``steps_per_epoch`` synchronous steps; one record per epoch."""
    history = []
    for epoch in range(epochs):
        stats = StepStats()
        start = time.perf_counter()
        losses = [trainer.train_step(stats) for _ in range(steps_per_epoch)]
        seconds = time.perf_counter() - start
        record = {"epoch": epoch + 1, "loss": sum(losses) / len(losses), "seconds": seconds,
                  "steps_per_sec": steps_per_epoch / seconds, **stats.as_dict()}
        if evaluate is not None:
            record.update(evaluate())
        history.append(record)
        if on_epoch is not None:
            on_epoch(record)
    return history
