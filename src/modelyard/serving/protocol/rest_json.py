"""TF Serving's REST JSON: request bodies to NumPy inputs, results to TF Serving's exact JSON.

Dtypes always come from the signature, never from the data. NaN and Infinity are
accepted and written as bare literals, as TF Serving does.
"""
from __future__ import annotations

import base64
import binascii
import json
from typing import NamedTuple

import numpy as np
import orjson

from modelyard.errors import Code, ServingError, invalid_argument, quote_json
from modelyard.model import dtypes

try:
    from modelyard.serving.protocol import _numjson
except ImportError:  # built without a C compiler (the extension is optional): the general parser reads every body
    _numjson = None
from modelyard.model.signatures import Signature, TensorSpec

_NUMPY_OPT = orjson.OPT_SERIALIZE_NUMPY

# Python's json messages -> rapidjson's, which TF Serving clients may match on.
_PARSE_MESSAGES = {
    "Expecting value": "Invalid value.",
    "Expecting property name enclosed in double quotes": "Missing a name for object member.",
    "Expecting ':' delimiter": "Missing a colon after a name of object member.",
    "Extra data": "The document root must not be followed by other values.",
    "Unterminated string starting at": "Missing a closing quotation mark in string.",
    "Invalid control character at": "Invalid encoding in string.",
}


# ---- parsing ----------------------------------------------------------------------------------
_MAX_DEPTH = 1024  # orjson's nesting limit; the standard library's fallback stops at the recursion limit
def loads(body: bytes):
    if not body.strip():
        raise invalid_argument("JSON Parse error: The document is empty")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:  # the standard library accepts NaN / Infinity / -Infinity, which orjson refuses
        return json.loads(body)
    except RecursionError:  # found by fuzzing: 100k nested '[' answered 500
        raise invalid_argument(f"JSON Parse error: nesting deeper than {_MAX_DEPTH} levels") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        msg = getattr(exc, "msg", "Invalid encoding")
        pos = getattr(exc, "pos", 0)
        if msg == "Expecting ',' delimiter":
            closer = "}" if _innermost_open(body, pos) == "{" else "]"
            text = f"Missing a comma or '{closer}' after an {'object member' if closer == '}' else 'array element'}."
        else:
            text = _PARSE_MESSAGES.get(msg, msg + ".")
        raise invalid_argument(f"JSON Parse error: {text} at offset: {pos}") from None


def _innermost_open(body: bytes, pos: int) -> str:
    depth: list[str] = []
    in_string = escaped = False
    for ch in body[:pos].decode("utf-8", "replace"):
        if in_string:
            escaped = not escaped and ch == "\\"
            in_string = escaped or ch != '"'
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth.append(ch)
        elif ch in "]}" and depth:
            depth.pop()
    return depth[-1] if depth else "["


def _dump(value) -> str:
    return quote_json(value)


def _json_type(value) -> str:
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return "Number"
    if isinstance(value, str):
        return "String"
    return "Object" if isinstance(value, dict) else "Array"


def _is_b64(value) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def _leaves(value):
    if isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def _fits(value, dtype: np.dtype, integral: bool = False) -> bool:
    if _is_b64(value):
        return dtype.kind == "O"
    return dtypes.json_value_fits(value, dtype, integral)


def _type_error(value, spec: TensorSpec) -> ServingError:
    return invalid_argument(
        f"JSON Value: {_dump(value)} Type: {_json_type(value)} is not of expected type: "
        f"{dtypes.dtype_name(spec.dtype)[3:].lower()}{dtypes.sending_hint(spec.dtype)}"
    )


def _shape_error(value) -> ServingError:
    """TF Serving's message for a ragged list: the first place where sizes or depths disagree."""
    shape = []
    probe = value
    while isinstance(probe, list):
        shape.append(len(probe))
        probe = probe[0] if probe else None

    def walk(node, level):
        if isinstance(node, list):
            if level >= len(shape):
                return f"Encountered list at unexpected level: {level} expected < {len(shape)}"
            if len(node) != shape[level]:
                return (
                    f"Encountered list at unexpected size: {len(node)} at level: {level} "
                    f"expected size: {shape[level]}"
                )
            for child in node:
                found = walk(child, level + 1)
                if found:
                    return found
        elif level != len(shape):
            return (
                f"JSON Value: {_dump(node)} found at incorrect level: {level + 1} in the JSON DOM. "
                f"Expected at level: {len(shape)}"
            )
        return None

    return invalid_argument(walk(value, 0) or "Ragged or uneven lists cannot form a tensor")


