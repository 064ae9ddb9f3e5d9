"""Model parallelism and GPipe pipeline parallelism for a chain of tf_keras layers.

``model_parallel: {stages: [[...], [...]], devices: [CPU:0, CPU:1], micro_batches: M}``
cuts the model's layers into K consecutive stages and runs stage k's computation on
device k. Each batch is split into M micro-batches; every stage has its own thread, so
stage 2 works on micro-batch 1 while stage 1 works on micro-batch 2 (GPipe: all forward
passes, then all backward passes, then one synchronous update of every stage's weights).
With M = 1 it is plain model parallelism: one stage busy at a time.

A stage's backward pass recomputes its forward pass under a tape from the stashed input
(GPipe's re-materialisation), so only each micro-batch's stage inputs are kept between the
two passes, never the activations inside a stage. The gradient is the mean of the
micro-batches' mean-loss gradients: the whole batch's gradient, so training follows the
unpipelined model's losses.

``schedule: 1f1b`` is PipeDream's (Narayanan et al. 2019): after a warm-up of K - 1 - k
forward passes, stage k alternates one forward and one backward pass (1F1B), so it holds at
most K - k micro-batches' inputs instead of GPipe's M, and each stage applies its gradient
as soon as its backward pass ends (one update per micro-batch, on the stage's own copy of
the optimizer: asynchronous between stages). A micro-batch's forward and backward passes
then meet different weights; with ``weight_stashing`` (default on) the stage keeps the
weights of each forward pass until that micro-batch's backward pass, which uses them, so
the gradient is that of the weights the forward pass saw. A version is saved only when an
update is about to overwrite it while a micro-batch that saw it is in flight (stage k of K
saves at most K - 1 - k versions, the last stage none), into a reused copy of the stage's
layers whose own backward pass runs on it; each update is one XLA-compiled call (with the
save, when there is one). ``1f1b-flush`` (PipeDream-Flush)
keeps 1F1B's order and memory but applies one update per batch: GPipe's updates exactly.
Each step ends with the pipeline drained (the next batch starts on fresh weights), so the
updates' staleness is at most K - 1 - k on stage k; it is counted per update.

The idle ("bubble") share is measured on each step: 1 - (time the stages were busy) /
(K x the span from the first stage call's start to the last one's end), next to GPipe's
theoretical (K - 1) / (M + K - 1). The weight update after the span is not part of it.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from modelyard.training.config import PIPELINE_SCHEDULES, ConfigError


def theoretical_bubble(stages: int, micro_batches: int) -> float:
    return (stages - 1) / (micro_batches + stages - 1)


def split_layers(model, stages) -> list[list]:
    """The model's layers in K consecutive groups: named lists (checked) or K even parts."""
    layers = [layer for layer in model.layers if layer.__class__.__name__ != "InputLayer"]
    if isinstance(stages, int):
        if stages > len(layers):
            raise ConfigError(f"model_parallel.stages: {stages} stages but the model has {len(layers)} layers")
        bounds = [round(i * len(layers) / stages) for i in range(stages + 1)]
        return [layers[bounds[i]:bounds[i + 1]] for i in range(stages)]
    by_name = {layer.name: layer for layer in layers}
    named = [name for stage in stages for name in stage]
    unknown = [name for name in named if name not in by_name]
    if unknown:
        raise ConfigError(f"model_parallel.stages: no layer named {', '.join(unknown)}; the model's layers are "
                          f"{', '.join(by_name)}")
    if named != [layer.name for layer in layers]:
        raise ConfigError("model_parallel.stages: the stages must list every layer once, in the model's order: "
                          f"{', '.join(by_name)}")
    return [[by_name[name] for name in stage] for stage in stages]


def _float_input(x):
    """A stage's input as its backward pass differentiates it: integer data (images) as float32."""
    import tensorflow as tf

    return tf.cast(x, tf.float32) if x.dtype.is_integer else x


