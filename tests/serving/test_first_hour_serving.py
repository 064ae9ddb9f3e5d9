"""Serving's first-hour messages (issue 13), each through the real ``modelyard serve`` process.

A base path at a version directory or at a bare SavedModel, no model that can ever load, a
taken port with several workers, dash spellings of the flags, a huge body quoted in an error,
the model listing, a mistyped model name, the uint8 hint, and batching made visible.
"""
from __future__ import annotations

import json
import re
import socket

import numpy as np
import pytest
import requests
import tensorflow as tf

from modelyard.ports import PORT_TAKEN_EXIT, free_port
from tests.cli_process import modelyard
from tests.serving.affine_models import save_affine
from tests.serving.server_process import ServerProcess, wait_for


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """``models/m`` with version 1 (y = 2x + 1), the layout a base path must have."""
    base = tmp_path_factory.mktemp("models") / "m"
    save_affine(base / "1", 2.0, 1.0)
    return base


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " INFO " not in line and line.strip()]


# -- where --model_base_path points ---------------------------------------------------------------

def test_a_version_directory_says_which_base_path_to_use(model_dir):
    result = modelyard("serve", "--model_base_path", str(model_dir / "1"))
    assert result.returncode == 2
    assert _error_lines(result.stderr) == [
        f"modelyard serve: error: {model_dir / '1'} is a version directory of {model_dir}: "
        f"use --model_base_path {model_dir}"]


def test_the_dash_spelling_of_a_flag_is_the_flag(model_dir):
    # Same answer as above: --model-base-path reached the same check, and --rest-api-port=0 parsed.
    result = modelyard("serve", "--model-base-path", str(model_dir / "1"), "--rest-api-port=0")
    assert result.returncode == 2
    assert f"is a version directory of {model_dir}: use --model_base_path {model_dir}" in result.stderr


def test_a_bare_saved_model_says_how_to_make_it_a_version(tmp_path):
    save_affine(tmp_path / "mnist_sm", 1.0, 0.0)
    result = modelyard("serve", "--model_base_path", "mnist_sm", cwd=tmp_path)
    assert result.returncode == 2
    assert _error_lines(result.stderr) == [
        "modelyard serve: error: mnist_sm is a model itself, not a base path of versions: put it in a numbered "
        "version directory (mkdir -p models/mnist_sm && mv mnist_sm models/mnist_sm/1) and use "
        "--model_base_path models/mnist_sm"]


def test_no_model_that_can_load_stops_the_server_with_why(tmp_path, model_dir):
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "1" / "saved_model.pb").write_bytes(b"not a SavedModel")
    config = tmp_path / "models.config"
    config.write_text("model_config_list {\n"
                      f'  config {{ name: "a" base_path: "{model_dir / "1"}" model_platform: "tensorflow" }}\n'
                      f'  config {{ name: "b" base_path: "{tmp_path / "broken"}" model_platform: "tensorflow" }}\n'
                      "}\n")
    result = modelyard("serve", "--model_config_file", str(config), "--port", str(free_port()),
                       "--rest_api_port", str(free_port()))
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("modelyard serve: error: no model can be served: "), result.stderr
    assert f"model a: {model_dir / '1'} is a version directory of {model_dir}: use base_path: {model_dir}" in last
    assert "model b could not load (version 1: " in last
    assert "serving the rest" not in result.stderr and "Traceback" not in result.stderr


def test_a_config_whose_base_path_does_not_exist_names_it(tmp_path):
    # With a label on it, the label's version is unavailable only because the path is not there: say that.
    config = tmp_path / "models.config"
    config.write_text("model_config_list {\n"
                      f'  config {{ name: "m" base_path: "{tmp_path / "nope"}" model_platform: "tensorflow" '
                      'version_labels { key: "stable" value: 1 } }\n}\n')
    result = modelyard("serve", "--model_config_file", str(config), "--port", str(free_port()),
                       "--rest_api_port", str(free_port()))
    assert result.returncode == 1, result.stderr
    assert _error_lines(result.stderr) == [
        f"modelyard serve: error: Model m: base path {tmp_path / 'nope'} does not exist "
        f"(check base_path: {tmp_path / 'nope'}, or create it)"], result.stderr


