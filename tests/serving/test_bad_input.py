"""Must-show 4: bad input gets TF Serving's code and message, and the server keeps serving."""
from __future__ import annotations

import json

import grpc
import pytest
import requests

import modelyard  # noqa: F401
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc


def post(server, path, data):
    return requests.post(server.base + path, data=data if isinstance(data, (bytes, str)) else json.dumps(data))


def still_serving(server):
    r = post(server, "/v1/models/default:predict", {"instances": [2.0]})
    assert r.status_code == 200 and r.json() == {"predictions": [3.0]}


CASES = [
    ("malformed json", "/v1/models/default:predict", b'{"instances": [1.0,', 400, "JSON Parse error: "),
    ("not json", "/v1/models/default:predict", b"instances = [1, 2]", 400, "JSON Parse error: Invalid value. at offset: 0"),
    ("empty body", "/v1/models/default:predict", b"", 400, "JSON Parse error: The document is empty"),
    ("not an object", "/v1/models/default:predict", [1, 2], 400, "Is not object"),
    ("wrong dtype", "/v1/models/default:predict", {"instances": ["a", "b"]}, 400,
     'JSON Value: "a" Type: String is not of expected type: float'),
    ("bool for float", "/v1/models/default:predict", {"instances": [[True]]}, 400, "is not of expected type: float"),
    ("ragged", "/v1/models/default:predict", {"instances": [[1.0], [2.0, 3.0]]}, 400, "Expecting shape [1] but got: [2]"),
    ("ragged columnar", "/v1/models/default:predict", {"inputs": [[1.0], [2.0, 3.0]]}, 400,
     "Encountered list at unexpected size: 2 at level: 1 expected size: 1"),
    ("both keys", "/v1/models/default:predict", {"instances": [1.0], "inputs": [1.0]}, 400,
     "expecting only one of 'inputs' or 'instances' keys to exist"),
    ("neither key", "/v1/models/default:predict", {"signature_name": "serving_default"}, 400,
     "Missing 'inputs' or 'instances' key"),
    ("empty instances", "/v1/models/default:predict", {"instances": []}, 400, "No values in 'instances' array"),
    ("signature_name not string", "/v1/models/default:predict", {"signature_name": 100, "instances": [1.0]}, 400,
     "'signature_name' key must be a string value."),
    ("unknown model", "/v1/models/nope:predict", {"instances": [1.0]}, 404,
     "Servable not found for request: Latest(nope); served models: default, tf2, tflite"),
    ("unknown version", "/v1/models/default/versions/7:predict", {"instances": [1.0]}, 404,
     "Servable not found for request: Specific(default, 7)"),
    ("unknown label", "/v1/models/default/labels/canary:predict", {"instances": [1.0]}, 400,
     "Unrecognized servable version label: canary"),
    ("unknown signature", "/v1/models/default:predict", {"signature_name": "nope", "instances": [1.0]}, 400,
     'Serving signature name: "nope" not found in signature def'),
    ("unknown named input", "/v1/models/default:predict", {"instances": [{"z": 1.0}]}, 400,
     "does not have named input: z"),
    ("missing named input", "/v1/models/default:predict", {"inputs": {"z": [1.0]}}, 400,
     "Missing named input: x in 'inputs' object."),
    ("classify without examples", "/v1/models/default:classify", {"signature_name": "classify_x_to_y"}, 400,
     "When method is classify, key 'examples' is expected and was not found"),
    ("classify wrong signature method", "/v1/models/default:classify", {"examples": [{"x": 1.0}]}, 400,
     "Expected classification signature method_name to be tensorflow/serving/classify. Was: tensorflow/serving/predict"),
    ("regress unknown signature", "/v1/models/default:regress", {"signature_name": "zz", "examples": [{"x": 1.0}]}, 400,
     "No signature was found with the name: zz"),
    ("bad url", "/v1/models/default:explain", {"instances": [1.0]}, 400,
     "Malformed request: POST /v1/models/default:explain"),
    ("broken SavedModel", "/v1/models/bad:predict", {"instances": [1.0]}, 404,
     "Servable not found for request: Latest(bad)"),
]


