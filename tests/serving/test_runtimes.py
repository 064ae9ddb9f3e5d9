"""Serving at speed, runtimes: --runtime tensorflow, litert and auto answer TF Serving's models identically.

Three servers (one per runtime, module-scoped, started together) serve TF Serving's test
models plus ``tfonly``, a numeric model LiteRT cannot convert (it uses tf.data ops).
Signatures LiteRT cannot take (serialized tf.Examples: classify, regress) stay on
TensorFlow under every runtime; ``auto`` falls back to TensorFlow for ``tfonly`` while
``litert`` refuses to load it and says why in TF Serving's status JSON.
"""
from __future__ import annotations

import json
import re

import grpc
import numpy as np
import pytest
import requests

import modelyard  # noqa: F401  (TF environment first)
import tensorflow as tf
from tensorflow_serving.apis import classification_pb2, predict_pb2, prediction_service_pb2_grpc, regression_pb2

from tests.serving.affine_models import save_sleepy
from tests.serving.server_process import ServerProcess

RUNTIMES = ("tensorflow", "litert", "auto")
MODEL_FOLDERS = {
    "default": "saved_model_half_plus_two_cpu",
    "tf2": "saved_model_half_plus_two_tf2_cpu",
    "tflite": "saved_model_half_plus_two_tflite",
    "bad": "bad_half_plus_two",
}
METRICS = "/monitoring/prometheus/metrics"


class Flatten4(tf.Module):
    """``y = sum of the 4 values of each [2, 2] row``: a fixed inner shape, which LiteRT resizes differently."""

    @tf.function(input_signature=[tf.TensorSpec([None, 2, 2], tf.float32, name="x")])
    def serve(self, x):
        return {"y": tf.matmul(tf.reshape(x, [-1, 4]), tf.ones([4, 1]))}


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tfserving_testdata):
    root = tmp_path_factory.mktemp("runtimes")
    save_sleepy(root / "tfonly" / "1")
    flatten = Flatten4()
    tf.saved_model.save(flatten, str(root / "flatten" / "1"), signatures={"serving_default": flatten.serve})
    converter = tf.lite.TFLiteConverter.from_saved_model(str(root / "flatten" / "1"))
    (root / "flatten_tflite" / "1").mkdir(parents=True)
    (root / "flatten_tflite" / "1" / "model.tflite").write_bytes(converter.convert())
    body = "".join(
        f'  config: {{ name: "{name}" base_path: "{root / name if path is None else path}" '
        'model_platform: "tensorflow" }\n'
        for name, path in {**{name: tfserving_testdata / folder for name, folder in MODEL_FOLDERS.items()},
                           "tfonly": None, "flatten": None, "flatten_tflite": None}.items()
    )
    (root / "models.config").write_text("model_config_list: {\n" + body + "}\n")
    started = {
        runtime: ServerProcess(
            "--model_config_file", str(root / "models.config"), "--runtime", runtime,
            "--monitoring_config_file", str(tfserving_testdata / "monitoring_config.txt"),
            "--file_system_poll_wait_seconds", "0", log_dir=root,
        )
        for runtime in RUNTIMES
    }
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


def post(server, path: str, body) -> requests.Response:
    return requests.post(server.base + path, data=json.dumps(body), timeout=30)


def same_everywhere(servers, ask) -> object:
    """``ask(server)`` on every runtime; all must agree exactly. Returns the common answer."""
    answers = {runtime: ask(server) for runtime, server in servers.items()}
    first = answers["tensorflow"]
    for runtime, answer in answers.items():
        assert answer == first, f"--runtime {runtime} answered {answer!r}, --runtime tensorflow {first!r}"
    return first


REST_CASES = [
    ("/v1/models/default:predict", {"instances": [2.0, 3.0, 4.0]}, {"predictions": [3.0, 3.5, 4.0]}),
    ("/v1/models/default:predict", {"inputs": [2.0, 3.0, 4.0]}, {"outputs": [3.0, 3.5, 4.0]}),
    ("/v1/models/tf2:predict", {"instances": [[2.0], [3.0]]}, {"predictions": [[3.0], [3.5]]}),
    ("/v1/models/tflite:predict", {"instances": [[2.0]]}, {"predictions": [[3.0]]}),
    ("/v1/models/default:predict", {"signature_name": "regress_x2_to_y3", "instances": [[1.0], [2.0]]},
     {"predictions": [[3.5], [4.0]]}),
    ("/v1/models/default:classify", {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]},
     {"results": [[["", 3.0]]]}),
    ("/v1/models/default:regress", {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]},
     {"results": [3.0]}),
    ("/v1/models/default:regress", {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}, {"x": 6.0}]},
     {"results": [3.0, 5.0]}),
    # TF2 exports every signature with the predict method: Regress refuses it, as TF Serving does.
    ("/v1/models/tf2:regress", {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]},
     {"error": "Expected regression signature method_name to be tensorflow/serving/regress. "
               "Was: tensorflow/serving/predict"}),
]