def _backward_fn(layers: list, variables: list, device: str, loss_fn, needs_input_gradient: bool):
    """A traced backward pass over ``layers``: recompute their forward pass under a tape and return the
    gradient for the previous stage, for ``variables``, the loss (last stage) and the output."""
    import tensorflow as tf

    @tf.function(reduce_retracing=True)
    def backward(x, upstream, scale):
        # upstream: d(loss)/d(this stage's output) for inner stages, the labels for the last one.
        with tf.device(device):
            x = _float_input(x)
            with tf.GradientTape() as tape:
                if needs_input_gradient:  # the first stage's input is the data: no gradient to send
                    tape.watch(x)
                y = x
                for layer in layers:
                    y = layer(y, training=True)
                if loss_fn is not None:
                    loss = tf.reduce_mean(loss_fn(upstream, y))
                    target = loss * scale
                else:
                    loss = tf.constant(0.0)
                    target = tf.reduce_sum(y * upstream)
            grads = tape.gradient(target, [x] + variables)
            d_vars = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                      for g, v in zip(grads[1:], variables)]
            return grads[0], d_vars, loss, y

    return backward


class _Compiled:
    """A stage's per-micro-batch weight update (1f1b), compiled with XLA so the optimizer's
    element-wise steps run as one pass over each weight instead of one pass and one new
    tensor per step (Keras' SGD makes five); run on the device that holds the variables (XLA
    does not reach a variable on another device). An update XLA cannot compile (the first
    call fails) runs traced without it; ``compiled`` says which one ran."""

    def __init__(self, fn, device: str):
        import tensorflow as tf

        self._tf, self.device = tf, device
        self._xla = tf.function(fn, jit_compile=True, reduce_retracing=True)
        self._plain = tf.function(fn, reduce_retracing=True)
        self.compiled: bool | None = None  # unknown until the first call

    def __call__(self, *args):
        tf = self._tf
        with tf.device(self.device):
            if self.compiled is None:
                try:
                    out = self._xla(*args)
                except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
                    self.compiled = False
                    return self._plain(*args)
                self.compiled = True
                return out
            return (self._xla if self.compiled else self._plain)(*args)


class _Slot:
    """One saved version of a stage's weights (1f1b weight stashing): a copy of the stage's
    layers with variables of their own, so the backward pass of a micro-batch whose forward
    pass saw an older version runs on this copy instead of swapping the weights in and out of
    the live variables (two copies of the weights per pass saved)."""

    def __init__(self, stage: "_Stage", sample):
        import tensorflow as tf

        advice = "train them with weight_stashing: false or schedule 1f1b-flush"
        with tf.device(stage.variables[0].device):  # next to the live weights: one XLA update writes both
            try:
                self.layers = [layer.__class__.from_config(layer.get_config()) for layer in stage.layers]
                x = _float_input(sample)
                for layer in self.layers:  # builds each copy's weights for the stage's input
                    x = layer(x, training=False)
            except Exception as exc:
                raise RuntimeError(f"weight stashing: cannot copy the layers {', '.join(l.name for l in stage.layers)} "
                                   f"from their config ({type(exc).__name__}: {exc}); {advice}") from exc
        self.variables = [v for layer in self.layers for v in layer.trainable_variables]
        if [tuple(v.shape) for v in self.variables] != [tuple(v.shape) for v in stage.variables]:
            raise RuntimeError(f"weight stashing: a copy of the layers {', '.join(l.name for l in stage.layers)} "
                               f"does not rebuild the same trainable weights from its config; {advice}")
        self.backward = _backward_fn(self.layers, self.variables, stage.device, stage.loss_fn,
                                     stage.needs_input_gradient)
        optimizer, live, saved = stage.optimizer, stage.variables, self.variables

        def save_and_update(grads):
            # Saving before the update in the same compiled call: one read of each weight for both.
            for copy, variable in zip(saved, live):
                copy.assign(variable)
            optimizer.apply_gradients(zip(grads, live))

        self.save_and_update = _Compiled(save_and_update, stage.variables[0].device)
        self.version: int | None = None  # the version it holds; None: free


