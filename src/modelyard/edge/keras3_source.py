"""Keras 3 models as conversion sources: exported to a temporary SavedModel first.

Keras 3 (the ``keras`` package, TensorFlow 2.21's default Keras) writes ``.keras`` files
that tf_keras cannot read, and modelyard makes ``tf.keras`` mean tf_keras. So a Keras 3
file is loaded with the ``keras`` package itself and exported with Keras 3's own
SavedModel exporter (``model.export``, the path Keras documents for TFLite); the
conversion then reads that SavedModel like any other. The temporary directory lives as
long as the returned handle.
"""
from __future__ import annotations

import json
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from modelyard.model.tflite import ConvertError


def keras_file_version(path: str | Path) -> str | None:
    """The Keras version a ``.keras`` archive was saved with (its metadata.json), or None."""
    try:
        with zipfile.ZipFile(path) as archive:
            return str(json.loads(archive.read("metadata.json")).get("keras_version")) or None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def is_keras3_file(src: str) -> bool:
    version = keras_file_version(src) if Path(src).suffix.lower() == ".keras" else None
    return bool(version and version.split(".")[0].isdigit() and int(version.split(".")[0]) >= 3)


def is_keras3_model(model: object) -> bool:
    return type(model).__module__.startswith("keras.")


@dataclass
class ExportedKeras3:
    """A Keras 3 model written as a SavedModel in a temporary directory (removed with this object)."""

    model: object
    saved_model_dir: Path
    _tmp: tempfile.TemporaryDirectory


def load_keras3_file(src: str):
    """Load a Keras 3 ``.keras`` file with the ``keras`` package (compile=False)."""
    try:
        import keras
    except ImportError as exc:
        raise ConvertError(f"{src} was saved by Keras 3: install it (pip install 'keras>=3') to convert it") from exc
    if not keras.__version__.startswith("3."):
        raise ConvertError(f"{src} was saved by Keras 3 but the installed keras is {keras.__version__}")
    try:
        return keras.saving.load_model(src, compile=False)
    except Exception as exc:  # load_model raises ValueError, TypeError... for files it cannot rebuild
        raise ConvertError(f"{src} is not a loadable Keras 3 model: {exc}") from exc


def export_keras3(model: object, description: str) -> ExportedKeras3:
    """Write ``model`` (Keras 3) as a SavedModel with a ``serving_default`` signature."""
    tmp = tempfile.TemporaryDirectory(prefix="modelyard-keras3-")
    target = Path(tmp.name) / "saved_model"
    try:
        model.export(str(target), format="tf_saved_model", verbose=False)
    except Exception as exc:
        tmp.cleanup()
        raise ConvertError(f"{description}: Keras 3 could not export it as a SavedModel: {exc}") from exc
    return ExportedKeras3(model, target, tmp)