def test_missing_base_path_says_where_it_was_set(tmp_path):
    from modelyard.serving.manager.versions import missing_base_path

    assert missing_base_path(tmp_path) is None
    assert missing_base_path(tmp_path / "x") == (f"base path {tmp_path / 'x'} does not exist "
                                                 f"(check --model_base_path {tmp_path / 'x'}, or create it)")


def test_an_empty_base_path_waits_for_its_first_version(tmp_path, model_dir):
    # A version can still land there (an export), so the server runs, says so, and lists the model.
    (tmp_path / "later").mkdir()
    with ServerProcess("--model_base_path", str(tmp_path / "later"), "--model_name", "later",
                       "--file_system_poll_wait_seconds", "1", log_dir=tmp_path) as server:
        assert "Model later has no versions under" in server.log() and "waiting for one" in server.log()
        assert requests.get(server.base + "/v1/models").json() == {
            "models": [{"name": "later", "version_labels": {}, "model_version_status": []}]}
        save_affine(tmp_path / "later" / "1", 3.0, 0.0)
        wait_for(lambda: requests.post(server.base + "/v1/models/later:predict",
                                       json={"instances": [[1.0]]}).status_code == 200, 60, what="version 1")


def test_several_workers_on_a_taken_port_say_it_in_one_line(model_dir):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = modelyard("serve", "--workers", "2", "--port", str(port), "--rest_api_port", str(free_port()),
                           "--model_base_path", str(model_dir))
    assert result.returncode == PORT_TAKEN_EXIT  # as one process would: the caller may pick another port
    assert _error_lines(result.stderr) == [
        f"modelyard serve: error: cannot bind gRPC port 0.0.0.0:{port} (Address already in use): "
        "is another server running? Use --port"], result.stderr


def test_several_workers_on_a_taken_rest_port_say_it_before_any_worker_starts(model_dir):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = modelyard("serve", "--workers", "2", "--port", str(free_port()), "--rest_api_port", str(port),
                           "--model_base_path", str(model_dir))
    assert result.returncode == PORT_TAKEN_EXIT
    assert _error_lines(result.stderr) == [
        f"modelyard serve: error: cannot bind REST port 0.0.0.0:{port} (Address already in use): use --rest_api_port"
    ], result.stderr
    assert "worker:" not in result.stderr, result.stderr  # the supervisor checked the ports: no worker started


# -- answers of the running server ----------------------------------------------------------------

def test_an_error_quoting_a_big_body_is_cut(testdata_server):
    body = json.dumps([[0.5] * 100] * 100)  # ~50 kB (the shared server takes up to 100 kB), an array, not an object
    r = requests.post(testdata_server.base + "/v1/models/default:predict", data=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error.startswith("JSON Value: [\n    [\n        0.5,") and error.endswith("... (cut) Is not object")
    assert len(error) < 400  # the quote is at most 300 characters; whole, it would be ~150 kB


def test_a_short_body_is_quoted_whole(testdata_server):
    r = requests.post(testdata_server.base + "/v1/models/default:predict", data="[1.0]")
    assert r.status_code == 400
    assert r.json() == {"error": "JSON Value: [\n    1.0\n] Is not object"}  # TF Serving's text


def test_get_models_lists_every_model_with_its_versions(testdata_server):
    r = requests.get(testdata_server.base + "/v1/models")
    assert r.status_code == 200
    listed = {m["name"]: [(s["version"], s["state"], s["status"]["error_code"]) for s in m["model_version_status"]]
              for m in r.json()["models"]}
    assert listed["default"] == [("123", "AVAILABLE", "OK")]
    assert listed["tflite"] == [("123", "AVAILABLE", "OK")]
    assert set(listed) == {"default", "tf2", "tflite", "bad"}
    assert listed["bad"][0][1] == "END" and listed["bad"][0][2] != "OK"  # failed: listed with why


def test_a_mistyped_model_name_is_told_the_served_ones(testdata_server):
    r = requests.post(testdata_server.base + "/v1/models/defualt:predict", json={"instances": [[1.0]]})
    assert r.status_code == 404
    assert r.json() == {"error": "Servable not found for request: Latest(defualt); served models: default, tf2, tflite"}


# -- a uint8 image model, batching ---------------------------------------------------------------

class _Pixels(tf.Module):
    """An image model taking raw uint8 pixels and rescaling them itself, as `--io-dtype uint8` makes."""

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.uint8, name="pixels")])
    def serve(self, pixels):
        return {"mean": tf.reduce_mean(tf.cast(pixels, tf.float32) / 255.0, axis=1)}