class _Stage:
    """K consecutive layers on one device: a forward pass, and a backward pass that recomputes it."""

    def __init__(self, layers: list, device: str, loss_fn=None, needs_input_gradient: bool = True):
        import tensorflow as tf

        self.layers, self.device, self.loss_fn = layers, device, loss_fn
        self.needs_input_gradient = needs_input_gradient
        self.variables = [v for layer in layers for v in layer.trainable_variables]

        @tf.function(reduce_retracing=True)
        def forward(x):
            with tf.device(device):
                for layer in layers:
                    x = layer(x, training=True)
                return x

        @tf.function(reduce_retracing=True)
        def accumulate(total, grads):
            with tf.device(device):
                return [t + g for t, g in zip(total, grads)]

        self.forward, self.accumulate = forward, accumulate
        self.backward = _backward_fn(layers, self.variables, device, loss_fn, needs_input_gradient)
        self.optimizer = None  # 1f1b: the stage's own copy of the model's optimizer
        self.update = None  # 1f1b: one compiled update of this stage's weights (_Compiled)
        self.slots: list[_Slot] = []  # 1f1b with stashing: saved versions of the weights, reused
        self.saves = 0  # 1f1b with stashing: times the weights were saved for an in-flight micro-batch
        self.version = 0  # updates applied to this stage's weights
        self.checks: list[tuple[int, float, float]] | None = None  # (micro-batch, forward's weights, backward's)
        self.busy = 0.0
        self.first, self.last = float("inf"), 0.0  # this step's first call began, last call ended
        self.output_device = ""  # where its forward output was placed (TF's own answer)

    def slot_holding(self, version: int) -> "_Slot | None":
        return next((slot for slot in self.slots if slot.version == version), None)

    def update_saving(self, grads, sample) -> "_Slot":
        """Save the current weights in a free slot (a new one if none is free), then update them."""
        slot = next((slot for slot in self.slots if slot.version is None), None)
        if slot is None:
            slot = _Slot(self, sample)
            self.slots.append(slot)
        self.timed(slot.save_and_update, grads)
        slot.version = self.version
        self.saves += 1
        return slot

    def timed(self, fn, *args):
        import tensorflow as tf

        start = time.perf_counter()
        with tf.device(self.device):  # the call itself too: else its outputs land on the caller's device
            out = fn(*args)
        end = time.perf_counter()
        self.busy += end - start
        self.first = min(self.first, start)
        self.last = max(self.last, end)
        return out


SCHEDULES = PIPELINE_SCHEDULES  # gpipe, 1f1b, 1f1b-flush: the config checks them, the pipeline runs them


def _fingerprint(variables) -> float:
    """A number that changes when any weight does (for the weight-stashing check)."""
    import numpy as np

    return float(sum(np.abs(np.asarray(v, np.float64)).sum() for v in variables))


@dataclass
class StepResult:
    loss: float
    predictions: list = field(default_factory=list)  # the last stage's outputs, one per micro-batch
    wall: float = 0.0  # the whole step, the weight update included
    busy: list[float] = field(default_factory=list)  # each stage's time in its forward and backward calls
    span: float = 0.0  # from the first stage call's start to the last one's end: the schedule GPipe's bound is about
    stashed_peak: list[int] = field(default_factory=list)  # per stage: most micro-batch inputs held at once
    versions_peak: list[int] = field(default_factory=list)  # per stage: most weight versions alive at once
    staleness: list[list[int]] = field(default_factory=list)  # per stage: each update's staleness (1f1b)

    @property
    def bubble(self) -> float:
        return 1.0 - sum(self.busy) / (len(self.busy) * self.span) if self.span > 0 else 0.0


