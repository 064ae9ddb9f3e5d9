"""The train step behind ``accumulate_steps`` and ``gradient_dtype``: one place that changes how
a tf_keras model turns a batch into one update.

- ``accumulate_steps: k`` runs each replica's batch as k micro-batches, one after the other
  (each forward pass waits for the previous micro-batch's gradients, so their activations are
  never alive together), sums their mean gradients / k in the replica and applies one update
  (one all-reduce of the sum between replicas, not one per micro-batch): exactly the update of
  the whole batch, with the activation memory of a micro-batch. (Layers whose output depends on the whole batch, such
  as BatchNormalization in training, see micro-batches instead: say so to users.)
- ``recompute: true`` (or a list of blocks, each a list of consecutive layer names) runs each
  block under ``tf.recompute_grad``: only the block's input is kept for the backward pass,
  which computes the block's activations again (gradient checkpointing), trading compute
  for memory; the gradients are the same. ``true`` makes about sqrt(L) blocks of sqrt(L)
  layers. Needs a chain of layers (``Sequential``).
- ``gradient_dtype: bfloat16`` casts the gradients to bfloat16 before the all-reduce between
  replicas and back after it, halving the bytes each step sends. Keras has already divided
  each replica's loss by the replica count, so the summed values stay the size of a mean
  (and bfloat16 has float32's exponent range): no overflow to guard against.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

GRADIENT_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class StepOptions:
    accumulate_steps: int = 1
    gradient_dtype: str = "float32"
    recompute: bool | tuple = False  # True, or blocks: tuples of consecutive layer names

    @property
    def custom(self) -> bool:
        return self.accumulate_steps > 1 or self.gradient_dtype != "float32" or bool(self.recompute)


def gradient_bytes_per_step(model, gradient_dtype: str) -> int:
    """Bytes of gradients one replica hands to the all-reduce each step (every trainable value)."""
    import numpy as np

    values = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    return values * (2 if gradient_dtype == "bfloat16" else 4)


def install(model, options: StepOptions) -> None:
    """Replace ``model.train_step`` (before ``fit`` builds its train function) when the options ask."""
    if not options.custom:
        return
    import types

    import tf_keras as keras

    if options.accumulate_steps > 1 and type(model).compute_metrics is not keras.Model.compute_metrics:
        from modelyard.training.config import ConfigError

        # The micro-batches update the compiled metrics themselves (see _make_step); a
        # custom compute_metrics would silently not run.
        raise ConfigError(f"accumulate_steps: {type(model).__name__} overrides compute_metrics, which the "
                          "micro-batches cannot call; put the metrics in compile(metrics=...) or drop accumulate_steps")

    model.train_step = types.MethodType(_make_step(options, _recomputed_layers(model, options.recompute)), model)


def _recomputed_layers(model, recompute) -> tuple[tuple[str, ...], ...]:
    """The blocks ``recompute`` marks, each a run of consecutive layer names, checked against the model.

    ``true``: about sqrt(L) blocks of sqrt(L) layers, the classic choice (Chen et al. 2016): only
    each block's input is kept, and one block's activations are rebuilt at a time.
    """
    if not recompute:
        return ()
    layers = [layer.name for layer in _chain(model)]
    if recompute is True:
        size = max(1, math.isqrt(len(layers) - 1) + 1) if len(layers) > 1 else 1
        return tuple(tuple(layers[i:i + size]) for i in range(0, len(layers), size))
    from modelyard.training.config import ConfigError

    blocks = tuple(tuple(block) if isinstance(block, (list, tuple)) else (block,) for block in recompute)
    unknown = [name for block in blocks for name in block if name not in layers]
    if unknown:
        raise ConfigError(f"recompute: no layer named {', '.join(unknown)}; the model's layers are {', '.join(layers)}")
    for block in blocks:
        start = layers.index(block[0])
        if list(block) != layers[start:start + len(block)]:
            raise ConfigError(f"recompute: block {list(block)} is not a run of consecutive layers of the model "
                              f"({', '.join(layers)})")
    return blocks


def _chain(model) -> list:
    from modelyard.training.config import ConfigError

    if model.__class__.__name__ != "Sequential":
        raise ConfigError("recompute: needs a Sequential model (a chain of layers) to know where blocks begin and end")
    return list(model.layers)


def _forward(model, x, blocks: tuple[tuple[str, ...], ...]):
    """``model(x, training=True)``, each marked block's activations rebuilt in the backward pass
    from the block's input (the only tensor of the block kept from the forward pass)."""
    if not blocks:
        return model(x, training=True)
    import tensorflow as tf

    by_name = {layer.name: layer for layer in model.layers}
    first = {block[0]: block for block in blocks}
    layers, i = model.layers, 0
    while i < len(layers):
        block = first.get(layers[i].name)
        if block is None:
            x = layers[i](x, training=True)
            i += 1
            continue

        def run_block(t, block=block):
            for name in block:
                t = by_name[name](t, training=True)
            return t

        x = tf.recompute_grad(run_block)(x)
        i += len(block)
    return x