class NumericTensor(NamedTuple):
    """The tensor of an all-numbers predict body, read by the C reader (``_numjson``)."""

    values: np.ndarray  # the body's shape: int64, or float64 when a number had a fraction or exponent
    lo: int  # the values' extremes (of float64 ones when integral): the range check needs no pass over them
    hi: int
    body: bytes  # for the general parser, when the signature needs more than this one tensor
    integral: bool = True  # every value is whole (and within 2^53, so exact as int64)

    def as_input(self, sig: Signature, integral: bool = False) -> dict[str, np.ndarray] | None:
        """The signature's inputs when it takes one numeric tensor these values fit; else None.

        None sends the request to the general path, which answers exactly as it would have
        (the errors, and TF Serving's element-by-element wording, live there only).
        ``integral``: the ``vertex`` rule of ``dtypes`` (``0.0`` is an integer for an integer input).
        """
        if len(sig.inputs) != 1:
            return None
        (spec,) = sig.inputs.values()
        dtype = spec.numpy_dtype
        if dtype.kind not in "iufc":
            return None
        if dtype.kind in "iu":
            # Fractions or exponents for an integer input: by dtypes' rule an error (worded by the
            # general path), except whole numbers under its vertex rule (0.0 -> 0), which C vouched for.
            if self.values.dtype.kind == "f" and not (integral and self.integral):
                return None
            low, high = dtypes.integer_limits(dtype)
            if self.lo < low or self.hi > high:
                return None
        return {spec.alias: self.values.astype(dtype, copy=False)}

    def general(self, key: str):
        """The tensor as the general parser reads it (nested lists)."""
        return loads(self.body)[key]


def read_number_body(body: bytes) -> tuple[str, str, NumericTensor] | None:
    """``parse_predict``'s answer for an all-numbers body, read in one pass in C; else None."""
    if _numjson is None:
        return None
    read = _numjson.read_number_body(body)
    if read is None:
        return None
    key, name, values, shape, lo, hi, floating, integral = read
    array = np.frombuffer(values, np.float64 if floating else np.int64).reshape(shape)
    return name or "", key, NumericTensor(array, lo, hi, body, integral)


def to_array(value, spec: TensorSpec, integral: bool = False) -> np.ndarray:
    """One JSON value (scalar or nested lists) as an array of the signature's dtype, by ``dtypes``' rule
    (``integral``: its ``vertex`` rule)."""
    dtype = spec.numpy_dtype
    if dtype.kind == "O":
        return _string_array(value, spec)
    try:
        inferred = np.asarray(value)
    except ValueError:
        raise _shape_error(value) from None
    if inferred.ndim > _MAX_RANK:
        raise _rank_error(inferred.ndim)
    if inferred.dtype.kind == "O":
        for leaf in _leaves(value):
            if not _fits(leaf, dtype, integral) or isinstance(leaf, list):
                raise _type_error(leaf, spec)
        raise _shape_error(value)
    try:
        return dtypes.json_array(inferred, spec.dtype, spec.alias, integral)
    except dtypes.ValueKindError:
        for leaf in _leaves(value):  # TF Serving names the first value that does not fit
            if not _fits(leaf, dtype, integral):
                raise _type_error(leaf, spec) from None
        raise
    except dtypes.ValueRangeError as exc:
        raise invalid_argument(str(exc)) from None


