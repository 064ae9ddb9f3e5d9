"""The generated stand-ins answer exactly as TF Serving's own test models do (where ../shared has them).

One server serves both sources side by side (``gen_*`` and ``own_*``): the metadata JSON, every
signature's answers over REST and gRPC, and the broken export's status must be the same.
Without TF Serving's files this conformance check cannot run; it says so in its skip reason
and in the run's summary line (see tests/conftest.py).
"""
from __future__ import annotations

import base64
import json

import grpc
import numpy as np
import pytest
import requests

import modelyard  # noqa: F401  (TF environment first)
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from tests.conftest import SHARED
from tests.serving.server_process import ServerProcess
from tests.tfserving_models import configured_shared_path, expected_metadata

pytestmark = pytest.mark.skipif(
    SHARED is None,
    reason=f"conformance on TF Serving's own test models: not run ({configured_shared_path()} not found)",
)

FOLDERS = {
    "tf1": "saved_model_half_plus_two_cpu",
    "tf2": "saved_model_half_plus_two_tf2_cpu",
    "tflite": "saved_model_half_plus_two_tflite",
    "bad": "bad_half_plus_two",
}


@pytest.fixture(scope="module")
def both(generated_tfserving, monitoring_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("generated_vs_own")
    sources = {"gen": generated_tfserving, "own": SHARED}
    body = "".join(
        f'  config: {{ name: "{prefix}_{kind}" base_path: "{folder / sub}" model_platform: "tensorflow" }}\n'
        for prefix, folder in sources.items() for kind, sub in FOLDERS.items()
    )
    (root / "models.config").write_text("model_config_list: {\n" + body + "}\n")
    with ServerProcess("--model_config_file", str(root / "models.config"),
                       "--monitoring_config_file", str(monitoring_config), log_dir=root) as server:
        yield server


def get(server, path: str):
    return requests.get(server.base + path, timeout=30)


def post(server, path: str, body) -> requests.Response:
    return requests.post(server.base + path, data=json.dumps(body), timeout=30)


def test_metadata_file_is_tf_servings():
    assert expected_metadata("default", 123) == json.loads((SHARED / "half_plus_two_model_metadata.json").read_text())


@pytest.mark.parametrize("kind", ["tf1", "tf2", "tflite"])
def test_same_metadata_json(both, kind):
    gen, own = (get(both, f"/v1/models/{p}_{kind}/metadata") for p in ("gen", "own"))
    assert gen.status_code == own.status_code == 200, (gen.text, own.text)
    gen, own = gen.json(), own.json()
    assert gen["model_spec"].pop("name") == f"gen_{kind}" and own["model_spec"].pop("name") == f"own_{kind}"
    assert gen == own


X = np.random.default_rng(7).normal(scale=100, size=(16, 1)).astype(np.float32)
EXAMPLES = [{"x": float(v), "x2": float(-v)} for v in X[:, 0]]
REST_CASES = [
    ("tf1", "predict", {"instances": X.tolist()}),
    ("tf1", "predict", {"inputs": X.tolist()}),
    ("tf1", "predict", {"signature_name": "regress_x2_to_y3", "instances": X.tolist()}),
    ("tf1", "classify", {"signature_name": "classify_x_to_y", "examples": EXAMPLES}),
    ("tf1", "regress", {"signature_name": "regress_x_to_y", "examples": EXAMPLES}),
    ("tf1", "regress", {"signature_name": "regress_x_to_y2", "examples": EXAMPLES}),
    ("tf1", "regress", {"signature_name": "regress_x_to_y", "context": {"x": 4.0}, "examples": [{}, {}]}),
    ("tf1", "regress", {"signature_name": "regress_x_to_y", "examples": [{"x2": 1.0}]}),  # x is required
    ("tf1", "predict", {"instances": [[1.0, 2.0]]}),  # a shape the signature refuses
    ("tf2", "predict", {"instances": X.tolist()}),
    ("tf2", "predict", {"signature_name": "classify_x2_to_y3", "instances": [2.0]}),
    ("tf2", "predict", {"signature_name": "regress_x_to_y2",
                        "instances": [{"b64": base64.b64encode(tf.train.Example(features=tf.train.Features(feature={
                            "x": tf.train.Feature(float_list=tf.train.FloatList(value=[6.0]))})).SerializeToString()
                        ).decode()}]}),
    ("tflite", "predict", {"instances": [[2.0]]}),
]


@pytest.mark.parametrize("kind, verb, body", REST_CASES, ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(REST_CASES)])
def test_same_rest_answers(both, kind, verb, body):
    gen, own = (post(both, f"/v1/models/{p}_{kind}:{verb}", body) for p in ("gen", "own"))
    assert (gen.status_code, gen.content) == (own.status_code, own.content)


@pytest.mark.parametrize("kind, shape", [("tf1", (16, 1)), ("tf2", (16, 1)), ("tflite", (1, 1))])
def test_same_grpc_predictions(both, kind, shape):
    x = X[: shape[0]].reshape(shape)
    answers = []
    with grpc.insecure_channel(both.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for prefix in ("gen", "own"):
            request = predict_pb2.PredictRequest()
            request.model_spec.name = f"{prefix}_{kind}"
            request.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
            answers.append(stub.Predict(request, timeout=30).outputs["y"])
    assert answers[0] == answers[1]
    np.testing.assert_array_equal(tf.make_ndarray(answers[0]), x * np.float32(0.5) + np.float32(2.0))


def test_broken_export_fails_alike(both, generated_tfserving):
    gen, own = (get(both, f"/v1/models/{p}_bad").json()["model_version_status"] for p in ("gen", "own"))
    # The messages name each one's own folder; apart from that they must be the same.
    gen[0]["status"]["error_message"] = gen[0]["status"]["error_message"].replace(str(generated_tfserving), "<root>")
    own[0]["status"]["error_message"] = own[0]["status"]["error_message"].replace(str(SHARED), "<root>")
    assert gen == own
    assert (own[0]["state"], own[0]["status"]["error_code"]) == ("END", "NOT_FOUND")
