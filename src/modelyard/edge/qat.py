"""Quantization-aware fine-tuning of a tf_keras model (tensorflow-model-optimization).

Fake-quantization nodes are inserted after supported layers, the model trains for a
few epochs so its weights adapt to int8 rounding and clipping and its activation
ranges are learned, then it is converted with full-integer quantization.
"""
from __future__ import annotations

from modelyard.edge.data import Dataset
from modelyard.model.tflite import ConvertError


def _quantizable_clone(model):
    """Annotate only the layers tfmot knows how to quantize; others stay float (the converter
    still quantizes them from calibration data)."""
    import tensorflow as tf
    import tensorflow_model_optimization as tfmot

    registry = tfmot.quantization.keras.default_8bit.Default8BitQuantizeRegistry()

    def annotate(layer):
        if registry.supports(layer):
            return tfmot.quantization.keras.quantize_annotate_layer(layer)
        return layer

    annotated = tf.keras.models.clone_model(model, clone_function=annotate)
    annotated.set_weights(model.get_weights())
    return tfmot.quantization.keras.quantize_apply(annotated)


def _loss(model):
    """Sparse categorical cross-entropy on probabilities or logits, by the last activation."""
    import tensorflow as tf

    last = model.layers[-1]
    activation = getattr(getattr(last, "activation", None), "__name__", "")
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=activation != "softmax")


def quantize_aware_finetune(model, train: Dataset, epochs: int = 1, learning_rate: float = 1e-3, batch_size: int = 32):
    """A fake-quantized copy of ``model`` fine-tuned on ``train`` (needs labels) for ``epochs``."""
    import tensorflow as tf

    if train.labels is None:
        raise ConvertError(
            f"--qat fine-tunes on labelled data: {train.name} has no 'labels' array (or use 'digits')"
        )
    if epochs < 1:
        raise ConvertError(f"--epochs must be at least 1, got {epochs}")
    if not isinstance(model, tf.keras.Model):
        raise ConvertError(f"--qat needs a tf_keras model, got {type(model).__qualname__}")
    try:
        qat_model = _quantizable_clone(model)
    except (ValueError, RuntimeError) as exc:
        raise ConvertError(f"cannot insert fake-quantization into this model: {exc}") from exc
    qat_model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate), loss=_loss(model), metrics=["accuracy"])
    x = [train.inputs[name] for name in model.input_names]
    qat_model.fit(x if len(x) > 1 else x[0], train.labels, epochs=epochs, batch_size=batch_size, verbose=0, shuffle=True)
    return qat_model
