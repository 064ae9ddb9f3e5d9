"""SavedModel (or Keras model) -> TFLite flatbuffer bytes, with clear errors.

TF2 exports go through ``TFLiteConverter.from_saved_model``. TF1 exports (no TF2
object graph, often reference variables, like TF Serving's half_plus_two) fail there,
so they are loaded into a ``tf.compat.v1`` session and converted from it, which
freezes the variables into constants first.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path

from modelyard.edge.data import Dataset, representative_batches
from modelyard.edge.errors import ConvertError
from modelyard.edge.modes import ConvertOptions, configure
from modelyard.edge.signature import SignatureSpec

# "tf.MatrixDeterminant(tensor<...>)" lines in the converter's unsupported-ops report.
_TF_OP = re.compile(r"\btf\.([A-Z][A-Za-z0-9_]*)\b")
_UNSUPPORTED_MARKERS = ("not supported by the native TFLite runtime", "ops that can be supported by the flex")


def _unsupported_ops(message: str) -> list[str]:
    return sorted(set(_TF_OP.findall(message)))


@contextlib.contextmanager
def _native_stderr_captured():
    """Hold back what the converter's C++ side prints to fd 2 (MLIR diagnostics, quantizer
    notes): the exception message carries the same facts, and ConvertError says them plainly."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield  # no real fd (e.g. an embedding host): leave output alone
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            os.dup2(saved, fd)
            os.close(saved)


def _run(converter, options: ConvertOptions, hold_native_stderr: bool = True) -> bytes:
    try:
        with warnings.catch_warnings(), (_native_stderr_captured() if hold_native_stderr else contextlib.nullcontext()):
            # "Statistics for quantized inputs were expected": raised for inputs that are
            # already integer (uint8 pixels), which need no statistics.
            warnings.filterwarnings("ignore", message="Statistics for quantized inputs")
            return converter.convert()
    except Exception as exc:  # the converter raises several unrelated types (ConverterError, ValueError...)
        message = str(exc)
        ops = _unsupported_ops(message)
        if ops and any(marker in message for marker in _UNSUPPORTED_MARKERS) and not options.allow_tf_ops:
            raise ConvertError(
                f"the model uses ops the builtin TFLite op set lacks: {', '.join(ops)}. "
                "Re-run with --allow-tf-ops to embed them as TensorFlow (Flex) ops; the result "
                "then needs a LiteRT build with the Flex delegate."
            ) from exc
        if ops and options.quantize == "int8":
            raise ConvertError(
                f"full-integer quantization has no int8 kernel for: {', '.join(ops)}; "
                "try --quantize dynamic or float16"
            ) from exc
        lines = message.strip().splitlines() or [type(exc).__name__]
        detail = "\n".join(lines[:20]) + ("\n..." if len(lines) > 20 else "")
        raise ConvertError(f"TFLite conversion failed: {detail}") from exc


def _representative(data: Dataset | None, order: list[str], as_dict: bool):
    if data is None:
        return None
    return lambda: representative_batches(data, order, as_dict)


def _convert_tf1(
    version_dir: Path, signature: SignatureSpec, options: ConvertOptions, data: Dataset | None, hold_native_stderr: bool
) -> bytes:
    import tensorflow as tf

    order = list(signature.inputs)
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        tf.compat.v1.saved_model.loader.load(session, ["serve"], str(version_dir))
        inputs = [graph.get_tensor_by_name(signature.inputs[a].tensor_name) for a in order]
        outputs = [graph.get_tensor_by_name(s.tensor_name) for s in signature.outputs.values()]
        converter = tf.compat.v1.lite.TFLiteConverter.from_session(session, inputs, outputs)
        configure(converter, options, _representative(data, order, as_dict=False))
        return _run(converter, options, hold_native_stderr)


def convert_saved_model(
    version_dir: Path, signature: SignatureSpec, options: ConvertOptions, data: Dataset | None = None,
    hold_native_stderr: bool = True,
) -> bytes:
    """Convert ``signature`` of the SavedModel at ``version_dir``; ``data`` calibrates int8.

    ``hold_native_stderr=False`` leaves fd 2 alone: a multi-threaded process (the server)
    must not lose other threads' output while the converter runs.
    """
    import tensorflow as tf

    options.check(data is not None)
    if signature.is_tf1:
        return _convert_tf1(version_dir, signature, options, data, hold_native_stderr)
    converter = tf.lite.TFLiteConverter.from_saved_model(str(version_dir), signature_keys=[signature.name])
    order = list(signature.inputs)
    configure(converter, options, _representative(data, order, as_dict=len(order) > 1))
    return _run(converter, options, hold_native_stderr)


def convert_keras_model(model, options: ConvertOptions, data: Dataset | None = None) -> bytes:
    """Convert an in-memory tf_keras model (used after quantization-aware training)."""
    import tensorflow as tf

    options.check(data is not None)
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    order = list(data.inputs) if data is not None else []
    configure(converter, options, _representative(data, order, as_dict=False))
    return _run(converter, options)