def _string_array(value, spec: TensorSpec) -> np.ndarray:
    def convert(node):
        if isinstance(node, list):
            return [convert(child) for child in node]
        if isinstance(node, str):
            return node.encode("utf-8")
        if _is_b64(node):
            encoded = node["b64"]
            if not isinstance(encoded, str):
                raise invalid_argument(f"JSON Value: {_dump(node)} not formatted correctly for base64 data")
            try:
                return base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                raise invalid_argument("Unable to base64 decode") from None
        raise _type_error(node, spec)

    converted = convert(value)
    try:
        probe = np.asarray(converted, dtype=object)
        if probe.ndim > _MAX_RANK:
            raise _rank_error(probe.ndim)
        if probe.ndim and any(isinstance(x, list) for x in probe.ravel()):
            raise ValueError
    except ValueError:
        raise _shape_error(value) from None
    return probe


# NumPy's element iterators stop at 32 dimensions; no model takes more (found by fuzzing: a 500).
_MAX_RANK = 32


def _rank_error(rank: int) -> ServingError:
    return invalid_argument(f"Tensor of rank {rank}: at most {_MAX_RANK} dimensions are supported")


def _request_doc(body: bytes) -> tuple[dict, str]:
    """The request's JSON object and its ``signature_name`` ('' when absent), TF Serving's checks."""
    doc = loads(body)
    if not isinstance(doc, dict):
        raise invalid_argument(f"JSON Value: {_dump(doc)} Is not object")
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise invalid_argument(
            f"JSON Value: {_dump(doc)} not formatted correctly. 'signature_name' key must be a string value."
        )
    return doc, name


def parse_predict(body: bytes):
    """Returns ``(signature_name, key, payload)`` with key 'instances' or 'inputs'.

    The payload is a ``NumericTensor`` for an all-numbers body, else the parsed JSON value.
    """
    fast = read_number_body(body)
    if fast is not None:
        return fast
    doc, name = _request_doc(body)
    has_instances, has_inputs = "instances" in doc, "inputs" in doc
    if has_instances and has_inputs:
        raise invalid_argument(
            f"JSON Value: {_dump(doc)} Not formatted correctly expecting only one of 'inputs' or "
            "'instances' keys to exist "
        )
    if not (has_instances or has_inputs):
        raise invalid_argument("Missing 'inputs' or 'instances' key")
    key = "instances" if has_instances else "inputs"
    return name, key, doc[key]


def predict_inputs(key: str, payload, sig: Signature, integral: bool = False) -> dict[str, np.ndarray]:
    """The inputs of a predict body whose tensor key is ``key`` (``parse_predict``'s answer);
    ``integral``: numbers meet integer inputs under ``dtypes``' ``vertex`` rule."""
    if type(payload) is NumericTensor:
        inputs = payload.as_input(sig, integral)
        if inputs is not None:
            return inputs
        payload = payload.general(key)
    try:
        if key == "instances":
            return inputs_from_instances(payload, sig, integral)
        return inputs_from_columns(payload, sig, integral)
    except RecursionError:  # found by fuzzing: lists nested ~1000 deep answered 500
        raise invalid_argument("Tensor nesting too deep: a tensor has at most 64 dimensions") from None


def inputs_from_instances(instances, sig: Signature, integral: bool = False) -> dict[str, np.ndarray]:
    if not isinstance(instances, list):
        raise invalid_argument(f"JSON Value: {_dump({'instances': instances})} Excepting 'instances' to be an list/array")
    if not instances:
        raise invalid_argument(f"JSON Value: {_dump({'instances': instances})} No values in 'instances' array")
    named = isinstance(instances[0], dict) and not _is_b64(instances[0])
    if not named:
        if len(sig.inputs) > 1:
            raise invalid_argument(
                "instances is a plain list, but expecting list of objects as multiple input tensors "
                "required as per tensorinfo_map"
            )
        (spec,) = sig.inputs.values()
        for i, item in enumerate(instances):
            if isinstance(item, dict) and not _is_b64(item):
                raise invalid_argument(f"Expecting value/list but got object at item {i} of input list")
        return {spec.alias: _batch(instances, spec, integral)}
    names = set(sig.inputs)
    for i, item in enumerate(instances):
        if not isinstance(item, dict) or _is_b64(item):
            raise invalid_argument(f"Expecting object but got list at item {i} of input list")
        if set(item) != names:
            extra = sorted(set(item) - names)
            if extra:
                raise invalid_argument(
                    f"Failed to process element: {i} key: {extra[0]} of 'instances' list. Error: "
                    f"INVALID_ARGUMENT: JSON object: does not have named input: {extra[0]}"
                )
            raise invalid_argument(
                f"Failed to process element: {i} of 'instances' list. JSON object: {_dump(item)} "
                f"keys must be equal to: {','.join(sorted(names))}"
            )
    return {alias: _batch([item[alias] for item in instances], spec, integral) for alias, spec in sig.inputs.items()}