@pytest.fixture(scope="module")
def pixels_server(tmp_path_factory, monitoring_config):
    base = tmp_path_factory.mktemp("pixels") / "pixels"
    module = _Pixels()
    tf.saved_model.save(module, str(base / "1"), signatures={"serving_default": module.serve})
    batching = base.parent / "batching.txt"
    batching.write_text("max_batch_size { value: 8 }\nbatch_timeout_micros { value: 2000 }\n"
                        "num_batch_threads { value: 2 }\nallowed_batch_sizes: 4\nallowed_batch_sizes: 8\n")
    with ServerProcess("--model_base_path", str(base), "--model_name", "pixels", "--enable_batching",
                       "--batching_parameters_file", str(batching), "--monitoring_config_file", str(monitoring_config),
                       log_dir=base.parent) as server:
        yield server


@pytest.mark.parametrize("instances", [[[0.5, 0.1, 0.0, 1.0]], [[300, 0, 0, 0]], [[-1, 0, 0, 0]]],
                         ids=["fractions", "above 255", "negative"])
def test_a_uint8_input_says_what_to_send(pixels_server, instances):
    r = requests.post(pixels_server.base + "/v1/models/pixels:predict", json={"instances": instances})
    assert r.status_code == 400
    assert r.json()["error"].endswith("(send integers 0-255: this model rescales itself)"), r.text
    ok = requests.post(pixels_server.base + "/v1/models/pixels:predict", json={"instances": [[255, 255, 0, 0]]})
    assert ok.json() == {"predictions": [0.5]}


def test_a_uint8_input_over_grpc_says_what_to_send(pixels_server):
    import grpc
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "pixels"
    request.inputs["pixels"].CopyFrom(tf.make_tensor_proto(np.full((1, 4), 0.5, np.float32)))
    with grpc.insecure_channel(pixels_server.grpc_target) as channel:
        with pytest.raises(grpc.RpcError) as info:
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == ("Expects arg[pixels] to be uint8 but float is provided "
                                    "(send integers 0-255: this model rescales itself)")


def _samples(server) -> dict[str, float]:
    text = requests.get(server.base + "/monitoring/prometheus/metrics").text
    return {name: float(value) for name, value in re.findall(r"^(\S+) (\S+)$", text, re.M)}


def test_batching_is_logged_at_load_and_measured(pixels_server):
    assert ("Model pixels version 1 batches: max_batch_size 8, batch_timeout_micros 2000, max_enqueued_batches "
            in pixels_server.log())
    assert "num_batch_threads 2, allowed_batch_sizes [4, 8]" in pixels_server.log()
    before = _samples(pixels_server)
    for n in (1, 3, 6):  # one after the other: each request is alone in its batch
        r = requests.post(pixels_server.base + "/v1/models/pixels:predict", json={"instances": [[0, 0, 0, 0]] * n})
        assert r.status_code == 200 and r.json() == {"predictions": [0.0] * n}
    after = _samples(pixels_server)
    prefix = ":tensorflow:serving:batching_session:"
    model = '{model_name="pixels"}'

    def grew(name: str) -> float:
        assert name in after, f"{name} missing from the metrics: {sorted(after)[:40]}"
        return after[name] - before.get(name, 0.0)

    assert grew(f"{prefix}wrapped_run_count{model}") == 3
    assert grew(f"{prefix}input_batch_size_count{model}") == 3
    assert grew(f"{prefix}input_batch_size_sum{model}") == 10  # rows sent
    assert grew(f"{prefix}processed_batch_size_sum{model}") == 16  # padded to allowed sizes: 4 + 4 + 8
    assert grew(f"{prefix}queuing_latency_count"
                '{thread_pool_name="model_server_batch_threads",model_name="pixels"}') == 3
