"""A tf_keras model as a conversion source: a ``.keras``/``.h5`` file or a model in memory.

Quantization-aware training needs the Keras layers themselves, which a SavedModel
written by ``tf.saved_model.save`` (what ``modelyard.export`` writes) no longer has,
so QAT starts from a Keras model file (``model.save("m.keras")``) or a live model.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from modelyard.model.tflite import ConvertError
from modelyard.model import dtypes
from modelyard.model.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec

KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")


def is_keras_file(src: str) -> bool:
    return Path(src).suffix.lower() in KERAS_SUFFIXES


def load_keras_model(src: str):
    """Load a tf_keras model file (compile=False: the optimizer state is not needed)."""
    import tensorflow as tf

    path = Path(src)
    if not path.exists():
        raise ConvertError(f"{src} does not exist")
    try:
        return tf.keras.models.load_model(str(path), compile=False)
    except Exception as exc:  # load_model raises ValueError, OSError, TypeError... for bad files
        raise ConvertError(f"{src} is not a loadable tf_keras model: {exc}") from exc


def _spec(alias: str, tensor) -> TensorSpec:
    shape = tuple(-1 if d is None else int(d) for d in tensor.shape)
    return TensorSpec(alias, tensor.name, dtypes.from_numpy(np.dtype(tensor.dtype.as_numpy_dtype)), shape)


def keras_signature(model) -> Signature:
    """The model's inputs/outputs in the same form as a SavedModel signature."""
    inputs = {name: _spec(name, t) for name, t in zip(model.input_names, model.inputs)}
    outputs = {name: _spec(name, t) for name, t in zip(model.output_names, model.outputs)}
    return Signature(DEFAULT_SIGNATURE, PREDICT_METHOD, inputs, outputs)


def run_keras(model, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    feed = [inputs[name] for name in model.input_names]
    result = model.predict(feed if len(feed) > 1 else feed[0], verbose=0, batch_size=256)
    if not isinstance(result, (list, tuple)):
        result = [result]
    return dict(zip(model.output_names, result))
