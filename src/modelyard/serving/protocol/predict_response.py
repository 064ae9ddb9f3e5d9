"""A gRPC PredictResponse's bytes, written directly from the output arrays.

Building the message cost more than the rest of a small model's answer: a TensorProto per
output, a message per shape dimension, and every value copied into ``float_val`` as a Python
float. The wire format of the few messages involved is fixed (tensorflow_serving/apis/
predict.proto and model.proto, tensorflow/core/framework/tensor.proto and tensor_shape.proto),
so outputs of the dtypes whose typed field takes the array's own bytes (float, double, bool)
are packed straight from the array; any other output is encoded through the protobuf message
(``tensor_proto.from_ndarray``), so every dtype keeps exactly TF Serving's typed fields.
Clients parse the same message either way (tests compare with the protobuf-built one).
"""
from __future__ import annotations

import functools

import numpy as np
from tensorflow.core.framework import tensor_pb2

from modelyard.model.dtypes import from_numpy
from modelyard.model.tensor_proto import TYPED_FIELD, from_ndarray
from modelyard.serving.protocol import protobuf_wire as wire


def _packed(dtype, wire_dtype: str) -> tuple[np.dtype, tuple[int, int, str]]:
    """dtype -> (its TensorProto dtype enum, the number of the typed field tensor_proto writes it
    to, that field's little-endian element type): both encoders agree on the field by construction."""
    enum = from_numpy(dtype)
    field = tensor_pb2.TensorProto.DESCRIPTOR.fields_by_name[TYPED_FIELD[enum]].number
    return np.dtype(dtype), (enum, field, wire_dtype)


# The dtypes whose typed field takes the array's own bytes (bools: varints of 0 and 1, a byte each).
_PACKED = dict(_packed(dtype, element)
               for dtype, element in ((np.float32, "<f4"), (np.float64, "<f8"), (np.bool_, "u1")))


def _shape(shape: tuple[int, ...]) -> bytes:
    # TensorShapeProto { repeated Dim dim = 2 }; Dim { int64 size = 1 } (0, the default, is not written)
    return b"".join(wire.length_delimited(2, wire.key(1, wire.VARINT) + wire.varint(size) if size else b"")
                    for size in shape)


@functools.lru_cache(maxsize=1024)
def _tensor_head(dtype: np.dtype, shape: tuple[int, ...]) -> tuple[bytes, bytes, str] | None:
    """(dtype and shape fields, the packed field's key, its wire dtype), or None: not packed here."""
    packed = _PACKED.get(dtype)
    if packed is None:
        return None
    enum, field, wire_dtype = packed
    head = wire.key(1, wire.VARINT) + wire.varint(enum) + wire.length_delimited(2, _shape(shape))
    return head, wire.key(field, wire.LEN), wire_dtype


def tensor_bytes(value: np.ndarray) -> bytes:
    """A serialized TensorProto of ``value``, as ``tensor_proto.from_ndarray`` would encode it."""
    value = np.asarray(value)
    head = _tensor_head(value.dtype, value.shape)
    if head is None:
        return from_ndarray(value).SerializeToString()
    fields, packed_key, wire_dtype = head
    if not value.size:  # an empty packed field is not written
        return fields
    data = np.ascontiguousarray(value, dtype=wire_dtype).tobytes()
    return fields + packed_key + wire.varint(len(data)) + data


@functools.lru_cache(maxsize=1024)
def _entry_key(alias: str) -> bytes:
    # map<string, TensorProto> outputs = 1: an entry message { string key = 1; TensorProto value = 2 }
    return wire.length_delimited(1, alias.encode()) + wire.key(2, wire.LEN)


def fill_model_spec(target, name: str, version: int, signature_name: str | None) -> None:
    """A response's ModelSpec: the model's name, the version that answered, the signature if any."""
    target.name = name
    target.version.value = version
    if signature_name is not None:
        target.signature_name = signature_name


@functools.lru_cache(maxsize=1024)
def _model_spec(model_name: str, version: int, signature_name: str | None) -> bytes:
    # ModelSpec model_spec = 2, filled by the rule every gRPC answer's spec follows (once per spec).
    from tensorflow_serving.apis import model_pb2

    spec = model_pb2.ModelSpec()
    fill_model_spec(spec, model_name, version, signature_name)
    return wire.length_delimited(2, spec.SerializeToString())


def encode(model_name: str, version: int, signature_name: str | None, outputs: dict[str, np.ndarray]) -> bytes:
    """A serialized PredictResponse: ``outputs`` by alias, and the ModelSpec that answered."""
    parts = []
    for alias, value in outputs.items():
        tensor = tensor_bytes(value)
        entry = _entry_key(alias) + wire.varint(len(tensor)) + tensor
        parts += (b"\x0a", wire.varint(len(entry)), entry)  # \x0a: field 1, length-delimited
    parts.append(_model_spec(model_name, version, signature_name))
    return b"".join(parts)
