"""TensorProto <-> NumPy, for gRPC requests, responses and warmup records.

Responses use typed fields (``float_val`` ...) as TF Serving does, so clients that read
``outputs['y'].float_val`` keep working; requests may use either form.
"""
from __future__ import annotations

import functools

import numpy as np
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

from modelyard.errors import Code, ServingError, invalid_argument
from modelyard.model import dtypes

# A request tensor whose declared shape decodes to more bytes is refused before allocation
# (a single typed value broadcasts to the whole shape: 20 bytes could ask for gigabytes).
# The server sets it from --max_decoded_tensor_bytes.
max_decoded_bytes = 1 << 30


def set_max_decoded_bytes(limit: int) -> None:
    global max_decoded_bytes
    max_decoded_bytes = limit

# dtype enum -> the typed field TF writes values of that dtype into.
TYPED_FIELD = {
    types_pb2.DT_FLOAT: "float_val",
    types_pb2.DT_DOUBLE: "double_val",
    types_pb2.DT_INT32: "int_val",
    types_pb2.DT_INT16: "int_val",
    types_pb2.DT_INT8: "int_val",
    types_pb2.DT_UINT8: "int_val",
    types_pb2.DT_UINT16: "int_val",
    types_pb2.DT_INT64: "int64_val",
    types_pb2.DT_UINT32: "uint32_val",
    types_pb2.DT_UINT64: "uint64_val",
    types_pb2.DT_BOOL: "bool_val",
    types_pb2.DT_STRING: "string_val",
}


def to_ndarray(proto, alias: str = "") -> np.ndarray:
    """Decode a request TensorProto; a single typed value broadcasts to the whole shape."""
    try:
        shape = _shape_of(proto.tensor_shape.SerializeToString())
        dtype = dtypes.to_numpy(proto.dtype)
        content = proto.tensor_content
        if content and dtype.kind != "O":
            return np.frombuffer(content, dtype=dtype).reshape(shape)
        _check_decoded_size(shape, dtype, alias)
        import tensorflow as tf  # through the package, so a deferred one (modelyard._deferred_tf) loads first

        make_ndarray = getattr(tf, "make_ndarray", None)
        if make_ndarray is None:  # TensorFlow's message modules only (the slim serving image)
            from modelyard.model.graph.ops import tensor_value

            return tensor_value(proto)
        return make_ndarray(proto)
    except (TypeError, ValueError) as exc:
        raise invalid_argument(f"tensor parsing error: {alias} ({exc})") from None


def _check_decoded_size(shape: tuple[int, ...], dtype: np.dtype, alias: str) -> None:
    if any(d < 0 for d in shape):
        raise invalid_argument(f"tensor parsing error: {alias} (negative dimension in shape {list(shape)})")
    count = 1
    for d in shape:
        count *= d
    size = count * max(dtype.itemsize, 8 if dtype.kind == "O" else 1)
    if size > max_decoded_bytes:
        raise ServingError(Code.RESOURCE_EXHAUSTED,
                           f"tensor {alias}: shape {list(shape)} would decode to {size} bytes, over the limit of "
                           f"{max_decoded_bytes} (--max_decoded_tensor_bytes)")


def from_ndarray(value: np.ndarray, proto=None):
    """Encode a response array into ``proto`` (a new TensorProto when not given)."""
    if proto is None:
        proto = tensor_pb2.TensorProto()
    value = np.asarray(value)
    enum = dtypes.from_numpy(value.dtype)
    proto.dtype = enum
    proto.tensor_shape.CopyFrom(_shape_proto(value.shape))
    field = TYPED_FIELD.get(enum)
    if field == "string_val":
        proto.string_val.extend(v if isinstance(v, bytes) else str(v).encode() for v in value.ravel())
    elif field is not None:
        getattr(proto, field).extend(value.ravel().tolist())
    elif enum == types_pb2.DT_HALF:
        proto.half_val.extend(value.ravel().view(np.uint16).tolist())
    else:
        proto.tensor_content = np.ascontiguousarray(value).tobytes()
    return proto


@functools.lru_cache(maxsize=1024)
def _shape_of(serialized: bytes) -> tuple[int, ...]:
    # Requests repeat a few shapes: reading the dimensions from their messages, one wrapper
    # object per dimension, cost more than serializing the small shape message as the key.
    return tuple(d.size for d in tensor_shape_pb2.TensorShapeProto.FromString(serialized).dim)


@functools.lru_cache(maxsize=256)
def _shape_proto(shape: tuple[int, ...]) -> tensor_shape_pb2.TensorShapeProto:
    # Answers repeat a few shapes: building the message once per shape saves a message per dimension
    # on every response. Callers copy it (CopyFrom) and never change it.
    return tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=s) for s in shape])


def serialized_examples(input_proto) -> list[bytes]:
    """A tensorflow.serving.Input as serialized tf.Examples (context merged into each)."""
    from modelyard.model.runtime.inference import merge_context

    kind = input_proto.WhichOneof("kind")
    if kind == "example_list":
        return [e.SerializeToString() for e in input_proto.example_list.examples]
    if kind == "example_list_with_context":
        lwc = input_proto.example_list_with_context
        context = lwc.context.SerializeToString() if lwc.HasField("context") else b""
        return merge_context([e.SerializeToString() for e in lwc.examples], context)
    raise invalid_argument("Input is empty.")