class Pipeline:
    """Train ``model`` with its layers cut into stages on devices, pipelined over micro-batches
    (GPipe, PipeDream's 1F1B with or without weight stashing, or PipeDream-Flush)."""

    def __init__(self, model, stages, devices: list[str], micro_batches: int, schedule: str = "gpipe",
                 weight_stashing: bool = True, check_weights: bool = False):
        import tensorflow as tf
        import tf_keras as keras

        from modelyard.training.strategy import _check_present, _device

        names = [_device(d) for d in devices]
        _check_present(names)
        groups = split_layers(model, stages)
        if getattr(model, "losses", None):
            raise ConfigError("model_parallel: the model has regularisation losses (model.losses), which the "
                              "pipeline does not add; drop the regularizers or train without model_parallel")
        loss_fn = keras.losses.get(model.loss)
        self.model, self.micro_batches = model, micro_batches
        self.stages = [_Stage(group, name, loss_fn if i == len(groups) - 1 else None, needs_input_gradient=i > 0)
                       for i, (group, name) in enumerate(zip(groups, names))]
        self.optimizer = model.optimizer
        if schedule not in SCHEDULES:
            raise ConfigError(f"model_parallel.schedule: {schedule!r} is not one of {', '.join(SCHEDULES)}")
        self.schedule, self.weight_stashing = schedule, weight_stashing
        if schedule == "1f1b":
            for stage in self.stages:  # each stage updates its own weights, in its own thread
                stage.optimizer = model.optimizer.__class__.from_config(model.optimizer.get_config())
                stage.optimizer.build(stage.variables)  # its slots exist before the first traced update
                if stage.variables:
                    stage.update = _Compiled(lambda grads, stage=stage: stage.optimizer.apply_gradients(
                        zip(grads, stage.variables)), stage.variables[0].device)
        if check_weights:
            for stage in self.stages:
                stage.checks = []
        self._tf = tf

    @property
    def theoretical_bubble(self) -> float:
        return theoretical_bubble(len(self.stages), self.micro_batches)

    def train_step(self, x, y) -> StepResult:
        tf = self._tf
        m = self.micro_batches
        xs, ys = tf.split(x, m), tf.split(y, m)
        k = len(self.stages)
        forward_in = [queue.Queue() for _ in range(k)]
        backward_in = [queue.Queue() for _ in range(k)]
        grads: list[list[Any] | None] = [None] * k
        losses = [None] * m
        outputs = [None] * m
        errors: list[BaseException] = []
        for stage in self.stages:
            stage.busy, stage.first, stage.last = 0.0, float("inf"), 0.0

        asynchronous = self.schedule == "1f1b"
        stashed_peak, versions_peak = [0] * k, [1] * k
        staleness: list[list[int]] = [[] for _ in range(k)]

        def forward(i: int) -> bool:
            stage, last = self.stages[i], i == k - 1
            j, value = forward_in[i].get()
            if value is None:
                return False
            # Only the version is noted: the weights are saved when an update would overwrite a
            # version that an in-flight micro-batch still needs (see backward), not on every pass.
            stash[i][j] = (value, stage.version, _fingerprint(stage.variables) if stage.checks is not None else None)
            stashed_peak[i] = max(stashed_peak[i], len(stash[i]))
            out = stage.timed(stage.forward, value)
            stage.output_device = out.device
            if last:
                backward_in[i].put((j, ys[j]))
            else:
                forward_in[i + 1].put((j, out))
            return True

        def backward(i: int) -> bool:
            stage, last = self.stages[i], i == k - 1
            j, upstream = backward_in[i].get()
            if upstream is None:
                return False
            value, version, seen = stash[i].pop(j)
            stashing = asynchronous and self.weight_stashing
            slot = stage.slot_holding(version) if stashing and version != stage.version else None
            if stashing and version != stage.version and slot is None:
                raise RuntimeError(f"weight stashing: stage {i} has no saved copy of version {version} for "
                                   f"micro-batch {j}")  # a bug in the bookkeeping below, never expected
            backward_fn, used = (slot.backward, slot.variables) if slot else (stage.backward, stage.variables)
            if stage.checks is not None:
                stage.checks.append((j, seen, _fingerprint(used)))
            scale = tf.constant(1.0 if asynchronous else 1.0 / m)
            d_input, d_vars, loss, y_pred = stage.timed(backward_fn, value, upstream, scale)
            if slot is not None and all(entry[1] != version for entry in stash[i].values()):
                slot.version = None  # no micro-batch in flight needs that version any more
            if last:
                losses[j], outputs[j] = loss, y_pred
            if i > 0:
                backward_in[i - 1].put((j, d_input))
            if asynchronous:  # PipeDream: this micro-batch's update, now, on this stage alone
                if stage.variables:
                    staleness[i].append(stage.version - version)
                    waiting = [entry[0] for entry in stash[i].values() if entry[1] == stage.version]
                    if stashing and waiting:  # a micro-batch in flight saw these weights: keep them
                        stage.update_saving(d_vars, waiting[0])
                    else:
                        stage.timed(stage.update, d_vars)
                    stage.version += 1
                    if stashing:  # the versions alive: the current one and those saved
                        versions_peak[i] = max(versions_peak[i],
                                               1 + sum(s.version is not None for s in stage.slots))
            else:
                # Summing the micro-batches' gradients is the stage's work too: timed, on its device.
                grads[i] = list(d_vars) if grads[i] is None else stage.timed(stage.accumulate, grads[i], d_vars)
            return True

        stash: list[dict] = [{} for _ in range(k)]

        def work(i: int) -> None:
            try:
                if self.schedule == "gpipe":
                    order = ["F"] * m + ["B"] * m  # every forward pass first, then every backward pass
                else:  # 1F1B: K - 1 - i forward passes of warm-up, then one forward, one backward
                    warm = min(k - 1 - i, m)
                    order = ["F"] * warm + ["F", "B"] * (m - warm) + ["B"] * warm
                for step in order:
                    if not (forward(i) if step == "F" else backward(i)):
                        return
            except BaseException as exc:  # stop the other stages too, then re-raise in the caller
                errors.append(exc)
                for q in forward_in + backward_in:
                    q.put((None, None))

        start = time.perf_counter()
        threads = [threading.Thread(target=work, args=(i,), name=f"pipeline-stage-{i}", daemon=True) for i in range(k)]
        for thread in threads:
            thread.start()
        for j in range(m):
            forward_in[0].put((j, xs[j]))
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        if not asynchronous:  # one synchronous update of the whole batch (GPipe, PipeDream-Flush)
            pairs = [(g, v) for stage, stage_grads in zip(self.stages, grads)
                     for g, v in zip(stage_grads or [], stage.variables) if g is not None]
            self.optimizer.apply_gradients(pairs)
        wall = time.perf_counter() - start
        loss = float(tf.reduce_mean(tf.stack(losses)))
        span = max(s.last for s in self.stages) - min(s.first for s in self.stages)
        return StepResult(loss, outputs, wall, [s.busy for s in self.stages], span, stashed_peak, versions_peak,
                          staleness)


