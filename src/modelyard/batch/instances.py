"""Instance shaping (Vertex AI's instanceConfig) and instances -> input arrays for a signature.

Shaping: ``key_field`` is taken out and carried to the output as ``key``; ``included_fields`` /
``excluded_fields`` select fields of object instances; ``instance_type`` makes the model see an
object or an array (fields in included order, else in the instance's order). Conversion
follows TF Serving's row format: an object names the model's inputs, anything else is the
single input's value; ``{"b64": ...}`` is bytes.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelyard.errors import invalid_argument
from modelyard.model import dtypes
from modelyard.model.signatures import Signature


@dataclass(frozen=True)
class Shaping:
    key_field: str | None = None
    included_fields: tuple[str, ...] = ()
    excluded_fields: tuple[str, ...] = ()
    instance_type: str | None = None  # "object", "array" or None (as read)

    @property
    def identity(self) -> bool:
        return not (self.key_field or self.included_fields or self.excluded_fields or self.instance_type)


def shape(instance: Any, rule: Shaping) -> tuple[Any, Any]:
    """``(key, instance for the model)``; raises ServingError(INVALID_ARGUMENT) when the rule cannot apply."""
    if rule.identity:
        return None, instance
    key = None
    if isinstance(instance, dict):
        fields = dict(instance)
        if rule.key_field is not None:
            if rule.key_field not in fields:
                raise invalid_argument(f"instance has no key field {rule.key_field!r}")
            key = fields.pop(rule.key_field)
        if rule.included_fields:
            missing = [f for f in rule.included_fields if f not in fields]
            if missing:
                raise invalid_argument(f"instance has no field {missing[0]!r} (included_fields)")
            fields = {f: fields[f] for f in rule.included_fields}
        for name in rule.excluded_fields:
            fields.pop(name, None)
        return key, list(fields.values()) if rule.instance_type == "array" else fields
    if isinstance(instance, list):
        if rule.key_field is not None or rule.included_fields or rule.excluded_fields:
            raise invalid_argument("key_field, included_fields and excluded_fields need object instances, got an array")
        if rule.instance_type == "object":
            raise invalid_argument("instance_type object needs object instances (or CSV rows), got an array")
        return None, instance
    if rule.key_field is not None:
        raise invalid_argument(f"key_field {rule.key_field!r} needs object instances, got {type(instance).__name__}")
    return None, instance


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def _named(instance: Any, sig: Signature) -> dict[str, Any]:
    if isinstance(instance, dict) and not _is_b64(instance):
        if set(instance) != set(sig.inputs):
            raise invalid_argument(
                f"instance fields {{{','.join(sorted(instance))}}} do not match the model's inputs "
                f"{{{','.join(sorted(sig.inputs))}}}"
            )
        return instance
    if len(sig.inputs) != 1:
        raise invalid_argument(
            f"the model has {len(sig.inputs)} inputs {{{','.join(sorted(sig.inputs))}}}: each instance must be an "
            "object naming them"
        )
    return {next(iter(sig.inputs)): instance}


def _bytes_of(value: Any) -> Any:
    if _is_b64(value):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (ValueError, TypeError) as exc:
            raise invalid_argument(f"invalid base64 in {{'b64': ...}}: {exc}") from None
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, list):
        return [_bytes_of(v) for v in value]
    if isinstance(value, bytes):
        return value
    raise invalid_argument(f"expected a string or {{'b64': ...}} for a string input, got {value!r}")


def to_arrays(instances: list[Any], sig: Signature, integral: bool = False) -> dict[str, np.ndarray]:
    """Stack a batch of model instances into one array per input, checked against the signature.

    Numbers become the input's dtype by ``dtypes.json_array``, the rule serving uses (``integral``:
    its ``vertex`` rule): a value out of an integer input's range is refused in serving's words."""
    named = [_named(inst, sig) for inst in instances]
    arrays = {}
    for alias, spec in sig.inputs.items():
        values = [inst[alias] for inst in named]
        target = spec.numpy_dtype
        if target.kind == "O":
            data = [_bytes_of(v) for v in values]
            arr = np.empty(len(data), dtype=object)
            arr[:] = data
            if data and isinstance(data[0], list):
                try:
                    arr = np.array(data, dtype=object)
                except ValueError as exc:
                    raise invalid_argument(f"input {alias}: {exc}") from None
        else:
            if any(_is_b64(v) for v in values):
                raise invalid_argument(f"input {alias} is {target.name}: {{'b64': ...}} is only for string inputs")
            try:
                inferred = np.asarray(values)
            except ValueError as exc:  # ragged nesting
                raise invalid_argument(f"input {alias}: instances of different shapes ({exc})") from None
            try:
                dtypes.check_json_kind(inferred, spec.dtype, integral)
                if inferred.dtype.kind == "O":
                    raise invalid_argument(f"input {alias}: values are not all numbers")
                arr = dtypes.json_array(inferred, spec.dtype, alias, integral)
            except ValueError as exc:  # dtypes' ValueKindError / ValueRangeError
                raise invalid_argument(str(exc)) from None
        # Serving's shape rule and message; any number of rows (a job splits its batches as it likes).
        mismatch = spec.shape_mismatch(arr.shape, any_batch=True)
        if mismatch is not None:
            raise invalid_argument(mismatch)
        arrays[alias] = arr
    return arrays
