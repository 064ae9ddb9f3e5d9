"""Must-show 3: a version placed with ``--into`` is served by ``modelyard serve`` over REST and
gRPC with the same answers as LiteRT in-process."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from modelyard.cli import main
from modelyard.ports import free_ports

MODEL_NAME = "digits_lite"
START_TIMEOUT_S = 90


@pytest.fixture(scope="module")
def lite_base(demo_base, tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("serve") / MODEL_NAME
    assert main(["convert", str(demo_base), "--into", str(base), "--quantize", "dynamic", "--no-report"]) == 0
    assert main(["convert", str(demo_base), "--into", str(base), "--quantize", "int8", "--io-dtype", "uint8",
                 "--representative-data", "digits", "--no-report"]) == 0
    return base


def test_into_writes_next_versions(lite_base):
    assert sorted(p.name for p in lite_base.iterdir()) == ["0001", "0002"]
    assert all((lite_base / v / "model.tflite").is_file() for v in ("0001", "0002"))


@pytest.fixture(scope="module")
def server(lite_base, tmp_path_factory):
    import requests

    grpc_port, rest_port = free_ports(2)
    log = tmp_path_factory.mktemp("serve-log") / "server.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "modelyard", "serve", "--model_name", MODEL_NAME,
             "--model_base_path", str(lite_base), "--port", str(grpc_port), "--rest_api_port", str(rest_port)],
            stdout=sink, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"modelyard serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                status = requests.get(f"http://127.0.0.1:{rest_port}/v1/models/{MODEL_NAME}", timeout=2)
                states = [v.get("state") for v in status.json().get("model_version_status", [])]
                if status.ok and "AVAILABLE" in states:
                    break
            except (requests.ConnectionError, requests.Timeout, ValueError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"modelyard serve not AVAILABLE after {START_TIMEOUT_S}s:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        yield {"rest": rest_port, "grpc": grpc_port}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def images_and_expected(lite_base):
    """Raw LiteRT answers (uint8 probabilities) of the latest version, in this process."""
    from ai_edge_litert.interpreter import Interpreter

    from modelyard.demo import demo_instances

    images = demo_instances(8)
    runner = Interpreter(model_path=str(lite_base / "0002" / "model.tflite")).get_signature_runner("serving_default")
    expected = runner(image=images)["probabilities"]
    assert expected.dtype == np.uint8  # the int8 version with integer I/O is the one served
    return images, expected


def test_rest_matches_litert(server, images_and_expected):
    import requests

    images, expected = images_and_expected
    response = requests.post(
        f"http://127.0.0.1:{server['rest']}/v1/models/{MODEL_NAME}:predict",
        data=json.dumps({"instances": images.tolist()}), timeout=30,
    )
    assert response.status_code == 200, response.text
    np.testing.assert_array_equal(np.asarray(response.json()["predictions"]), expected)


def test_grpc_matches_litert(server, images_and_expected):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    images, expected = images_and_expected
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL_NAME
    request.model_spec.signature_name = "serving_default"
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(images))
    with grpc.insecure_channel(f"127.0.0.1:{server['grpc']}") as channel:
        reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    assert reply.model_spec.version.value == 2
    np.testing.assert_array_equal(tf.make_ndarray(reply.outputs["probabilities"]), expected)