@pytest.mark.parametrize("name,path,body,status,message", CASES, ids=[c[0] for c in CASES])
def test_rest_bad_input(testdata_server, name, path, body, status, message):
    r = post(testdata_server, path, body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert message in r.json()["error"]
    still_serving(testdata_server)


def test_body_over_size_limit(testdata_server):
    big = json.dumps({"instances": [1.0] * 40000})  # > 100000 bytes, the fixture's limit
    r = post(testdata_server, "/v1/models/default:predict", big)
    assert r.status_code == 413
    assert "exceeds the limit of 100000 bytes" in r.json()["error"]
    still_serving(testdata_server)


def test_unknown_model_status(testdata_server):
    r = requests.get(testdata_server.base + "/v1/models/nope")
    assert r.status_code == 404
    # TF Serving's text, then the names that are served (the model was probably mistyped)
    assert r.json() == {"error": "Could not find any versions of model nope; served models: default, tf2, tflite"}


def test_broken_saved_model_reports_why(testdata_server):
    r = requests.get(testdata_server.base + "/v1/models/bad")
    assert r.status_code == 200
    (status,) = r.json()["model_version_status"]
    assert status["version"] == "123"
    assert status["state"] == "END"
    assert status["status"]["error_code"] == "NOT_FOUND"
    assert "Could not find SavedModel .pb or .pbtxt" in status["status"]["error_message"]


def test_nan_and_infinity_round_trip(testdata_server):
    r = post(testdata_server, "/v1/models/default:predict", b'{"instances": [NaN, Infinity, -Infinity, 2.0]}')
    assert r.status_code == 200
    assert r.text.replace(" ", "") == '{"predictions":[NaN,Infinity,-Infinity,3.0]}'


@pytest.fixture(scope="module")
def stub(grpc_target):
    channel = grpc.insecure_channel(grpc_target)
    yield prediction_service_pb2_grpc.PredictionServiceStub(channel)
    channel.close()


def _request(model="default", **spec):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for key, value in spec.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, key, value)
    request.inputs["x"].CopyFrom(tf.make_tensor_proto([[2.0]], dtype=tf.float32))
    return request


GRPC_CASES = [
    ("unknown model", _request("nope"), grpc.StatusCode.NOT_FOUND,
     "Servable not found for request: Latest(nope); served models: default, tf2, tflite"),
    ("unknown version", _request(version=9), grpc.StatusCode.NOT_FOUND, "Specific(default, 9)"),
    ("unknown label", _request(version_label="stable"), grpc.StatusCode.INVALID_ARGUMENT,
     "Unrecognized servable version label: stable"),
    ("unknown signature", _request(signature_name="nope"), grpc.StatusCode.FAILED_PRECONDITION,
     'Serving signature key "nope" not found.'),
]


@pytest.mark.parametrize("name,request_proto,code,message", GRPC_CASES, ids=[c[0] for c in GRPC_CASES])
def test_grpc_bad_input(stub, testdata_server, name, request_proto, code, message):
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request_proto, timeout=10)
    assert info.value.code() == code
    assert message in info.value.details()
    still_serving(testdata_server)


def test_grpc_wrong_dtype_and_alias(stub):
    request = _request()
    request.inputs["x"].CopyFrom(tf.make_tensor_proto([[2]], dtype=tf.int32))
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Expects arg[x] to be float but int32 is provided" in info.value.details()
    request = _request()
    request.inputs["z"].CopyFrom(request.inputs.pop("x"))
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input tensor alias not found in signature: z. Inputs expected to be in the set {x}." in info.value.details()
    request = _request()
    request.output_filter.append("nope")
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request)
    assert "output tensor alias not found in signature: nope" in info.value.details()


def test_grpc_missing_model_spec(stub):
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(predict_pb2.PredictRequest())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "Missing ModelSpec"