def _make_step(options: StepOptions, recomputed: tuple[tuple[str, ...], ...] = ()):
    import tensorflow as tf
    import tf_keras as keras

    k = options.accumulate_steps
    compress = options.gradient_dtype == "bfloat16"

    def micro_batch_gradients(model, x, y, sample_weight):
        variables = model.trainable_variables
        if k == 1:
            with tf.GradientTape() as tape:
                y_pred = _forward(model, x, recomputed)
                loss = model.compute_loss(x, y, y_pred, sample_weight)
            model.compute_metrics(x, y, y_pred, sample_weight)
            return _dense(tape.gradient(loss, variables), variables)
        rows = tf.shape(tf.nest.flatten(x)[0])[0]
        check = tf.debugging.assert_equal(rows % k, 0, message=f"accumulate_steps {k} must divide each replica's batch")
        size = rows // k
        # The k micro-batches are written out one after the other (k is small and known when
        # tracing) rather than in a tf.while_loop: the loss and the metrics update their
        # running sums in every micro-batch, and under central_storage such an update is a
        # merge_call, which TensorFlow refuses inside the control flow of a replica context.
        # Each micro-batch's forward pass waits for the previous one's gradients (control
        # dependencies), so one micro-batch's activations are alive at a time, as in a loop.
        total, previous = None, [check]
        for i in range(k):
            with tf.control_dependencies(previous):
                def take(t, i=i):
                    return None if t is None else t[i * size:(i + 1) * size]

                xi, yi, wi = (None if part is None else tf.nest.map_structure(take, part)
                              for part in (x, y, sample_weight))
                with tf.GradientTape() as tape:
                    y_pred = _forward(model, xi, recomputed)
                    loss = model.compute_loss(xi, yi, y_pred, wi)
            # Only the metrics' running sums here; their result() (a merge_call across the
            # replicas, a collective under multi_worker_mirrored) is read once per step, by
            # train_step's return, as in Keras' own step.
            model.compiled_metrics.update_state(yi, y_pred, wi)
            grads = _dense(tape.gradient(loss, variables), variables)
            total = [g / k for g in grads] if total is None else [t + g / k for t, g in zip(total, grads)]
            previous = total
        return total

    def train_step(model, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        variables = model.trainable_variables
        grads = micro_batch_gradients(model, x, y, sample_weight)
        context = tf.distribute.get_replica_context()
        if compress and context is not None and context.num_replicas_in_sync > 1:
            packed = [tf.cast(g, tf.bfloat16) for g in grads]
            summed = context.all_reduce(tf.distribute.ReduceOp.SUM, packed)
            grads = [tf.cast(g, v.dtype) for g, v in zip(summed, variables)]
            model.optimizer.apply_gradients(zip(grads, variables), skip_gradients_aggregation=True)
        else:
            model.optimizer.apply_gradients(zip(grads, variables))
        return model.get_metrics_result()

    return train_step


def _dense(grads, variables):
    """Gradients as dense tensors (zeros for a variable the loss does not reach), ready to add up."""
    import tensorflow as tf

    return [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]
