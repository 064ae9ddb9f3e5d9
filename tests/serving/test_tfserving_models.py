"""Must-show 1: TF Serving's test models (generated, and its own files where present) give its answers."""
from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
import requests

import modelyard  # noqa: F401  (TF environment first)
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)


@pytest.fixture(scope="module")
def stub(grpc_target):
    channel = grpc.insecure_channel(grpc_target)
    yield prediction_service_pb2_grpc.PredictionServiceStub(channel)
    channel.close()


def post(server, path, body):
    return requests.post(server.base + path, data=json.dumps(body))


@pytest.mark.parametrize("model", ["default", "tf2"])
def test_rest_predict_row_and_columnar(testdata_server, model):
    body = [2.0, 3.0, 4.0] if model == "default" else [2.0]
    expected = [3.0, 3.5, 4.0] if model == "default" else [3.0]
    r = post(testdata_server, f"/v1/models/{model}:predict", {"instances": body})
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": expected}
    r = post(testdata_server, f"/v1/models/{model}:predict", {"inputs": body})
    assert r.json() == {"outputs": expected}


def test_rest_predict_by_version(testdata_server):
    r = post(testdata_server, "/v1/models/default/versions/123:predict", {"instances": [[2.0], [4.0]]})
    assert r.json() == {"predictions": [[3.0], [4.0]]}


def test_tflite_model_served_through_litert(testdata_server):
    r = post(testdata_server, "/v1/models/tflite:predict", {"instances": [[2.0]]})
    assert r.json() == {"predictions": [[3.0]]}
    metrics = requests.get(testdata_server.base + "/monitoring/prometheus/metrics").text
    assert 'model_runtime{model_name="tflite",version="123",runtime="litert"} 1' in metrics


def test_rest_classify_and_regress(testdata_server):
    r = post(testdata_server, "/v1/models/default:classify",
             {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]})
    assert r.json() == {"results": [[["", 3.0]]]}
    r = post(testdata_server, "/v1/models/default:regress",
             {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]})
    assert r.json() == {"results": [3.0]}
    # context features merge into every example
    r = post(testdata_server, "/v1/models/default:regress",
             {"signature_name": "regress_x_to_y", "context": {"x": 4.0}, "examples": [{}, {}]})
    assert r.json() == {"results": [4.0, 4.0]}


def test_rest_status(testdata_server):
    r = requests.get(testdata_server.base + "/v1/models/default")
    assert r.json() == {
        "model_version_status": [
            {"version": "123", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        ]
    }
    r = requests.get(testdata_server.base + "/v1/models/default/versions/123")
    assert r.json()["model_version_status"][0]["state"] == "AVAILABLE"


def test_rest_metadata_equals_tf_serving(testdata_server, tfserving_testdata):
    r = requests.get(testdata_server.base + "/v1/models/default/metadata")
    assert r.status_code == 200
    expected = json.loads((tfserving_testdata / "half_plus_two_model_metadata.json").read_text())
    assert r.json() == expected


def test_grpc_predict(stub):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "default"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto([[2.0]], dtype=tf.float32))
    response = stub.Predict(request, timeout=10)
    assert tf.make_ndarray(response.outputs["y"]).tolist() == [[3.0]]
    assert response.outputs["y"].float_val == [3.0]  # typed fields, as TF Serving answers
    assert response.model_spec.name == "default"
    assert response.model_spec.version.value == 123
    assert response.model_spec.signature_name == "serving_default"


def test_grpc_predict_tensor_content_and_broadcast(stub):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "default"
    x = np.array([[2.0], [6.0]], dtype=np.float32)
    request.inputs["x"].dtype = tf.float32.as_datatype_enum
    request.inputs["x"].tensor_shape.dim.add(size=2)
    request.inputs["x"].tensor_shape.dim.add(size=1)
    request.inputs["x"].tensor_content = x.tobytes()
    assert tf.make_ndarray(stub.Predict(request).outputs["y"]).tolist() == [[3.0], [5.0]]
    # one typed value broadcasts to the whole shape
    request.inputs["x"].ClearField("tensor_content")
    request.inputs["x"].float_val.append(4.0)
    assert tf.make_ndarray(stub.Predict(request).outputs["y"]).tolist() == [[4.0], [4.0]]


def test_grpc_predict_tf2_and_tflite(stub):
    for model, shape in (("tf2", [1]), ("tflite", [1, 1])):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.full(shape, 2.0, np.float32)))
        assert tf.make_ndarray(stub.Predict(request).outputs["y"]).ravel().tolist() == [3.0]


def _examples(request, value=2.0):
    example = request.input.example_list.examples.add()
    example.features.feature["x"].float_list.value.append(value)


def test_grpc_classify_and_regress(stub):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "default"
    request.model_spec.signature_name = "classify_x_to_y"
    _examples(request)
    response = stub.Classify(request)
    assert response.result.classifications[0].classes[0].score == 3.0
    assert response.model_spec.signature_name == "classify_x_to_y"
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = "default"
    request.model_spec.signature_name = "regress_x_to_y"
    _examples(request)
    assert stub.Regress(request).result.regressions[0].value == 3.0


def test_grpc_multi_inference(stub):
    request = inference_pb2.MultiInferenceRequest()
    for sig, method in (("classify_x_to_y", "classify"), ("regress_x_to_y", "regress")):
        task = request.tasks.add()
        task.model_spec.name = "default"
        task.model_spec.signature_name = sig
        task.method_name = f"tensorflow/serving/{method}"
    _examples(request, 4.0)
    results = stub.MultiInference(request).results
    assert results[0].classification_result.classifications[0].classes[0].score == 4.0
    assert results[1].regression_result.regressions[0].value == 4.0


def test_grpc_metadata_and_status(testdata_server, stub):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "default"
    response = stub.GetModelMetadata(request)
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(sig_map)
    assert set(sig_map.signature_def) == {
        "serving_default", "classify_x_to_y", "regress_x_to_y", "regress_x_to_y2", "regress_x2_to_y3"
    }
    assert response.model_spec.version.value == 123
    channel = grpc.insecure_channel(testdata_server.grpc_target)
    models = model_service_pb2_grpc.ModelServiceStub(channel)
    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = "default"
    status = models.GetModelStatus(status_request)
    assert status.model_version_status[0].version == 123
    assert status.model_version_status[0].state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    channel.close()


def test_prometheus_metrics_use_tf_serving_names(testdata_server):
    post(testdata_server, "/v1/models/default:predict", {"instances": [1.0]})
    text = requests.get(testdata_server.base + "/monitoring/prometheus/metrics").text
    assert '# TYPE :tensorflow:serving:request_count counter' in text
    assert ':tensorflow:serving:request_count{model_name="default",status="OK"}' in text
    assert ':tensorflow:serving:request_latency_bucket{model_name="default",API="predict",entrypoint="REST",le="10"}' in text
    assert ':tensorflow:cc:saved_model:load_attempt_count{model_path=' in text


def test_cors_headers(testdata_server):
    r = post(testdata_server, "/v1/models/default:predict", {"instances": [1.0]})
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    r = requests.options(testdata_server.base + "/v1/models/default:predict")
    assert r.status_code == 204
    assert "POST" in r.headers["Access-Control-Allow-Methods"]
