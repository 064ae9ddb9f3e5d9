"""Edge deployment: SavedModel / Keras model -> TFLite with the quantization the user picks,
and a report of what each choice costs (size, LiteRT latency, accuracy / agreement).

Modules, one job each:
    source       SRC string -> version dir; atomic writes of .tflite files and versions
    signature    the signature's inputs/outputs, read from saved_model.pb
    data         representative / evaluation data (.npz or 'digits'), checked up front
    modes        none / dynamic / float16 / int8 -> converter settings
    converter    the TFLite converter, TF1 session fallback, clear op errors
    keras_source tf_keras models as sources (needed by QAT)
    keras3_source Keras 3 models as sources, through the SavedModel Keras 3 exports
    qat          quantization-aware fine-tuning (tensorflow-model-optimization)
    runtime      running the original and the flatbuffer (LiteRT)
    report       size, latency, accuracy; table and JSON
    pipeline     the above joined: prepare, compare, qat_convert
    cli          ``modelyard convert``

Python use::

    from modelyard.edge import prepare, compare, ConvertOptions
    prepared = prepare("models/my_mnist_model", representative="digits")
    tflite_bytes = prepared.convert(ConvertOptions("int8", io_dtype="uint8"))
    for row in compare(prepared): print(row)

May import: ``modelyard.model`` (signatures, runtime, tflite), ``modelyard.web`` (``--to web``
writes a site around the flatbuffer), ``modelyard.datasets``. Never ``serving`` or ``training``.
"""
from __future__ import annotations

from modelyard.edge.modes import ConvertOptions


def __getattr__(name: str):
    # The pipeline imports TensorFlow-heavy modules; load it only when asked for. ConvertError
    # too: model.tflite loads TensorFlow, and `modelyard` imports this package to build its parser.
    if name == "ConvertError":
        from modelyard.model.tflite import ConvertError

        return ConvertError
    if name in ("prepare", "compare", "qat_convert"):
        from modelyard.edge import pipeline

        return getattr(pipeline, name)
    raise AttributeError(name)


__all__ = ["ConvertError", "ConvertOptions", "prepare", "compare", "qat_convert"]
