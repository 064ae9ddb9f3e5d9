"""The one place for dtype rules: TF DataType enum <-> NumPy, and JSON numbers -> arrays.

Every adapter converts through here, so REST, gRPC and batch prediction accept and refuse the
same values. JSON numbers meet an integer input under one of two rules (``JSON_NUMBER_RULES``):
``tf_serving``, TF Serving's (a number written with a fraction or an exponent, even ``0.0``, is
not an integer), and ``vertex``, what Vertex AI's prediction service hands a container (every
JSON number travels as a double there and reaches the model as an integer when it is integral:
``0.0``, ``3.0`` and ``1e2`` are accepted, ``0.5`` is still refused). Under both, an integer
outside the input's range is refused, never wrapped.
The enum's values are written out (they are fixed by ``types.proto``, and a test holds them to
TensorFlow's) so that what only needs dtypes, such as a batch worker running a cached LiteRT
model, does not pay the 2-3 s of importing TensorFlow for ``types_pb2``.
"""
from __future__ import annotations

import functools

import numpy as np

from modelyard.errors import excerpt

DT_FLOAT, DT_DOUBLE, DT_INT32, DT_UINT8, DT_INT16, DT_INT8, DT_STRING = 1, 2, 3, 4, 5, 6, 7
DT_COMPLEX64, DT_INT64, DT_BOOL, DT_BFLOAT16 = 8, 9, 10, 14
DT_UINT16, DT_COMPLEX128, DT_HALF, DT_UINT32, DT_UINT64 = 17, 18, 19, 22, 23

_NAMES = {value: name for name, value in globals().items() if name.startswith("DT_")}

# DataType enum value -> NumPy dtype. Strings are object arrays of bytes.
_TO_NUMPY: dict[int, np.dtype] = {
    DT_FLOAT: np.dtype(np.float32),
    DT_DOUBLE: np.dtype(np.float64),
    DT_HALF: np.dtype(np.float16),
    DT_INT8: np.dtype(np.int8),
    DT_INT16: np.dtype(np.int16),
    DT_INT32: np.dtype(np.int32),
    DT_INT64: np.dtype(np.int64),
    DT_UINT8: np.dtype(np.uint8),
    DT_UINT16: np.dtype(np.uint16),
    DT_UINT32: np.dtype(np.uint32),
    DT_UINT64: np.dtype(np.uint64),
    DT_BOOL: np.dtype(np.bool_),
    DT_STRING: np.dtype(object),
    DT_COMPLEX64: np.dtype(np.complex64),
    DT_COMPLEX128: np.dtype(np.complex128),
}
try:  # bfloat16 arrives through ml_dtypes, which TensorFlow depends on
    import ml_dtypes

    _TO_NUMPY[DT_BFLOAT16] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    pass

_FROM_NUMPY: dict[np.dtype, int] = {v: k for k, v in _TO_NUMPY.items()}

# Which kinds of an inferred JSON array may be converted to each target kind without loss.
# JSON numbers without a fraction arrive as ints, so float targets take ints too.
_ACCEPTED_KINDS = {"f": "fiu", "c": "fiuc", "i": "iu", "u": "iu", "b": "b"}


TF_SERVING_NUMBERS, VERTEX_NUMBERS = "tf_serving", "vertex"
JSON_NUMBER_RULES = (TF_SERVING_NUMBERS, VERTEX_NUMBERS)


def integral_numbers(rule: str) -> bool:
    """Whether ``rule`` (one of ``JSON_NUMBER_RULES``) takes integral numbers such as ``0.0`` as integers."""
    if rule not in JSON_NUMBER_RULES:
        raise ValueError(f"JSON number rule {rule!r}: expected one of {', '.join(JSON_NUMBER_RULES)}")
    return rule == VERTEX_NUMBERS


def dtype_name(enum_value: int) -> str:
    """``1`` -> ``"DT_FLOAT"``."""
    name = _NAMES.get(enum_value)
    if name is None:  # the rarer ones (quantized, resource, variant, ..._REF): TensorFlow's own table
        from tensorflow.core.framework import types_pb2

        name = types_pb2.DataType.Name(enum_value)
    return name


def to_numpy(enum_value: int) -> np.dtype:
    try:
        return _TO_NUMPY[enum_value]
    except KeyError:
        raise TypeError(f"dtype {dtype_name(enum_value)} is not supported") from None


