"""Must-show 2: the workflow's client code, unchanged, against the demo digits model."""
from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
import requests

import modelyard  # noqa: F401
import tensorflow as tf
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tensorflow_serving.apis.predict_pb2 import PredictRequest

from modelyard import demo
from tests.serving.server_process import ServerProcess


@pytest.fixture(scope="module")
def server(demo_cache, tmp_path_factory):
    # No model named: `modelyard serve` serves the built-in demo (from this cache, already built).
    with ServerProcess(log_dir=tmp_path_factory.mktemp("logs"), env={"MODELYARD_CACHE": str(demo_cache)}) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference(demo_cache):
    base = demo.ensure_demo_model(cache_dir=demo_cache, log=lambda m: None)
    loaded = tf.saved_model.load(str(base / "0002"))
    return loaded.signatures["serving_default"]


def test_requests_client_unchanged(server, reference):
    X_new = demo.demo_instances(3)
    request_json = json.dumps({"signature_name": "serving_default", "instances": X_new.tolist()})
    response = requests.post(f"http://localhost:{server.rest_port}/v1/models/my_mnist_model:predict", data=request_json)
    response.raise_for_status()
    y_proba = np.array(response.json()["predictions"])
    assert y_proba.shape == (3, 10)
    expected = reference(image=tf.constant(X_new))["probabilities"].numpy()
    np.testing.assert_allclose(y_proba, expected, rtol=1e-5, atol=1e-6)
    assert np.allclose(y_proba.sum(axis=1), 1.0, atol=1e-5)


def test_grpc_client_unchanged(server, reference):
    X_new = demo.demo_instances(3)
    request = PredictRequest()
    request.model_spec.name = "my_mnist_model"
    request.model_spec.signature_name = "serving_default"
    input_name = "image"
    request.inputs[input_name].CopyFrom(tf.make_tensor_proto(X_new))
    channel = grpc.insecure_channel(f"localhost:{server.grpc_port}")
    predict_service = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    response = predict_service.Predict(request, timeout=10.0)
    output_name = "probabilities"
    outputs_proto = response.outputs[output_name]
    y_proba = tf.make_ndarray(outputs_proto)
    expected = reference(image=tf.constant(X_new))["probabilities"].numpy()
    np.testing.assert_allclose(y_proba, expected, rtol=1e-5, atol=1e-6)
    assert response.model_spec.version.value == 2
    channel.close()


def test_demo_serves_both_versions_on_request(server):
    X_new = demo.demo_instances(1).tolist()
    for version in (1, 2):
        r = requests.post(f"{server.base}/v1/models/my_mnist_model/versions/{version}:predict",
                          data=json.dumps({"instances": X_new}))
        # latest{1} is the default policy: only version 2 is loaded
        assert r.status_code == (200 if version == 2 else 404)


def test_printed_curl_command_works(server):
    import shlex
    import subprocess

    command = demo.demo_curl_command(server.rest_port)
    assert "my_mnist_model:predict" in command
    out = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["predictions"][0]) == 10
    assert "Try it:" in server.log()
