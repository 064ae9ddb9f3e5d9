"""A SavedModel signature (or a Keras model) -> TFLite flatbuffer bytes, with clear errors.

TF2 exports go through ``TFLiteConverter.from_saved_model``. TF1 exports (no TF2
object graph, often reference variables, like TF Serving's half_plus_two) fail there,
so they are loaded into a ``tf.compat.v1`` session and converted from it, which
freezes the variables into constants first. The caller's ``configure`` sets the
converter's options (quantization lives in ``modelyard.edge``); with none, the model
converts as float32, which is what the server's ``auto`` runtime uses.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable

from modelyard.model.savedmodel import SERVE_TAG, is_tf1_export
from modelyard.model.signatures import Signature

# ``configure(converter, is_tf1)``: set optimizations, op sets and representative data.
Configure = Callable[[object, bool], None]

# "tf.MatrixDeterminant(tensor<...>)" lines in the converter's unsupported-ops report.
_TF_OP = re.compile(r"\btf\.([A-Z][A-Za-z0-9_]*)\b")
_UNSUPPORTED_MARKERS = ("not supported by the native TFLite runtime", "ops that can be supported by the flex")


class ConvertError(Exception):
    """The model cannot be converted (or its data cannot be used); the message says what to do."""


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


def run_converter(converter, allow_tf_ops: bool = False, int8: bool = False, hold_native_stderr: bool = True) -> bytes:
    """``converter.convert()``, its many exception types turned into one ConvertError that says what to do."""
    try:
        with warnings.catch_warnings(), (_native_stderr_captured() if hold_native_stderr else contextlib.nullcontext()):
            # "Statistics for quantized inputs were expected": raised for inputs that are
            # already integer (uint8 pixels), which need no statistics.
            warnings.filterwarnings("ignore", message="Statistics for quantized inputs")
            return converter.convert()
    except Exception as exc:  # the converter raises several unrelated types (ConverterError, ValueError...)
        message = str(exc)
        ops = _unsupported_ops(message)
        if ops and any(marker in message for marker in _UNSUPPORTED_MARKERS) and not allow_tf_ops:
            raise ConvertError(
                f"the model uses ops the builtin TFLite op set lacks: {', '.join(ops)}. "
                "Re-run with --allow-tf-ops to embed them as TensorFlow (Flex) ops; the result "
                "then needs a LiteRT build with the Flex delegate."
            ) from exc
        if ops and int8:
            raise ConvertError(
                f"full-integer quantization has no int8 kernel for: {', '.join(ops)}; "
                "try --quantize dynamic or float16"
            ) from exc
        lines = message.strip().splitlines() or [type(exc).__name__]
        detail = "\n".join(lines[:20]) + ("\n..." if len(lines) > 20 else "")
        raise ConvertError(f"TFLite conversion failed: {detail}") from exc


def convert_saved_model(
    version_dir: Path, signature: Signature, configure: Configure | None = None, *,
    allow_tf_ops: bool = False, int8: bool = False, hold_native_stderr: bool = True,
) -> bytes:
    """Convert ``signature`` of the SavedModel at ``version_dir``.

    ``hold_native_stderr=False`` leaves fd 2 alone: a multi-threaded process (the server)
    must not lose other threads' output while the converter runs.
    """
    import tensorflow as tf

    if not is_tf1_export(version_dir):
        converter = tf.lite.TFLiteConverter.from_saved_model(str(version_dir), signature_keys=[signature.name])
        if configure:
            configure(converter, False)
        return run_converter(converter, allow_tf_ops, int8, hold_native_stderr)
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        tf.compat.v1.saved_model.loader.load(session, [SERVE_TAG], str(version_dir))
        inputs = [graph.get_tensor_by_name(spec.tensor_name) for spec in signature.inputs.values()]
        outputs = [graph.get_tensor_by_name(spec.tensor_name) for spec in signature.outputs.values()]
        converter = tf.compat.v1.lite.TFLiteConverter.from_session(session, inputs, outputs)
        if configure:
            configure(converter, True)
        return run_converter(converter, allow_tf_ops, int8, hold_native_stderr)
