"""gRPC PredictResponse bytes written directly parse to exactly the message protobuf builds."""
from __future__ import annotations

import numpy as np
import pytest
from tensorflow_serving.apis import predict_pb2

from modelyard.serving.protocol import predict_response
from modelyard.model.tensor_proto import from_ndarray

_RNG = np.random.default_rng(7)

OUTPUTS = {
    "float": _RNG.standard_normal((3, 10)).astype(np.float32),
    "float_specials": np.array([[np.nan, np.inf, -np.inf, -0.0, 1e-45, 3.4e38]], np.float32),
    "double": _RNG.standard_normal((2, 2, 3)),
    "bool": np.array([[True, False, True]]),
    "scalar": np.float32(2.5),
    "empty": np.zeros((0, 4), np.float32),
    "zero_dim": np.zeros((2, 0), np.float64),
    "big": _RNG.standard_normal((300, 1000)).astype(np.float32),  # lengths past one varint byte
    # through the protobuf message (no packed bytes of the array's own):
    "int32": np.array([[-1, 0, 2**31 - 1]], np.int32),
    "uint8": np.array([255, 0, 7], np.uint8),
    "int64": np.array([-(2**63), 2**63 - 1]),
    "string": np.array([b"a", b"\xff\x00"], object),
    "half": np.array([1.5, -2.0], np.float16),
    "complex": np.array([1 + 2j], np.complex64),
}


def _reference(name: str, version: int, signature_name: str, outputs) -> predict_pb2.PredictResponse:
    response = predict_pb2.PredictResponse()
    response.model_spec.name = name
    response.model_spec.version.value = version
    response.model_spec.signature_name = signature_name
    for alias, value in outputs.items():
        from_ndarray(value, response.outputs[alias])
    return response


@pytest.mark.parametrize("alias", sorted(OUTPUTS))
def test_each_dtype_and_shape_parses_as_the_protobuf_built_message(alias):
    outputs = {alias: OUTPUTS[alias]}
    encoded = predict_response.encode("m", 3, "serving_default", outputs)
    parsed = predict_pb2.PredictResponse.FromString(encoded)
    expected = _reference("m", 3, "serving_default", outputs)
    # NaN != NaN in message equality: compare the serialized forms of both parses instead.
    assert parsed.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)
    assert parsed.outputs[alias].tensor_shape == expected.outputs[alias].tensor_shape


def test_several_outputs_and_the_model_spec():
    outputs = {k: OUTPUTS[k] for k in ("float", "int32", "bool", "string")}
    for name, version, signature in (("digits", 2, "serving_default"), ("m", 0, ""), ("ü-model", 2**62, "sig")):
        parsed = predict_pb2.PredictResponse.FromString(predict_response.encode(name, version, signature, outputs))
        assert parsed == _reference(name, version, signature, outputs)
        assert parsed.model_spec.HasField("version"), "the version is always present, as TF Serving answers"


def test_values_survive_exactly():
    parsed = predict_pb2.PredictResponse.FromString(predict_response.encode("m", 1, "s", OUTPUTS))
    value = OUTPUTS["float"]
    assert np.array(parsed.outputs["float"].float_val, np.float32).reshape(value.shape).tobytes() == value.tobytes()
    assert list(parsed.outputs["bool"].bool_val) == [True, False, True]
    assert parsed.outputs["half"].half_val == [np.float16(1.5).view(np.uint16), np.float16(-2.0).view(np.uint16)]
