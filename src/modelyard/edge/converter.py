"""Edge conversion: ``model.tflite``'s converter with the quantization mode and calibration data set.

The conversion itself (TF1 and TF2 SavedModels, error mapping) is ``modelyard.model.tflite``;
this module only says what each ``ConvertOptions`` asks of the converter.
"""
from __future__ import annotations

from pathlib import Path

from modelyard.edge.data import Dataset, representative_batches
from modelyard.edge.modes import ConvertOptions, configure
from modelyard.model import tflite
from modelyard.model.signatures import Signature


def _representative(data: Dataset | None, order: list[str], as_dict: bool):
    if data is None:
        return None
    return lambda: representative_batches(data, order, as_dict)


def convert_saved_model(
    version_dir: Path, signature: Signature, options: ConvertOptions, data: Dataset | None = None,
) -> bytes:
    """Convert ``signature`` of the SavedModel at ``version_dir``; ``data`` calibrates int8."""
    options.check(data is not None)
    order = list(signature.inputs)

    def configure_for(converter, is_tf1: bool) -> None:
        # A session conversion feeds inputs as a list; a TF2 signature with several inputs, by name.
        configure(converter, options, _representative(data, order, as_dict=not is_tf1 and len(order) > 1))

    return tflite.convert_saved_model(version_dir, signature, configure_for, allow_tf_ops=options.allow_tf_ops,
                                      int8=options.quantize == "int8")


def convert_keras_model(model, options: ConvertOptions, data: Dataset | None = None) -> bytes:
    """Convert an in-memory tf_keras model (used after quantization-aware training)."""
    import tensorflow as tf

    options.check(data is not None)
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    order = list(data.inputs) if data is not None else []
    configure(converter, options, _representative(data, order, as_dict=False))
    return tflite.run_converter(converter, options.allow_tf_ops, options.quantize == "int8")
