"""The one place for dtype rules: TF DataType enum <-> NumPy, and JSON value checks.

Every adapter converts through here, so REST and gRPC accept and refuse the same values.
The enum's values are written out (they are fixed by ``types.proto``, and a test holds them to
TensorFlow's) so that what only needs dtypes, such as a batch worker running a cached LiteRT
model, does not pay the 2-3 s of importing TensorFlow for ``types_pb2``.
"""
from __future__ import annotations

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
    """A JSON value whose kind the target dtype cannot hold (e.g. a string for DT_FLOAT)."""


def check_json_kind(inferred: np.ndarray, enum_value: int) -> None:
    """Refuse values the signature's dtype cannot take; never guess a dtype from the data."""
    target = to_numpy(enum_value)
    accepted = _ACCEPTED_KINDS.get(target.kind)
    if accepted is None or inferred.size == 0:
        return
    if inferred.dtype.kind not in accepted:
        sample = inferred.flat[0] if inferred.size else None
        raise ValueKindError(
            f"JSON Value: {_show(sample)} not of type {dtype_name(enum_value)[3:].lower()} "
            f"as expected by the signature's input of dtype {dtype_name(enum_value)}{sending_hint(enum_value)}"
        )


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