@pytest.mark.parametrize("path, body, expected", REST_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(REST_CASES)])
def test_rest_answers_are_tf_servings_on_every_runtime(servers, path, body, expected):
    def ask(server):
        r = post(server, path, body)
        assert r.status_code == (400 if "error" in expected else 200), r.text
        return r.content  # the bytes themselves must match

    assert json.loads(same_everywhere(servers, ask)) == expected


def test_a_shape_the_signature_refuses_is_one_message_on_every_runtime(servers):
    """A shape the signature cannot take: V2's message in TF Serving's error format, the same on every runtime,
    not TensorFlow's internals (its reshape node) nor LiteRT's."""
    def ask(server, body):
        r = post(server, "/v1/models/flatten:predict", body)
        return r.status_code, r.content

    message = "input 'x' has shape [1, 1, 3]; the model expects [-1, 2, 2] (-1: any size)"
    status, error = same_everywhere(servers, lambda server: ask(server, {"instances": [[[1.0, 2.0, 3.0]]]}))
    assert status == 400 and json.loads(error) == {"error": message}, error

    def grpc_ask(server):  # gRPC Predict: the same words, under its status code
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "flatten"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.float32([[[1.0, 2.0, 3.0]]])))
        with grpc.insecure_channel(server.grpc_target) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
        return refused.value.code(), refused.value.details()

    assert same_everywhere(servers, grpc_ask) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    # V2 (the Open Inference Protocol) checks the shape before the model: the same rule, the same message.
    v2 = {"inputs": [{"name": "x", "shape": [1, 1, 3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]}
    answer = post(servers["tensorflow"], "/v2/models/flatten/infer", v2)
    assert answer.status_code == 400 and answer.json() == {"error": message}, answer.text
    # The interpreter that refused is fine afterwards: a good request is answered on every runtime.
    status, answer = same_everywhere(servers, lambda server: ask(server, {"instances": [[[1.0, 2.0], [3.0, 4.0]]]}))
    assert status == 200 and json.loads(answer) == {"predictions": [[10.0]]}


def test_shape_a_bare_tflite_model_cannot_take_is_the_requests_error(servers):
    """A ``model.tflite`` version (LiteRT only, no session behind it): 400 naming the shape, then fine."""
    def ask(server, body):
        r = post(server, "/v1/models/flatten_tflite:predict", body)
        return r.status_code, r.json()

    for server in servers.values():
        status, error = ask(server, {"instances": [[[1.0, 2.0, 3.0]]]})
        assert status == 400 and error["error"].startswith("input 'x' has shape [1, 1, 3]; the model expects "), error
        assert ask(server, {"instances": [[[1.0, 2.0], [3.0, 4.0]]]}) == (200, {"predictions": [[10.0]]})
        status, error = ask(server, {"instances": [[[1.0, 2.0, 3.0]]] * 2})
        assert status == 400, error
        assert ask(server, {"instances": [[[1.0, 2.0], [3.0, 4.0]]] * 3}) == (200, {"predictions": [[10.0]] * 3})


@pytest.mark.parametrize("model", ["default", "tf2", "tflite"])
def test_random_inputs_bitwise_identical_over_grpc_and_rest(servers, model):
    x = np.random.default_rng(3).normal(scale=1000, size=(64, 1)).astype(np.float32)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(x))

    def grpc_ask(server):
        with grpc.insecure_channel(server.grpc_target) as channel:
            response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
        return tf.make_ndarray(response.outputs["y"]).tobytes()

    y = np.frombuffer(same_everywhere(servers, grpc_ask), np.float32).reshape(64, 1)
    assert np.array_equal(y, x * np.float32(0.5) + np.float32(2.0))
    same_everywhere(servers, lambda server: post(server, f"/v1/models/{model}:predict",
                                                 {"instances": x.tolist()}).content)


def test_grpc_classify_and_regress_on_every_runtime(servers):
    example = tf.train.Example(features=tf.train.Features(feature={"x": tf.train.Feature(
        float_list=tf.train.FloatList(value=[2.0]))}))

    def ask(server):
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            classify = classification_pb2.ClassificationRequest()
            classify.model_spec.name = "default"
            classify.model_spec.signature_name = "classify_x_to_y"
            classify.input.example_list.examples.add().CopyFrom(example)
            regress = regression_pb2.RegressionRequest()
            regress.model_spec.name = "default"
            regress.model_spec.signature_name = "regress_x_to_y"
            regress.input.example_list.examples.add().CopyFrom(example)
            c = stub.Classify(classify, timeout=30).result.classifications[0].classes[0].score
            r = stub.Regress(regress, timeout=30).result.regressions[0].value
        return c, r

    assert same_everywhere(servers, ask) == (3.0, 3.0)


def test_status_and_metadata_identical_on_every_runtime(servers, tfserving_testdata):
    for model in ("default", "tf2", "tflite", "bad"):
        same_everywhere(servers, lambda server: requests.get(f"{server.base}/v1/models/{model}").content)
    metadata = same_everywhere(servers, lambda s: requests.get(f"{s.base}/v1/models/default/metadata").json())
    assert metadata == json.loads((tfserving_testdata / "half_plus_two_model_metadata.json").read_text())


def runtime_gauges(server) -> dict[tuple[str, str], float]:
    """{(model, runtime): value} from the server's model_runtime gauge."""
    text = requests.get(server.base + METRICS, timeout=10).text
    pattern = r':modelyard:serving:model_runtime\{model_name="([^"]+)",version="\d+",runtime="([^"]+)"\} (\S+)'
    return {(m, rt): float(v) for m, rt, v in re.findall(pattern, text)}


def test_metrics_and_log_say_which_runtime_serves_each_version(servers, tfserving_testdata):
    tf_only = {("default", "tensorflow"): 1, ("tf2", "tensorflow"): 1, ("tfonly", "tensorflow"): 1,
               ("tflite", "litert"): 1, ("flatten", "tensorflow"): 1, ("flatten_tflite", "litert"): 1}
    assert runtime_gauges(servers["tensorflow"]) == tf_only
    # auto: predict signatures on LiteRT, Example-taking ones on TensorFlow; tfonly falls back whole.
    mixed = {("default", "litert"): 1, ("default", "tensorflow"): 1, ("tf2", "litert"): 1,
             ("tf2", "tensorflow"): 1, ("tfonly", "tensorflow"): 1, ("tflite", "litert"): 1,
             ("flatten", "litert"): 1, ("flatten_tflite", "litert"): 1}
    assert runtime_gauges(servers["auto"]) == mixed
    # litert: the same, except tfonly, which it refuses (see below).
    assert runtime_gauges(servers["litert"]) == {k: v for k, v in mixed.items() if k[0] != "tfonly"}
    for runtime in ("auto", "litert"):
        log = servers[runtime].log()
        default = tfserving_testdata / MODEL_FOLDERS["default"] / "00000123"
        assert f"Signature serving_default of {default} runs on LiteRT (outputs match TensorFlow)" in log
        assert f"Signature classify_x_to_y of {default} stays on TensorFlow" in log
    assert re.search(r"Signature serving_default of \S+/tfonly/1 stays on TensorFlow: ConvertError",
                     servers["auto"].log())
    assert "runs on LiteRT" not in servers["tensorflow"].log()


def test_auto_falls_back_where_litert_cannot_convert(servers):
    ok = {"model_version_status": [{"version": "1", "state": "AVAILABLE",
                                    "status": {"error_code": "OK", "error_message": ""}}]}
    for runtime in ("tensorflow", "auto"):
        server = servers[runtime]
        assert requests.get(server.base + "/v1/models/tfonly").json() == ok
        r = post(server, "/v1/models/tfonly:predict", {"instances": [[2.0, 0.0]]})
        assert r.json() == {"predictions": [[5.0]]}
    # --runtime litert insists: the version does not load, and status says why in TF Serving's form.
    status = requests.get(servers["litert"].base + "/v1/models/tfonly").json()["model_version_status"]
    assert [(s["version"], s["state"], s["status"]["error_code"]) for s in status] == [("1", "END", "FAILED_PRECONDITION")]
    assert status[0]["status"]["error_message"].startswith(
        "--runtime litert cannot serve signature serving_default: ConvertError")
    r = post(servers["litert"], "/v1/models/tfonly:predict", {"instances": [[2.0, 0.0]]})
    assert r.status_code == 404 and r.json() == {"error": "Servable not found for request: Latest(tfonly)"}