def _batch(rows: list, spec: TensorSpec, integral: bool = False) -> np.ndarray:
    try:
        return to_array(rows, spec, integral)
    except ServingError as exc:
        # Name the failing instance as TF Serving does, when one instance alone shows the problem.
        for i, row in enumerate(rows):
            try:
                to_array(row, spec, integral)
            except ServingError as inner:
                raise invalid_argument(
                    f"Failed to process element: {i} of 'instances' list. Error: INVALID_ARGUMENT: {inner.message}"
                ) from None
        first = np.shape(to_array(rows[0], spec, integral))
        for row in rows[1:]:
            shape = np.shape(to_array(row, spec, integral))
            if shape != first:
                raise invalid_argument(
                    f"Expecting shape [{','.join(map(str, first))}] but got: [{','.join(map(str, shape))}]"
                ) from None
        raise exc


def inputs_from_columns(inputs, sig: Signature, integral: bool = False) -> dict[str, np.ndarray]:
    if isinstance(inputs, dict) and not _is_b64(inputs):
        result = {}
        for alias, spec in sig.inputs.items():
            if alias not in inputs:
                raise invalid_argument(f"Missing named input: {alias} in 'inputs' object.")
            result[alias] = to_array(inputs[alias], spec, integral)
        return result
    if len(sig.inputs) > 1:
        raise invalid_argument(
            "inputs is a plain value/list, but expecting an object as multiple input tensors required "
            "as per tensorinfo_map"
        )
    (spec,) = sig.inputs.values()
    return {spec.alias: to_array(inputs, spec, integral)}


# ---- encoding ---------------------------------------------------------------------------------
def _encodable(alias: str, value: np.ndarray):
    """An array in a form orjson writes as TF Serving would."""
    kind = value.dtype.kind
    if kind == "f":
        if value.dtype.itemsize < 4:
            value = value.astype(np.float32)
        if not np.isfinite(value).all():
            return _with_literals(value)
        return value
    if kind in "iub":
        return value
    if kind in "OSU":
        as_b64 = alias.endswith("_bytes")
        return _map_strings(value, as_b64)
    if kind == "V" and value.dtype.name == "bfloat16":  # ml_dtypes reports kind 'V'
        return _encodable(alias, value.astype(np.float32))
    raise invalid_argument(f"Failed to write JSON value for tensor type: {value.dtype.name}")


def _with_literals(value: np.ndarray):
    if value.ndim == 0:
        v = value[()]
        if np.isnan(v):
            return orjson.Fragment(b"NaN")
        if np.isinf(v):
            return orjson.Fragment(b"Infinity" if v > 0 else b"-Infinity")
        return v
    return [_with_literals(row) for row in value]


def _map_strings(value: np.ndarray, as_b64: bool):
    if not isinstance(value, np.ndarray) or value.ndim == 0:  # a 1-D object array's rows are its elements
        item = value[()] if isinstance(value, np.ndarray) else value
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        if as_b64:
            return {"b64": base64.b64encode(data).decode("ascii")}
        return data.decode("utf-8", "replace")
    return [_map_strings(row, as_b64) for row in value]


