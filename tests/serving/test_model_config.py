"""Must-show 5: a config with two models, a specific version policy and labels; reloading it over gRPC."""
from __future__ import annotations

import json

import grpc
import pytest
import requests

import modelyard  # noqa: F401
import tensorflow as tf
from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc, predict_pb2, prediction_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2

from tests.serving.affine_models import save_affine
from tests.serving.server_process import ServerProcess


def config_text(models: dict) -> str:
    """models: name -> (base_path, versions or None, labels)."""
    blocks = []
    for name, (base, versions, labels) in models.items():
        policy = ""
        if versions:
            policy = "model_version_policy { specific { " + " ".join(f"versions: {v}" for v in versions) + " } }"
        label_text = " ".join(f'version_labels {{ key: "{k}" value: {v} }}' for k, v in labels.items())
        blocks.append(f'config {{ name: "{name}" base_path: "{base}" model_platform: "tensorflow" {policy} {label_text} }}')
    return "model_config_list {\n" + "\n".join(blocks) + "\n}\n"


def predict(server, path, x=1.0):
    return requests.post(server.base + f"/v1/models/{path}:predict", data=json.dumps({"instances": [[x]]}))


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    for version in (1, 2, 3):
        save_affine(root / "alpha" / str(version), 1.0, 10.0 * version)  # alpha vN answers x + 10N
    save_affine(root / "beta" / "1", 2.0, 0.0)
    save_affine(root / "gamma" / "7", 3.0, 0.0)
    return root


@pytest.fixture(scope="module")
def server(bases, tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "models.config"
    path.write_text(config_text({
        "alpha": (bases / "alpha", [1, 3], {"stable": 1, "canary": 3}),
        "beta": (bases / "beta", None, {}),
    }))
    with ServerProcess("--model_config_file", str(path), log_dir=path.parent) as srv:
        yield srv


def test_specific_policy_loads_only_listed_versions(server):
    statuses = requests.get(server.base + "/v1/models/alpha").json()["model_version_status"]
    assert [(s["version"], s["state"]) for s in statuses] == [("3", "AVAILABLE"), ("1", "AVAILABLE")]
    assert predict(server, "alpha").json() == {"predictions": [[31.0]]}  # latest of the loaded
    assert predict(server, "alpha/versions/1").json() == {"predictions": [[11.0]]}
    assert predict(server, "alpha/versions/2").status_code == 404
    assert predict(server, "beta").json() == {"predictions": [[2.0]]}


def test_labels_over_rest_and_grpc(server):
    assert predict(server, "alpha/labels/stable").json() == {"predictions": [[11.0]]}
    assert predict(server, "alpha/labels/canary").json() == {"predictions": [[31.0]]}
    channel = grpc.insecure_channel(server.grpc_target)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "alpha"
    request.model_spec.version_label = "stable"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto([[1.0]], dtype=tf.float32))
    response = stub.Predict(request)
    assert tf.make_ndarray(response.outputs["y"]).tolist() == [[11.0]]
    assert response.model_spec.version.value == 1
    channel.close()


def _reload(server, text):
    channel = grpc.insecure_channel(server.grpc_target)
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    request = model_management_pb2.ReloadConfigRequest()
    from google.protobuf import text_format

    text_format.Parse(text, request.config)
    try:
        return stub.HandleReloadConfigRequest(request, timeout=120)
    finally:
        channel.close()


def test_reload_refuses_label_on_unavailable_version(server, bases):
    text = config_text({
        "alpha": (bases / "alpha", [1, 3], {"stable": 2}),
        "beta": (bases / "beta", None, {}),
    })
    with pytest.raises(grpc.RpcError) as info:
        _reload(server, text)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "Request to assign label to version 2 of model alpha, which is not currently available" in info.value.details()
    # nothing changed
    assert predict(server, "alpha/labels/stable").json() == {"predictions": [[11.0]]}
    assert predict(server, "beta").status_code == 200


def test_reload_adds_and_removes_models(server, bases):
    response = _reload(server, config_text({
        "alpha": (bases / "alpha", [1, 3], {"stable": 3}),
        "gamma": (bases / "gamma", None, {}),
    }))
    assert response.status.error_code == 0
    assert predict(server, "gamma").json() == {"predictions": [[3.0]]}
    assert predict(server, "alpha/labels/stable").json() == {"predictions": [[31.0]]}
    r = predict(server, "beta")
    assert r.status_code == 404
    assert r.json() == {"error": "Servable not found for request: Latest(beta); served models: alpha, gamma"}
    assert requests.get(server.base + "/v1/models/beta").status_code == 404
    assert predict(server, "alpha/labels/canary").status_code == 400  # labels are replaced as a set
