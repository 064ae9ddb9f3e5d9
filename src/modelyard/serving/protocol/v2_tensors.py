"""Open Inference Protocol (KServe V2) tensors <-> NumPy arrays, for its REST and gRPC adapters.

One tensor arrives in one of three forms: JSON ``data`` (flat or nested, row-major), raw
little-endian bytes (the REST binary extension and gRPC's ``raw_input_contents``), or gRPC's
typed ``contents``. BYTES elements travel raw as a 4-byte little-endian length before each
element. Datatype names come from ``model.dtypes`` (the one table); JSON numbers are checked
and cast by ``dtypes.json_array``, as for TF Serving's REST API.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from modelyard.errors import invalid_argument
from modelyard.model import dtypes

try:
    from modelyard.serving.protocol import _numjson
except ImportError:  # built without a C compiler: numbers take NumPy's path
    _numjson = None


class V2Tensor(NamedTuple):
    """One decoded input: its name, the datatype and shape the client declared, and its values
    (a NamedTuple: a frozen dataclass's ``__init__`` cost a request about a microsecond)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    array: np.ndarray


def check_header(name, datatype, shape) -> tuple[int, tuple[int, ...]]:
    """A tensor's declared datatype and shape checked: ``(DataType enum, shape)``."""
    if not isinstance(name, str) or not name:
        raise invalid_argument("an input tensor has no 'name'")
    try:
        enum = dtypes.from_v2_datatype(datatype)
    except ValueError as exc:
        raise invalid_argument(f"input '{name}': {exc}") from None
    if not isinstance(shape, (list, tuple)):
        raise _shape_error(name, shape)
    for d in shape:  # a loop, not all(generator): cheaper for the few dimensions of a shape
        if not (d.__class__ is int or (isinstance(d, int) and not isinstance(d, bool))) or d < 0:
            raise _shape_error(name, shape)
    return enum, tuple(shape)


def _shape_error(name: str, shape):
    return invalid_argument(f"input '{name}': 'shape' must be a list of non-negative integers, got {shape!r}")


def _count(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


class DataText(bytes):
    """An input's ``data`` as the JSON text of an array of numbers, cut from the request body before
    the rest of it was parsed (``v2_rest``): parsing 784 numbers into Python ints only to read them
    again cost a digits infer more than the model."""


def read_numbers(text: DataText) -> tuple | None:
    """The numbers of ``text`` read in one pass in C (TF Serving's REST reader, ``_numjson``): int64,
    or float64 once a number has a fraction, flat. None when the reader declines (not numbers only,
    ragged, empty, not JSON): the general path then reads the parsed list and words any error.
    Else ``(values, lowest, highest, floating)``: the reader's extremes spare integers a pass."""
    if _numjson is None:
        return None
    read = _numjson.read_number_body(b'{"inputs":' + text + b"}")
    if read is None or not read[3] or not all(read[3]):
        return None
    return np.frombuffer(read[2], np.float64 if read[6] else np.int64), read[4], read[5], read[6]


def _parsed(data):
    """``data`` as Python lists: a ``DataText`` parsed (its numbers were not all the C reader takes)."""
    if not isinstance(data, DataText):
        return data
    import orjson

    try:
        return orjson.loads(bytes(data))  # orjson takes bytes, not a subclass
    except orjson.JSONDecodeError as exc:
        raise invalid_argument(f"malformed JSON request body: {exc}") from None


def _checked_numbers(numbers: tuple, enum: int, name: str) -> np.ndarray | None:
    """The C reader's values as the input's dtype by ``dtypes``' rule; None to let the general path
    word the error. Integers for an integer input are range-checked by their extremes (as
    rest_json's NumericTensor does), anything else goes through ``dtypes.json_array``."""
    values, low, high, floating = numbers
    target = dtypes.to_numpy(enum)
    if not floating and target.kind in "iu":
        least, most = dtypes.integer_limits(target)
        return values.astype(target, copy=False) if least <= low and high <= most else None
    try:
        return dtypes.json_array(values, enum, name)
    except ValueError:
        return None


def from_json(name: str, datatype: str, shape, data) -> V2Tensor:
    """A JSON tensor (``data`` flat or nested in row-major order) as an array of ``shape``; ``data``
    may be a ``DataText``, read in C when it is all numbers."""
    enum, shape = check_header(name, datatype, shape)
    return from_checked_json(name, datatype, enum, shape, data)


def from_checked_json(name: str, datatype: str, enum: int, shape: tuple[int, ...], data) -> V2Tensor:
    """``from_json`` once ``check_header`` answered ``(enum, shape)`` (``v2_rest`` keeps that answer for
    a request whose every part but its numbers it has seen before)."""
    numbers = read_numbers(data) if isinstance(data, DataText) and enum not in (dtypes.DT_STRING, dtypes.DT_BOOL) \
        else None
    array = _checked_numbers(numbers, enum, name) if numbers is not None else None
    if array is None:
        data = _parsed(data)
        if not isinstance(data, list):
            data = [data]
    if array is not None:
        pass
    elif enum == dtypes.DT_STRING:
        flat = _flatten(data)
        array = np.empty(len(flat), dtype=object)
        for i, value in enumerate(flat):
            if isinstance(value, str):
                array[i] = value.encode("utf-8")
            else:
                raise invalid_argument(f"input '{name}': BYTES data holds strings, got {value!r}")
    else:
        try:
            inferred = np.asarray(data)
        except ValueError:  # ragged nesting
            raise invalid_argument(f"input '{name}': 'data' is not a regular nested list") from None
        if inferred.dtype.kind not in "biuf":
            if inferred.size and inferred.dtype.kind != "O":
                raise invalid_argument(f"input '{name}': {datatype} data holds numbers, got {inferred.flat[0]!r}")
            raise invalid_argument(f"input '{name}': 'data' must be a (nested) list of numbers for {datatype}")
        inferred = inferred.reshape(-1)
        if enum == dtypes.DT_BOOL and inferred.dtype.kind != "b":
            raise invalid_argument(f"input '{name}': BOOL data holds true/false, got {inferred.flat[0]!r}"
                                   if inferred.size else f"input '{name}': BOOL data holds true/false")
        try:
            array = dtypes.json_array(inferred, enum, name)
        except ValueError as exc:
            raise invalid_argument(f"input '{name}': {exc}") from None
    if array.size != _count(shape):
        raise invalid_argument(
            f"input '{name}': shape {list(shape)} holds {_count(shape)} elements but 'data' has {array.size}")
    return V2Tensor(name, datatype, shape, array.reshape(shape))


def _flatten(data: list) -> list:
    out: list = []
    stack = [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            out.append(value)
        else:
            stack.pop()
    return out


def from_raw(name: str, datatype: str, shape, raw) -> V2Tensor:
    """Raw little-endian bytes (REST binary data, gRPC raw_input_contents) as an array of ``shape``."""
    enum, shape = check_header(name, datatype, shape)
    count = _count(shape)
    if enum == dtypes.DT_STRING:
        array = _unpack_bytes(name, memoryview(raw), count)
    else:
        dtype, native = _raw_dtypes(enum)
        if len(raw) != count * dtype.itemsize:
            raise invalid_argument(
                f"input '{name}': shape {list(shape)} of {datatype} needs {count * dtype.itemsize} bytes "
                f"but {len(raw)} were sent")
        array = np.frombuffer(raw, dtype=dtype).astype(native, copy=False)
    return V2Tensor(name, datatype, shape, array.reshape(shape))


_RAW_DTYPES: dict[int, tuple[np.dtype, np.dtype]] = {}  # dtype.newbyteorder cost a gRPC infer microseconds
_LITTLE: dict[np.dtype, np.dtype] = {}


def _raw_dtypes(enum: int) -> tuple[np.dtype, np.dtype]:
    """A DataType's NumPy dtype little-endian (as V2's raw bytes travel) and in this machine's order."""
    pair = _RAW_DTYPES.get(enum)
    if pair is None:
        little = dtypes.to_numpy(enum).newbyteorder("<")
        pair = _RAW_DTYPES[enum] = (little, little.newbyteorder("="))
    return pair


def _unpack_bytes(name: str, raw: memoryview, count: int) -> np.ndarray:
    array = np.empty(count, dtype=object)
    offset, size = 0, len(raw)
    for i in range(count):
        if offset + 4 > size:
            raise invalid_argument(f"input '{name}': BYTES data ends after {i} of {count} elements")
        length = int.from_bytes(raw[offset:offset + 4], "little")
        offset += 4
        if offset + length > size:
            raise invalid_argument(f"input '{name}': BYTES element {i} is cut short ({length} bytes declared)")
        array[i] = bytes(raw[offset:offset + length])
        offset += length
    if offset != size:
        raise invalid_argument(f"input '{name}': {size - offset} bytes left after {count} BYTES elements")
    return array


def to_raw(array: np.ndarray) -> bytes:
    """An output's raw little-endian bytes (BYTES elements length-prefixed)."""
    if array.dtype.kind in "OSU":
        parts = []
        for value in array.reshape(-1):
            value = value.encode("utf-8") if isinstance(value, str) else bytes(value)
            parts.append(len(value).to_bytes(4, "little"))
            parts.append(value)
        return b"".join(parts)
    little = _LITTLE.get(array.dtype)
    if little is None:
        little = _LITTLE[array.dtype] = array.dtype.newbyteorder("<")
    return np.ascontiguousarray(array, dtype=little).tobytes()


def to_json_data(array: np.ndarray) -> list | np.ndarray:
    """An output's values as V2's flat JSON ``data`` (BYTES as UTF-8 text). Numbers stay an array,
    for ``orjson.OPT_SERIALIZE_NUMPY`` to write (a float32 in its shortest form, as TF Serving's
    REST answer does): a Python number per value cost more than the digits model."""
    flat = array.reshape(-1)
    kind = array.dtype.kind
    if kind in "iub" or (kind == "f" and array.dtype.itemsize >= 4):
        return np.ascontiguousarray(flat)
    if kind in "OS":
        try:
            return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in flat]
        except UnicodeDecodeError:
            raise invalid_argument(
                "an output holds bytes that are not UTF-8 text: ask for it with binary_data") from None
    return flat.astype(np.float32).tolist()  # FP16 and BF16


_OUTPUT_DATATYPES: dict[np.dtype, str] = {}  # dtypes' answer remembered per NumPy dtype (a handful)


def output_datatype(array: np.ndarray) -> str:
    """The V2 datatype of an output array."""
    datatype = _OUTPUT_DATATYPES.get(array.dtype)
    if datatype is None:
        datatype = _OUTPUT_DATATYPES[array.dtype] = dtypes.v2_datatype(dtypes.from_numpy(array.dtype))
    return datatype


# gRPC's InferTensorContents: which repeated field carries each datatype (FP16/BF16 only raw).
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def from_contents(name: str, datatype: str, shape, contents) -> V2Tensor:
    """gRPC's typed ``contents`` as an array of ``shape``; values outside the datatype's range refused."""
    enum, shape = check_header(name, datatype, shape)
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise invalid_argument(f"input '{name}': {datatype} travels only in raw_input_contents")
    values = getattr(contents, field)
    count = _count(shape)
    if len(values) != count:
        raise invalid_argument(
            f"input '{name}': shape {list(shape)} holds {count} elements but {field} has {len(values)}")
    if enum == dtypes.DT_STRING:
        array = np.empty(count, dtype=object)
        array[:] = list(values)
    else:
        target = dtypes.to_numpy(enum)
        wide = np.asarray(values, dtype=np.float64 if target.kind == "f" else
                          np.uint64 if target.kind == "u" else np.bool_ if target.kind == "b" else np.int64)
        try:
            array = dtypes.json_array(wide, enum, name)
        except ValueError as exc:
            raise invalid_argument(f"input '{name}': {exc}") from None
    return V2Tensor(name, datatype, shape, array.reshape(shape))