def predict_body(outputs: dict[str, np.ndarray], row_format: bool) -> bytes:
    if not outputs:
        raise invalid_argument("Cannot convert empty tensor map to JSON")
    if not row_format:
        if len(outputs) == 1:
            ((alias, value),) = outputs.items()
            return orjson.dumps({"outputs": _encodable(alias, value)}, option=_NUMPY_OPT)
        return orjson.dumps({"outputs": {a: _encodable(a, v) for a, v in outputs.items()}}, option=_NUMPY_OPT)
    batch = None
    for alias, value in outputs.items():
        if value.ndim == 0:
            raise invalid_argument(f"Tensor name: {alias} has no shape information ")
        if batch is None:
            batch = value.shape[0]
        elif value.shape[0] != batch:
            raise invalid_argument(
                f"Tensor name: {alias} has inconsistent batch size: {value.shape[0]} expecting: {batch}"
            )
    if len(outputs) == 1:
        ((alias, value),) = outputs.items()
        return orjson.dumps({"predictions": _encodable(alias, value)}, option=_NUMPY_OPT)
    encoded = {a: _encodable(a, v) for a, v in outputs.items()}
    rows = [{a: e[i] for a, e in encoded.items()} for i in range(batch)]
    return orjson.dumps({"predictions": rows}, option=_NUMPY_OPT)


def classify_body(classes, scores, batch: int) -> bytes:
    results = []
    for i in range(batch):
        n = (scores if scores is not None else classes).shape[1]
        row = []
        for j in range(n):
            label = "" if classes is None else _map_strings(classes[i, j : j + 1], False)[0]
            score = 0.0 if scores is None else scores[i, j]
            row.append([label, score])
        results.append(row)
    return orjson.dumps({"results": _finite_or_literal(results)}, option=_NUMPY_OPT)


def regress_body(values: np.ndarray) -> bytes:
    return orjson.dumps({"results": _encodable("outputs", values)}, option=_NUMPY_OPT)


def _finite_or_literal(results):
    for row in results:
        for pair in row:
            if not np.isfinite(pair[1]):
                pair[1] = _with_literals(np.asarray(pair[1]))
    return results


# ---- classify / regress requests ------------------------------------------------------------
def parse_examples(body: bytes, method: str):
    """Returns ``(signature_name, [serialized tf.Example])`` with the context merged in."""
    from modelyard.model.runtime.inference import merge_context

    doc, name = _request_doc(body)
    if "examples" not in doc:
        raise invalid_argument(
            f"JSON Value: {_dump(doc)} When method is {method}, key 'examples' is expected and was not found"
        )
    examples = doc["examples"]
    if not isinstance(examples, list):
        raise invalid_argument(f"JSON Value: {_dump(doc)} Expecting 'examples' value to be an list/array")
    if not examples:
        raise invalid_argument(f"JSON Value: {_dump(doc)} 'examples' value is an empty array")
    serialized = [_example(e).SerializeToString() for e in examples]
    context = doc.get("context")
    return name, merge_context(serialized, _example(context).SerializeToString() if context else None)


def _example(obj):
    from tensorflow.core.example import example_pb2

    if not isinstance(obj, dict):
        raise invalid_argument(f"Example must be JSON object but got JSON {_json_type(obj)}")
    example = example_pb2.Example()
    for name, value in obj.items():
        values = value if isinstance(value, list) else [value]
        kinds = set()
        for v in values:
            if isinstance(v, bool) or (isinstance(v, int)):
                kinds.add("int64")
            elif isinstance(v, float):
                kinds.add("float")
            elif isinstance(v, str) or _is_b64(v):
                kinds.add("bytes")
            else:
                raise invalid_argument(f"Feature: {name} has element with unexpected JSON type: {_json_type(v)}")
        if len(kinds) > 1:
            raise invalid_argument(f"Unexpected element type in feature: {name} expecting type: {sorted(kinds)[0]}")
        feature = example.features.feature[name]
        kind = kinds.pop() if kinds else "float"
        if kind == "int64":
            feature.int64_list.value.extend(int(v) for v in values)
        elif kind == "float":
            feature.float_list.value.extend(values)
        else:
            feature.bytes_list.value.extend(
                v.encode("utf-8") if isinstance(v, str) else base64.b64decode(v["b64"]) for v in values
            )
    return example


def error_body(error: ServingError) -> bytes:
    return orjson.dumps({"error": error.message})


def internal_error(exc: Exception) -> ServingError:
    return ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}")
