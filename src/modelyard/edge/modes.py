"""Quantization modes: what each one asks of the TFLite converter.

- ``none``: float32 everywhere (the reference every other mode is compared with).
- ``dynamic``: weights stored as int8 (symmetric, per-channel for conv/dense where the
  converter supports it), activations float, dequantized/computed on the fly.
- ``float16``: weights stored as float16, computed in float32.
- ``int8``: weights and activations int8, ranges calibrated on representative data;
  ``io_dtype`` uint8/int8 also makes the model's float inputs/outputs integer.

``io_dtype`` only changes float tensors at the model's boundary: an input that is
already integer in the signature (e.g. uint8 pixels) keeps its dtype in every mode.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator


MODES = ("none", "dynamic", "float16", "int8")
IO_DTYPES = ("float32", "uint8", "int8")


@dataclass(frozen=True)
class ConvertOptions:
    quantize: str = "none"
    io_dtype: str = "float32"
    allow_tf_ops: bool = False

    def check(self, has_representative_data: bool) -> None:
        """Reject combinations that cannot work before any (slow) conversion starts."""
        # Here, not at the top: model.tflite loads TensorFlow, and `modelyard` builds its parser
        # from this module, so a top-level import made every command (and --help) load it.
        from modelyard.model.tflite import ConvertError

        if self.quantize not in MODES:
            raise ConvertError(f"unknown --quantize {self.quantize!r}; choose one of {', '.join(MODES)}")
        if self.io_dtype not in IO_DTYPES:
            raise ConvertError(f"unknown --io-dtype {self.io_dtype!r}; choose one of {', '.join(IO_DTYPES)}")
        if self.io_dtype != "float32" and self.quantize != "int8":
            raise ConvertError(
                f"--io-dtype {self.io_dtype} needs --quantize int8: integer inputs/outputs carry "
                "quantized values, which only full-integer models have"
            )
        if self.quantize == "int8" and not has_representative_data:
            raise ConvertError(
                "--quantize int8 needs --representative-data (a .npz of typical inputs, or 'digits' "
                "for the demo model): activation ranges are calibrated on it"
            )


def configure(converter, options: ConvertOptions, representative: Callable[[], Iterator] | None) -> None:
    """Set ``converter``'s optimization flags for ``options`` (TF2 or tf.compat.v1 converter)."""
    import tensorflow as tf

    builtin = tf.lite.OpsSet.TFLITE_BUILTINS
    ops = {builtin}
    if options.quantize == "dynamic":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif options.quantize == "float16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif options.quantize == "int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = representative
        # Integer-only kernels: conversion fails instead of silently keeping float ops.
        ops = {tf.lite.OpsSet.TFLITE_BUILTINS_INT8}
        if options.io_dtype != "float32":
            dtype = tf.uint8 if options.io_dtype == "uint8" else tf.int8
            converter.inference_input_type = dtype
            converter.inference_output_type = dtype
    if options.allow_tf_ops:
        ops = ops | {builtin, tf.lite.OpsSet.SELECT_TF_OPS}
    converter.target_spec.supported_ops = ops
