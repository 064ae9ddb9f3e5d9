"""Per-epoch callbacks: a one-line progress display and the ``metrics.json`` writer.

Neither hooks into batches: a per-batch callback forces Keras to sync with the host
every step, which would cost throughput on every strategy.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import tf_keras as keras

from modelyard.training import uri_paths


def _fmt(value: float) -> str:
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:.0f}"


class _EpochStart(keras.callbacks.Callback):
    """The timer's start hook: placed last, so other callbacks' epoch-begin work is not timed."""

    def __init__(self, timer: "EpochTimer"):
        super().__init__()
        self.timer = timer

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self.timer._iterations = self.timer._read_iterations()
        self.timer._train_end = None
        self.timer._cpu_start = time.process_time()
        self.timer._start = time.perf_counter()


class EpochTimer(keras.callbacks.Callback):
    """Times the training steps of each epoch and counts them.

    Put the timer first in the callback list and ``timer.start_hook`` last: the clock
    then runs from the last epoch-begin hook to the start of validation (or the first
    epoch-end hook), i.e. over the training steps only, the way a plain script timing
    ``fit`` with a single callback measures them. ``epoch_seconds`` is the wall time
    from the first epoch-begin hook to the end of validation.
    """

    def __init__(self, global_batch_size: int):
        super().__init__()
        self.global_batch_size = global_batch_size
        self.records: dict[int, dict[str, float]] = {}
        self.start_hook = _EpochStart(self)
        self._wall_start = 0.0
        self._start = 0.0
        self._train_end: float | None = None
        self._cpu_start = 0.0
        self._cpu_end: float | None = None
        self._iterations = 0

    def _read_iterations(self) -> int:
        return int(keras.backend.get_value(self.model.optimizer.iterations))

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self._wall_start = time.perf_counter()

    def on_test_begin(self, logs=None) -> None:
        if self._train_end is None:  # fit's validation starts: training part is over
            self._train_end = time.perf_counter()
            self._cpu_end = time.process_time()

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        now, cpu_now = time.perf_counter(), time.process_time()
        end = self._train_end or now
        cpu_end = self._cpu_end if self._train_end else cpu_now
        self._cpu_end = None
        steps = self._read_iterations() - self._iterations
        seconds = max(end - self._start, 1e-9)
        cpu_seconds = max(cpu_end - self._cpu_start, 1e-9)
        self.records[epoch] = {
            "steps": steps,
            "seconds": seconds,
            "samples_per_sec": steps * self.global_batch_size / seconds,
            # CPU time of this process over the same window: what the steps cost, whatever
            # else the machine runs (wall-clock rates swing with other load, this does not).
            "cpu_seconds": cpu_seconds,
            "samples_per_cpu_sec": steps * self.global_batch_size / cpu_seconds,
            "epoch_seconds": now - self._wall_start,
        }


class Progress(keras.callbacks.Callback):
    """Prints ``epoch 2/5  22 steps  loss 0.31  accuracy 0.91  ...  4 100 samples/s`` once per epoch.

    One short line per epoch stays readable when the launcher interleaves tasks.
    """

    def __init__(self, timer: EpochTimer, epochs: int, stream=None):
        super().__init__()
        self.timer, self.epochs, self.stream = timer, epochs, stream or sys.stdout

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        rec = self.timer.records.get(epoch, {})
        parts = [f"epoch {epoch + 1}/{self.epochs}", f"{rec.get('steps', 0)} steps"]
        parts += [f"{k} {_fmt(float(v))}" for k, v in (logs or {}).items() if k != "lr"]
        parts.append(f"{rec.get('samples_per_sec', 0):.0f} samples/s")
        parts.append(f"{rec.get('epoch_seconds', 0):.1f}s")
        print("  ".join(parts), file=self.stream, flush=True)


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically so a reader (or a restarted job) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if uri_paths.is_uri(path):  # one object write is whole or absent
        path.write_text(json.dumps(data, indent=2, default=float))
        return
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(data, indent=2, default=float))
    os.replace(temp, path)


class MetricsWriter(keras.callbacks.Callback):
    """Keeps ``metrics.json`` up to date after every epoch, across restarts of the job.

    On resume, epochs already recorded before the restored one are kept, so the file
    ends with exactly one entry per epoch of the job.
    """

    def __init__(self, path: Path, timer: EpochTimer, info: dict[str, Any], resumed: bool):
        super().__init__()
        self.path, self.timer, self.info = path, timer, info
        self.epochs: list[dict[str, Any]] = []
        if resumed and path.exists():
            try:
                self.epochs = json.loads(path.read_text()).get("epochs", [])
            except (OSError, ValueError):
                self.epochs = []

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        entry = {"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()}}
        entry.update(self.timer.records.get(epoch, {}))
        self.epochs = [e for e in self.epochs if e["epoch"] < epoch + 1] + [entry]
        self.flush()

    def flush(self, **extra: Any) -> None:
        self.info.update(extra)
        write_json(self.path, {**self.info, "epochs": self.epochs})


class WarmupAndScaling(keras.callbacks.Callback):
    """Linear learning-rate scaling (lr x global/base batch) and linear warmup over epochs.

    Placed before BackupAndRestore, so the target rate is read from the freshly compiled
    optimizer, not from a restored mid-warmup value.
    """

    def __init__(self, factor: float, warmup_epochs: float, steps_per_epoch: int | None):
        super().__init__()
        self.factor, self.warmup_epochs, self.steps = factor, warmup_epochs, steps_per_epoch
        self.target = 0.0
        self._epoch = 0

    def _lr(self):
        lr = self.model.optimizer.learning_rate
        if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError("learning_rate_scaling/warmup_epochs need a constant learning rate; "
                             "scale inside your LearningRateSchedule instead")
        return lr

    def on_train_begin(self, logs=None) -> None:
        self.target = float(keras.backend.get_value(self._lr())) * self.factor
        keras.backend.set_value(self._lr(), self.target)

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs=None) -> None:
        if not self.warmup_epochs or not self.steps:
            return
        progress = (self._epoch * self.steps + batch + 1) / (self.warmup_epochs * self.steps)
        if progress <= 1.0 + 1.0 / self.steps:
            keras.backend.set_value(self._lr(), self.target * min(1.0, progress))


class EpochCheckpoint(keras.callbacks.Callback):
    """Resume support for strategies Keras' BackupAndRestore refuses (one_device,
    central_storage, parameter_server): model, optimizer and the epoch reached are saved
    after every epoch; ``restore()`` before ``fit`` gives the epoch to start from.
    """

    def __init__(self, directory: Path, model):
        super().__init__()
        import tensorflow as tf

        self.directory = directory
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epochs_done")
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, epochs_done=self.epoch)
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(directory), max_to_keep=1)

    def restore(self) -> int:
        if self.manager.latest_checkpoint:
            self.checkpoint.restore(self.manager.latest_checkpoint)
        return int(self.epoch.numpy())

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        self.epoch.assign(epoch + 1)
        self.manager.save()

    def on_train_end(self, logs=None) -> None:
        import shutil

        # Like BackupAndRestore(delete_checkpoint=True): a finished job leaves nothing to resume.
        if uri_paths.is_uri(self.directory):
            self.directory.rmtree()
        else:
            shutil.rmtree(self.directory, ignore_errors=True)
