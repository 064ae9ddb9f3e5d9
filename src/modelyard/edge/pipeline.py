"""One conversion end to end: resolve SRC, check data, convert, measure; ``compare`` across modes.

A source is either a SavedModel (a version dir, base path or ``BASE:VERSION``), a
tf_keras model (file or in memory, needed for QAT), or a Keras 3 model (file or in
memory), converted through the SavedModel Keras 3 exports. Every check that can fail
(source, signature, data shapes, option combinations) runs before the converter
does, and nothing is written here: callers write the bytes once all succeeded.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from modelyard.edge.converter import convert_keras_model, convert_saved_model
from modelyard.edge.data import BUILTIN_DIGITS, Dataset, load_dataset, synthetic_dataset
from modelyard.model.tflite import ConvertError
from modelyard.edge.keras3_source import export_keras3, is_keras3_file, is_keras3_model, load_keras3_file
from modelyard.edge.keras_source import is_keras_file, keras_signature, load_keras_model, run_keras
from modelyard.edge.modes import MODES, ConvertOptions
from modelyard.edge.report import ModeReport, Reference, measure
from modelyard.edge.runtime import run_saved_model
from modelyard.model.savedmodel import SavedModelError
from modelyard.model.signatures import DEFAULT_SIGNATURE, Signature, read_signature
from modelyard.edge.source import resolve_version_dir


@dataclass
class Prepared:
    """A resolved source with its signature and data, ready to convert in any mode."""

    description: str
    signature: Signature
    representative: Dataset | None
    reference: Reference | None
    _convert: Callable[[ConvertOptions, Dataset | None], bytes]
    keras_model: object | None = None  # set for Keras sources (QAT needs it)

    def convert(self, options: ConvertOptions) -> bytes:
        return self._convert(options, self.representative)

    def measure(self, content: bytes, options: ConvertOptions, float_size: int | None = None) -> ModeReport:
        if self.reference is None:
            raise ConvertError("no evaluation data prepared")
        try:
            return measure(
                content, self.reference, options.quantize, options.io_dtype, float_size,
                input_order=list(self.signature.inputs), output_order=list(self.signature.outputs),
            )
        except RuntimeError as exc:
            if "Select TensorFlow op" in str(exc) or "Flex" in str(exc):
                raise NotMeasurable(
                    "the model contains TF (Flex) ops, which the installed LiteRT cannot run "
                    "(no Flex delegate in the ai-edge-litert wheel): size only, no latency or accuracy"
                ) from exc
            raise


class NotMeasurable(ConvertError):
    """The flatbuffer is valid but cannot run in this process's LiteRT."""


def _eval_data(signature: Signature, representative: str | None, eval_data: str | None) -> Dataset:
    if eval_data:
        return load_dataset(eval_data, signature, split="test")
    if representative == BUILTIN_DIGITS:
        return load_dataset(BUILTIN_DIGITS, signature, split="test")  # held out from calibration
    return synthetic_dataset(signature)


def prepare(
    src: str | object,
    representative: str | None = None,
    eval_data: str | None = None,
    signature_name: str = DEFAULT_SIGNATURE,
    with_report: bool = True,
) -> Prepared:
    """Resolve ``src`` (path string or live tf_keras model), load and check data, run the original.

    ``representative`` calibrates int8 (and is the training data for QAT); ``eval_data``
    is the held-out set of the report (default: the digits test split when calibrating
    on ``digits``, else random inputs that only measure agreement).
    """
    keras3 = None
    if isinstance(src, str) and is_keras3_file(src):
        keras3 = export_keras3(load_keras3_file(src), src)
    elif is_keras3_model(src):
        keras3 = export_keras3(src, f"keras model {src.name}")
    if keras3 is not None:
        # Converted from the SavedModel Keras 3 exports; the closures below keep its directory alive.
        model = None
        version_dir = keras3.saved_model_dir
        try:
            signature = read_signature(version_dir, DEFAULT_SIGNATURE)
        except SavedModelError as exc:
            raise ConvertError(f"{src}: the SavedModel Keras 3 exported has no usable signature: {exc}") from exc
        description = src if isinstance(src, str) else f"keras model {src.name}"
        run = lambda inputs, _keep=keras3: run_saved_model(version_dir, signature, inputs)
        convert_fn = lambda options, data, _keep=keras3: convert_saved_model(version_dir, signature, options, data)
    elif not isinstance(src, str) or is_keras_file(src):
        model = load_keras_model(src) if isinstance(src, str) else src
        signature = keras_signature(model)
        description = src if isinstance(src, str) else f"keras model {model.name}"
        run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] = lambda inputs: run_keras(model, inputs)
        convert_fn = lambda options, data: convert_keras_model(model, options, data)
    else:
        model = None
        version_dir: Path = resolve_version_dir(src)
        try:
            signature = read_signature(version_dir, signature_name)
        except SavedModelError as exc:
            raise ConvertError(str(exc)) from exc
        description = str(version_dir)
        run = lambda inputs: run_saved_model(version_dir, signature, inputs)
        convert_fn = lambda options, data: convert_saved_model(version_dir, signature, options, data)
    rep = load_dataset(representative, signature, split="train") if representative else None
    reference = None
    if with_report:
        data = _eval_data(signature, representative, eval_data)
        reference = Reference(run(data.inputs), data)
    return Prepared(description, signature, rep, reference, convert_fn, model)


def compare(prepared: Prepared, io_dtype: str = "uint8", allow_tf_ops: bool = False) -> list[ModeReport]:
    """Convert in every mode (int8 only when representative data is there) and measure each."""
    reports: list[ModeReport] = []
    float_size = None
    for mode in MODES:
        if mode == "int8" and prepared.representative is None:
            continue
        options = ConvertOptions(mode, io_dtype if mode == "int8" else "float32", allow_tf_ops)
        content = prepared.convert(options)
        float_size = float_size or len(content)  # "none" runs first
        reports.append(prepared.measure(content, options, float_size))
    return reports


def qat_convert(prepared: Prepared, epochs: int, io_dtype: str = "float32") -> tuple[object, bytes]:
    """Fine-tune ``prepared``'s Keras model with fake-quantization, then convert to int8.

    The representative data is the training set; the returned model is the QAT model.
    """
    from modelyard.edge.qat import quantize_aware_finetune

    if prepared.keras_model is None:
        raise ConvertError(
            "--qat needs a tf_keras model file (.keras or .h5, written by model.save): SavedModels "
            "written by tf.saved_model.save / modelyard.export no longer hold the Keras layers to fine-tune, "
            "and Keras 3 models cannot be fine-tuned by tensorflow-model-optimization (it needs tf_keras)"
        )
    if prepared.representative is None:
        raise ConvertError("--qat needs labelled training data: pass --representative-data FILE.npz (with 'labels') or 'digits'")
    options = ConvertOptions("int8", io_dtype)
    options.check(True)
    qat_model = quantize_aware_finetune(prepared.keras_model, prepared.representative, epochs)
    return qat_model, convert_keras_model(qat_model, options, prepared.representative)