def fit(pipeline: Pipeline, dataset, epochs: int, steps_per_epoch: int, on_epoch=None) -> list[dict]:
    """Train for ``epochs`` x ``steps_per_epoch`` steps of ``dataset``; one record per epoch."""
    import numpy as np

    batches = iter(dataset.repeat())
    history = []
    for epoch in range(epochs):
        losses, correct, seen, wall, bubbles = [], 0, 0, 0.0, []
        k = len(pipeline.stages)
        stashed, versions, staleness = [0] * k, [1] * k, [[] for _ in range(k)]
        for _ in range(steps_per_epoch):
            x, y = next(batches)
            result = pipeline.train_step(x, y)
            losses.append(result.loss)
            predicted = np.concatenate([np.asarray(p) for p in result.predictions])
            labels = np.asarray(y).reshape(-1)
            if predicted.ndim == 2 and predicted.shape[1] > 1:
                correct += int((predicted.argmax(axis=1) == labels).sum())
            seen += len(labels)
            wall += result.wall
            bubbles.append(result.bubble)
            stashed = [max(a, b) for a, b in zip(stashed, result.stashed_peak)]
            versions = [max(a, b) for a, b in zip(versions, result.versions_peak)]
            for mine, more in zip(staleness, result.staleness):
                mine.extend(more)
        record = {
            "epoch": epoch + 1, "loss": float(np.mean(losses)), "accuracy": correct / max(seen, 1),
            "samples_per_sec": seen / max(wall, 1e-9), "seconds": wall,
            # The first step of a run traces the stages' functions: leave it out of the bubble.
            "bubble": float(np.median(bubbles[1:] if len(bubbles) > 1 else bubbles)),
            "bubble_theoretical": pipeline.theoretical_bubble,
            "schedule": pipeline.schedule,
            "stashed_inputs_peak": stashed,  # per stage: micro-batch inputs held at once (activation memory)
            "weight_versions_peak": versions,  # per stage: weight versions alive at once (1f1b with stashing)
        }
        if pipeline.schedule == "1f1b":  # per stage: how many updates each update's weights were behind
            record["staleness_mean"] = [float(np.mean(t)) if t else 0.0 for t in staleness]
            record["staleness_max"] = [int(max(t)) if t else 0 for t in staleness]
        history.append(record)
        if on_epoch is not None:
            on_epoch(record)
    return history
