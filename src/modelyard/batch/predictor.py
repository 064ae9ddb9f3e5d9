"""One loaded model version predicting batches of instances, with bad rows isolated.

The model is loaded through ``modelyard.model.runtime``, the same way the server loads
it: a ``model.tflite`` version runs on LiteRT; a SavedModel runs through a TF session, or
LiteRT where ``choose_runtime`` verified that LiteRT gives TensorFlow's numbers.

The bad-row rule lives here: a batch the model refuses is split in halves, recursively,
until each refused row is alone; only that row gets an error, every other row its prediction.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import orjson

from modelyard.batch.fastjson import DenseParser
from modelyard.batch.instances import to_arrays
from modelyard.errors import Code, ServingError

_NUMPY = orjson.OPT_SERIALIZE_NUMPY
# Output dtypes dumped as one array (numbers only, so the array splits at its commas).
_WHOLE_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                                            np.uint8, np.uint16, np.uint32, np.uint64))


class RowFailure(NamedTuple):
    """A row the model refused: its canonical status name and message."""

    code: str
    message: str


def load_servable(version_dir: Path, runtime: str = "auto", signature_name: str = "serving_default"):
    """The servable the server would load for ``version_dir`` under ``--runtime``: for a SavedModel
    whose ``signature_name`` LiteRT was verified on before (``litert_cache``), that conversion,
    without importing TensorFlow unless LiteRT refuses a batch."""
    from modelyard.model.savedmodel import TFLITE_FILE

    if (version_dir / TFLITE_FILE).is_file():
        from modelyard.model.runtime.litert import load_tflite

        return load_tflite(version_dir, version_dir / TFLITE_FILE)
    from modelyard.model.runtime import estimators
    from modelyard.model.savedmodel import SAVED_MODEL_FILES

    if not any((version_dir / name).is_file() for name in SAVED_MODEL_FILES) and estimators.model_file(version_dir):
        return estimators.load_estimator(version_dir)  # scikit-learn / XGBoost, as the server loads them
    key = None
    if runtime != "tensorflow":
        from modelyard.model.runtime import litert_cache
        from modelyard.model.runtime.litert_first import LiteRTFirstServable

        key = litert_cache.key_of(version_dir)  # hashed once: a miss hands it to choose_runtime
        cached = litert_cache.load(version_dir, signature_name, key) if key else None
        if cached is not None:
            return LiteRTFirstServable.of_entry(version_dir, *cached)
    from modelyard.model.runtime.choose_runtime import choose_runtime
    from modelyard.model.runtime.tf_session import load_saved_model

    session = load_saved_model(version_dir)
    try:
        return choose_runtime(session, runtime, key)
    except BaseException:
        session.close()
        raise


def _jsonable(value: Any) -> Any:
    """Output values orjson cannot take directly (bytes, object arrays) as JSON values."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "OSU":
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            import base64

            return {"b64": base64.b64encode(value).decode("ascii")}
    return value


class Predictor:
    """``predict(instances)`` -> one JSON prediction (bytes) or RowFailure per instance."""

    def __init__(self, servable, signature_name: str = "serving_default", json_numbers: str = "tf_serving"):
        from modelyard.model import dtypes
        from modelyard.model.runtime.inference import predict_signature

        self.servable = servable
        self.signature = predict_signature(servable, signature_name)
        self.aliases = tuple(self.signature.outputs)
        self.runtime = getattr(servable, "runtime", "unknown")
        # How JSON numbers meet integer inputs (dtypes.JSON_NUMBER_RULES), as in `modelyard serve`.
        self.integral = dtypes.integral_numbers(json_numbers)
        self.dense = DenseParser.for_signature(self.signature, self.integral)

    def predict_dense(self, lines: list[bytes]) -> list[bytes] | None:
        """The fast path for raw JSON lines (see fastjson); None: take the general path instead."""
        arrays = self.dense.parse(lines) if self.dense else None
        if arrays is None:
            return None
        try:
            return self._encode(self.servable.run(self.signature, arrays, self.aliases), len(lines))
        except ServingError:
            return None

    def predict(self, instances: list[Any]) -> list[bytes | RowFailure]:
        try:
            return self._run(instances)
        except (ServingError, ValueError, TypeError, OverflowError) as exc:
            if len(instances) == 1:
                code = exc.code.name if isinstance(exc, ServingError) else Code.INVALID_ARGUMENT.name
                message = exc.message if isinstance(exc, ServingError) else str(exc)
                return [RowFailure(code, message)]
        half = len(instances) // 2
        return self.predict(instances[:half]) + self.predict(instances[half:])

    def _run(self, instances: list[Any]) -> list[bytes]:
        from modelyard.model.runtime.inference import shape_failure

        arrays = to_arrays(instances, self.signature, self.integral)
        try:
            outputs = self.servable.run(self.signature, arrays, self.aliases)
        except ServingError as exc:  # a row's error reads as `modelyard serve` answers it
            raise shape_failure(self.signature, arrays, exc) from None
        return self._encode(outputs, len(instances))

    def encode_batch(self, outputs: dict[str, np.ndarray], n: int) -> bytes | list[bytes]:
        """``_encode``'s predictions, as one JSON array of the ``n`` rows where that is quicker.

        One numeric output is dumped whole (orjson writes each row as it would alone; tested)
        and the caller splits it at its top-level commas; anything else gets ``_encode``'s list.
        """
        if len(self.aliases) == 1:
            (value,) = outputs.values()
            if (value.ndim >= 1 and value.shape[0] == n and value.dtype in _WHOLE_DTYPES
                    and value.flags.c_contiguous):
                return orjson.dumps(value, option=_NUMPY)
        return self._encode(outputs, n)

    def _encode(self, outputs: dict[str, np.ndarray], n: int) -> list[bytes]:
        for alias, value in outputs.items():
            if value.ndim == 0 or value.shape[0] != n:
                raise ServingError(Code.INTERNAL, f"output {alias} has shape {list(value.shape)}, expected a batch of {n}")
        dumps = orjson.dumps
        if len(self.aliases) == 1:
            (value,) = outputs.values()
            if value.dtype.kind in "OSU":
                return [dumps(_jsonable(row)) for row in value]
            return [dumps(row, option=_NUMPY) for row in value]
        lines = []
        for i in range(n):
            row = {a: outputs[a][i] for a in self.aliases}
            if any(v.dtype.kind in "OSU" for v in outputs.values()):
                row = {a: _jsonable(v) for a, v in row.items()}
            lines.append(dumps(row, option=_NUMPY))
        return lines
