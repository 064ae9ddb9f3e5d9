"""The train step behind ``accumulate_steps`` and ``gradient_dtype``: one place that changes how
a tf_keras model turns a batch into one update.

- ``accumulate_steps: k`` runs each replica's batch as k micro-batches, one after the other
  (a ``tf.while_loop``, so their activations are never alive together), sums their mean
  gradients / k and applies one update: exactly the update of the whole batch, with the
  activation memory of a micro-batch. (Layers whose output depends on the whole batch, such
  as BatchNormalization in training, see micro-batches instead: say so to users.)
- ``recompute: true`` (or a list of layer names) runs each marked layer under
  ``tf.recompute_grad``: its activations are not kept for the backward pass but computed
  again there (gradient checkpointing), trading compute for memory; the gradients are the
  same. ``true`` marks every layer with weights. Needs a chain of layers (``Sequential``).
- ``gradient_dtype: bfloat16`` casts the gradients to bfloat16 before the all-reduce between
  replicas and back after it, halving the bytes each step sends. Keras has already divided
  each replica's loss by the replica count, so the summed values stay the size of a mean
  (and bfloat16 has float32's exponent range): no overflow to guard against.
"""
from __future__ import annotations

from dataclasses import dataclass

GRADIENT_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class StepOptions:
    accumulate_steps: int = 1
    gradient_dtype: str = "float32"
    recompute: bool | tuple[str, ...] = False

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

    model.train_step = types.MethodType(_make_step(options, _recomputed_layers(model, options.recompute)), model)


def _recomputed_layers(model, recompute) -> frozenset[str]:
    """Names of the layers ``recompute`` marks, checked against the model."""
    if not recompute:
        return frozenset()
    layers = _chain(model)
    if recompute is True:
        return frozenset(layer.name for layer in layers if layer.trainable_weights)
    names = {layer.name for layer in layers}
    unknown = [name for name in recompute if name not in names]
    if unknown:
        from modelyard.training.config import ConfigError

        raise ConfigError(f"recompute: no layer named {', '.join(unknown)}; the model's layers are {', '.join(names)}")
    return frozenset(recompute)


def _chain(model) -> list:
    from modelyard.training.config import ConfigError

    if model.__class__.__name__ != "Sequential":
        raise ConfigError("recompute: needs a Sequential model (a chain of layers) to know where blocks begin and end")
    return list(model.layers)


def _forward(model, x, recomputed: frozenset[str]):
    """``model(x, training=True)``, with the marked layers' activations recomputed in the backward pass."""
    if not recomputed:
        return model(x, training=True)
    import tensorflow as tf

    for layer in model.layers:
        if layer.name in recomputed:
            x = tf.recompute_grad(lambda t, layer=layer: layer(t, training=True))(x)
        else:
            x = layer(x, training=True)
    return x


def _make_step(options: StepOptions, recomputed: frozenset[str] = frozenset()):
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
        tf.debugging.assert_equal(rows % k, 0, message=f"accumulate_steps {k} must divide each replica's batch")
        size = rows // k

        def body(i, total):
            def take(t):
                return None if t is None else t[i * size:(i + 1) * size]

            xi, yi, wi = (None if part is None else tf.nest.map_structure(take, part) for part in (x, y, sample_weight))
            with tf.GradientTape() as tape:
                y_pred = _forward(model, xi, recomputed)
                loss = model.compute_loss(xi, yi, y_pred, wi)
            model.compute_metrics(xi, yi, y_pred, wi)
            grads = _dense(tape.gradient(loss, variables), variables)
            return i + 1, [t + g / k for t, g in zip(total, grads)]

        zeros = [tf.zeros_like(v) for v in variables]
        _, total = tf.while_loop(lambda i, _: i < k, body, (tf.constant(0), zeros))
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