def from_numpy(dtype: np.dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype.kind in "SUO":
        return DT_STRING
    return _FROM_NUMPY[dtype]


def is_string(enum_value: int) -> bool:
    return enum_value == DT_STRING


class ValueKindError(ValueError):
    """A JSON value whose kind the target dtype cannot hold (e.g. a string for DT_FLOAT, 0.5 for DT_UINT8)."""


class ValueRangeError(ValueError):
    """An integer outside the target integer dtype's range (e.g. 300 for DT_UINT8)."""


@functools.lru_cache(maxsize=None)
def integer_limits(dtype: np.dtype) -> tuple[int, int]:
    """The smallest and largest value of an integer dtype."""
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def range_message(enum_value: int, alias: str) -> str:
    """The one wording of an out-of-range integer, for serving's answers and batch prediction's error lines."""
    return (f"JSON Value out of range for {dtype_name(enum_value)[3:].lower()} in input {alias}"
            + sending_hint(enum_value))


def json_value_fits(value, dtype: np.dtype, integral: bool = False) -> bool:
    """Whether one parsed JSON scalar (bool, int, float, str) may become an element of ``dtype``
    (its range aside): where a refused batch finds the value to name."""
    if isinstance(value, bool):
        return dtype.kind == "b"
    if isinstance(value, int):
        return dtype.kind in "fiuc"
    if isinstance(value, float):
        return dtype.kind in "fc" or (integral and dtype.kind in "iu" and value.is_integer())
    if isinstance(value, str):
        return dtype.kind == "O"
    return False


def check_json_kind(inferred: np.ndarray, enum_value: int, integral: bool = False) -> None:
    """Refuse values the signature's dtype cannot take; never guess a dtype from the data."""
    target = to_numpy(enum_value)
    accepted = _ACCEPTED_KINDS.get(target.kind)
    if accepted is None or inferred.size == 0:
        return
    if inferred.dtype.kind in accepted:
        return
    sample = inferred.flat[0]
    if integral and target.kind in "iu" and inferred.dtype.kind == "f":
        whole = np.isfinite(inferred) & (np.trunc(inferred) == inferred)
        if whole.all():
            return
        sample = inferred[~whole].flat[0]  # the first value that is not an integer
    raise ValueKindError(
        f"JSON Value: {_show(sample)} not of type {dtype_name(enum_value)[3:].lower()} "
        f"as expected by the signature's input of dtype {dtype_name(enum_value)}{sending_hint(enum_value)}"
    )


def json_array(inferred: np.ndarray, enum_value: int, alias: str, integral: bool = False) -> np.ndarray:
    """THE rule for numbers: an array NumPy inferred from JSON values -> the input's dtype.

    ``inferred`` holds the values as parsed (int64, uint64 or float64; bool). Refused with
    ``ValueKindError``: a kind the dtype cannot hold (with ``integral``, a non-integral float for an
    integer dtype). Refused with ``ValueRangeError``: an integer outside an integer dtype's range.
    Numbers past an input's range are never wrapped (NumPy's cast would make 300 a uint8 44).
    """
    check_json_kind(inferred, enum_value, integral)
    target = to_numpy(enum_value)
    if target.kind in "iu" and inferred.size and inferred.dtype.kind in "iuf" \
            and not np.can_cast(inferred.dtype, target, "safe"):
        low, high = integer_limits(target)
        if inferred.dtype.kind == "f":  # integral doubles: the first double past ``high`` is high + 1
            out = inferred.min() < low or inferred.max() >= float(high) + 1
        else:
            out = inferred.min() < low or inferred.max() > high
        if out:
            raise ValueRangeError(range_message(enum_value, alias))
    return inferred.astype(target, copy=False)


def sending_hint(enum_value: int) -> str:
    """What to send instead, appended to a wrong-value message where the cause is nearly always one.

    A uint8 input is an image model that takes raw pixels (a Rescaling layer, or a quantized
    model's input scale, does the division), and the mistake is sending 0-1 floats.
    """
    if enum_value == DT_UINT8:
        return " (send integers 0-255: this model rescales itself)"
    return ""


def _show(value) -> str:
    if isinstance(value, (bytes, str)):
        return excerpt(repr(value if isinstance(value, str) else value.decode("utf-8", "replace")))
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    return str(value)


# ---- the Open Inference Protocol's (KServe V2) datatype names ------------------------------------
# The one table for V2's REST and gRPC adapters. BYTES is DT_STRING (length-prefixed in binary
# form); BF16 only where ml_dtypes gave NumPy a bfloat16 (see _TO_NUMPY).
_V2_NAMES: dict[int, str] = {
    DT_BOOL: "BOOL", DT_UINT8: "UINT8", DT_UINT16: "UINT16", DT_UINT32: "UINT32", DT_UINT64: "UINT64",
    DT_INT8: "INT8", DT_INT16: "INT16", DT_INT32: "INT32", DT_INT64: "INT64",
    DT_HALF: "FP16", DT_FLOAT: "FP32", DT_DOUBLE: "FP64", DT_STRING: "BYTES",
}
if DT_BFLOAT16 in _TO_NUMPY:
    _V2_NAMES[DT_BFLOAT16] = "BF16"
_FROM_V2: dict[str, int] = {name: value for value, name in _V2_NAMES.items()}
V2_DATATYPES = tuple(_FROM_V2)


def v2_datatype(enum_value: int) -> str:
    """``DT_FLOAT`` -> ``"FP32"``; a dtype V2 cannot carry (complex numbers) raises TypeError."""
    try:
        return _V2_NAMES[enum_value]
    except KeyError:
        raise TypeError(f"dtype {dtype_name(enum_value)} has no Open Inference Protocol datatype") from None


def from_v2_datatype(name: str) -> int:
    """``"FP32"`` -> ``DT_FLOAT``; an unknown name raises ValueError naming the known ones."""
    try:
        return _FROM_V2[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown datatype {name!r}; expected one of {', '.join(V2_DATATYPES)}") from None
