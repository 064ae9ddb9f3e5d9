"""The Open Inference Protocol (KServe V2) on a real ``modelyard serve``, with stock ``tritonclient``.

One server for the module serves a uint8 digits model, a multi-input/multi-output model
(FP32, INT32, BYTES in; FP32, FP64, BYTES out) and TF Serving's TF1 half_plus_two; V2
answers are compared with TF Serving's ``:predict`` on the same server.
"""
from __future__ import annotations

import socket

import numpy as np
import pytest
import requests

try:
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp
    from tritonclient.utils import InferenceServerException
except ImportError as exc:  # a test that cannot find its client fails saying how to get it
    raise ImportError(f"{exc}: install the test extra, pip install -e '.[test]' (tritonclient[http])") from None

from tests.serving.server_process import ServerProcess
from tests.serving.v2_models import build
from tests.tfserving_models import shared_testdata, write_tfserving_models

IMAGES = np.random.default_rng(3).integers(0, 256, size=(4, 28, 28), dtype=np.uint8)


@pytest.fixture(scope="module")
def v2_server(tmp_path_factory):
    models = build(tmp_path_factory.mktemp("v2models"))
    testdata = shared_testdata() or write_tfserving_models(tmp_path_factory.mktemp("tfserving"))
    config = models / "models.config"
    entries = {"digits": models / "digits", "multi": models / "multi",
               "half": testdata / "saved_model_half_plus_two_cpu"}
    config.write_text("model_config_list: {\n" + "".join(
        f'  config: {{ name: "{n}" base_path: "{p}" model_platform: "tensorflow" }}\n' for n, p in entries.items())
        + "}\n")
    with ServerProcess("--model_config_file", str(config), log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server


@pytest.fixture(scope="module")
def http(v2_server):
    client = thttp.InferenceServerClient(f"127.0.0.1:{v2_server.rest_port}")
    yield client
    client.close()


def _input(module, name, array, datatype, binary=None):
    tensor = module.InferInput(name, list(array.shape), datatype)
    if binary is None:
        tensor.set_data_from_numpy(array)
    else:
        tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def _tf_predict(server, model, inputs: dict) -> dict:
    body = {"inputs": {k: (v.astype(str).tolist() if v.dtype == object else v.tolist()) for k, v in inputs.items()}}
    answer = requests.post(f"{server.base}/v1/models/{model}:predict", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["outputs"]


# ---- health, metadata, readiness -------------------------------------------------------------------
def test_health_and_server_metadata(http, v2_server):
    assert http.is_server_live() and http.is_server_ready()
    metadata = http.get_server_metadata()
    assert metadata["name"] == "modelyard" and "binary_tensor_data" in metadata["extensions"]
    assert http.is_model_ready("digits") and http.is_model_ready("half", "123")
    assert not http.is_model_ready("digits", "9") and not http.is_model_ready("nope")
    assert requests.get(f"{v2_server.base}/v2/models/nope/ready", timeout=5).status_code == 503


def test_model_metadata_follows_the_signature(http):
    digits = http.get_model_metadata("digits")
    assert digits["versions"] == ["1"] and digits["platform"] == "tensorflow_savedmodel"
    assert digits["inputs"] == [{"name": "image", "datatype": "UINT8", "shape": [-1, 28, 28]}]
    assert sorted((o["name"], o["datatype"], o["shape"]) for o in digits["outputs"]) == [
        ("digit", "INT64", [-1]), ("probabilities", "FP32", [-1, 10])]
    multi = http.get_model_metadata("multi", "1")
    assert {i["name"]: i["datatype"] for i in multi["inputs"]} == {"a": "FP32", "b": "INT32", "tag": "BYTES"}
    assert {o["name"]: o["datatype"] for o in multi["outputs"]} == {"scaled": "FP32", "total": "FP64",
                                                                    "echo": "BYTES"}
    half = http.get_model_metadata("half")
    assert half["versions"] == ["123"] and half["inputs"][0] == {"name": "x", "datatype": "FP32", "shape": [-1, 1]}


# ---- infer: JSON, binary, and TF Serving's :predict agree ----------------------------------------
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_digits_infer_matches_tf_serving_predict(http, v2_server, binary):
    expected = _tf_predict(v2_server, "digits", {"image": IMAGES})
    outputs = [thttp.InferRequestedOutput("probabilities", binary_data=binary),
               thttp.InferRequestedOutput("digit", binary_data=binary)]
    result = http.infer("digits", [_input(thttp, "image", IMAGES, "UINT8", binary)], outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("probabilities"), np.float32(expected["probabilities"]))
    np.testing.assert_array_equal(result.as_numpy("digit"), expected["digit"])
    response = result.get_response()
    assert response["model_version"] == "1"
    assert [o["name"] for o in response["outputs"]] == ["probabilities", "digit"]  # the order asked for
    assert ("parameters" in response["outputs"][0]) == binary


def test_multi_io_infer_all_outputs_binary_by_default(http, v2_server):
    a = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    b = np.array([2, -3], dtype=np.int32)
    tag = np.array([b"one", "dé".encode()], dtype=object)
    result = http.infer("multi", [_input(thttp, "a", a, "FP32"), _input(thttp, "b", b, "INT32", False),
                                  _input(thttp, "tag", tag, "BYTES")], request_id="r-1")
    expected = _tf_predict(v2_server, "multi", {"a": a, "b": b, "tag": np.array(["one", "dé"], dtype=object)})
    np.testing.assert_array_equal(result.as_numpy("scaled"), np.float32(expected["scaled"]))
    assert result.as_numpy("total").dtype == np.float64
    np.testing.assert_array_equal(result.as_numpy("total"), expected["total"])
    assert [v.decode() for v in result.as_numpy("echo")] == expected["echo"]
    assert result.as_numpy("echo").tolist() == [b"one!", "dé!".encode()]
    assert result.get_response()["id"] == "r-1"


def test_nested_json_data_a_version_and_requested_output(v2_server):
    body = {"inputs": [{"name": "x", "shape": [3, 1], "datatype": "FP32", "data": [[1.0], [2], [3.5]]}],
            "outputs": [{"name": "y"}]}
    answer = requests.post(f"{v2_server.base}/v2/models/half/versions/123/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [3, 1], "data": [2.5, 3.0, 3.75]}]


# ---- bad input: V2's error body, the right status, the model stays ready ------------------------
def _post(server, path, body: bytes, headers=None):
    return requests.post(f"{server.base}{path}", data=body, headers=headers or {}, timeout=30)


@pytest.mark.parametrize("path, body, status, words", [
    ("/v2/models/nope/infer", b'{"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}',
     404, "Servable not found"),
    ("/v2/models/half/versions/7/infer",
     b'{"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}', 404, "Specific(half, 7)"),
    ("/v2/models/half/infer", b'{"inputs": [{"name": "x", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}',
     400, "has datatype INT32; the model expects FP32"),
    ("/v2/models/half/infer", b'{"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1,2,3,4]}]}',
     400, "has shape [2, 2]; the model expects [-1, 1]"),
    ("/v2/models/half/infer", b'{"inputs": [{"name": "x", "shape": [3, 1], "datatype": "FP32", "data": [1, 2]}]}',
     400, "holds 3 elements but 'data' has 2"),
    ("/v2/models/half/infer", b'{"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP33", "data": [1]}]}',
     400, "unknown datatype 'FP33'"),
    ("/v2/models/digits/infer", b'{"inputs": [{"name": "image", "shape": [1, 28, 28], "datatype": "UINT8", '
     b'"data": [' + b",".join([b"300"] * 784) + b"]}]}", 400, "out of range for uint8"),
    ("/v2/models/half/infer", b'{"inputs": [{"name": "z", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}',
     400, "unexpected inference input 'z'"),
    ("/v2/models/half/infer", b'{"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}], '
     b'"outputs": [{"name": "nope"}]}', 400, "output tensor alias not found in signature: nope"),
    ("/v2/models/half/infer", b'{"inputs": [{"name": "x", "shape": [1, 1], "datat', 400, "malformed JSON"),
    ("/v2/models/half/infer", b'{"outputs": []}', 400, "no 'inputs'"),
], ids=["unknown-model", "unknown-version", "datatype", "shape", "count", "bad-datatype", "range",
        "unknown-input", "unknown-output", "truncated-json", "no-inputs"])
def test_bad_json_requests(v2_server, http, path, body, status, words):
    answer = _post(v2_server, path, body)
    assert answer.status_code == status, answer.text
    assert list(answer.json()) == ["error"] and words in answer.json()["error"], answer.text
    assert http.is_model_ready("half") and http.is_model_ready("digits")


def _binary_body(tensor_json: dict, raw: bytes, declared: int | None = None):
    import json

    head = json.dumps({"inputs": [tensor_json]}).encode()
    return head + raw, {"Inference-Header-Content-Length": str(len(head) if declared is None else declared)}


@pytest.mark.parametrize("size, raw, declared, words", [
    (8, np.float32([1, 2]).tobytes(), None, "needs 12 bytes but 8 were sent"),
    (12, np.float32([1, 2]).tobytes(), None, "runs past the binary data"),
    (12, np.float32([1, 2, 3, 4]).tobytes(), None, "carries 16 bytes of binary data but its inputs declare 12"),
    (8, np.float32([1, 2]).tobytes(), 10_000, "Inference-Header-Content-Length is 10000"),
], ids=["size-vs-shape", "size-past-body", "leftover-bytes", "header-past-body"])
def test_bad_binary_requests(v2_server, http, size, raw, declared, words):
    tensor = {"name": "x", "shape": [3, 1], "datatype": "FP32", "parameters": {"binary_data_size": size}}
    body, headers = _binary_body(tensor, raw, declared)
    answer = _post(v2_server, "/v2/models/half/infer", body, headers)
    assert answer.status_code == 400 and words in answer.json()["error"], answer.text
    assert http.is_model_ready("half")


def test_a_truncated_body_is_refused_and_the_server_keeps_serving(v2_server, http):
    head = b'{"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}'
    with socket.create_connection(("127.0.0.1", v2_server.rest_port), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/half/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n" + head)
        sock.shutdown(socket.SHUT_WR)  # the body ends 500 - len(head) bytes early
        sock.recv(1000)
    assert http.is_model_ready("half")
    np.testing.assert_array_equal(
        http.infer("half", [_input(thttp, "x", np.float32([[4]]), "FP32")]).as_numpy("y"), [[4.0]])


# ---- gRPC: inference.GRPCInferenceService on the gRPC port, beside PredictionService ---------------
@pytest.fixture(scope="module")
def grpc(v2_server):
    client = tgrpc.InferenceServerClient(v2_server.grpc_target)
    yield client
    client.close()


def test_grpc_health_metadata_and_readiness(grpc):
    assert grpc.is_server_live() and grpc.is_server_ready()
    assert grpc.get_server_metadata().name == "modelyard"
    assert grpc.is_model_ready("digits") and grpc.is_model_ready("half", "123")
    assert not grpc.is_model_ready("nope") and not grpc.is_model_ready("digits", "2")
    metadata = grpc.get_model_metadata("digits", as_json=True)
    assert metadata["inputs"] == [{"name": "image", "datatype": "UINT8", "shape": ["-1", "28", "28"]}]
    assert metadata["versions"] == ["1"]


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "typed-contents"])
def test_grpc_infer_matches_tf_serving_predict(grpc, v2_server, raw):
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    import grpc as grpcio

    expected = _tf_predict(v2_server, "digits", {"image": IMAGES})
    if raw:  # tritonclient sends raw_input_contents
        result = grpc.infer("digits", [_input(tgrpc, "image", IMAGES, "UINT8")],
                            outputs=[tgrpc.InferRequestedOutput("probabilities")])
        assert [o.name for o in result.get_response().outputs] == ["probabilities"]
        probabilities = result.as_numpy("probabilities")
    else:  # typed contents, with the generated stub itself
        request = service_pb2.ModelInferRequest(model_name="digits", model_version="1")
        tensor = request.inputs.add(name="image", datatype="UINT8", shape=IMAGES.shape)
        tensor.contents.uint_contents.extend(IMAGES.reshape(-1).tolist())
        with grpcio.insecure_channel(v2_server.grpc_target) as channel:
            response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
        names = [o.name for o in response.outputs]
        assert response.model_version == "1" and sorted(names) == ["digit", "probabilities"]
        probabilities = np.frombuffer(response.raw_output_contents[names.index("probabilities")], "<f4")
        probabilities = probabilities.reshape(4, 10)
    np.testing.assert_array_equal(probabilities, np.float32(expected["probabilities"]))


def test_grpc_multi_io_matches_tf_serving_grpc_predict(grpc, v2_server):
    import grpc as grpcio
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from modelyard.model.tensor_proto import from_ndarray, to_ndarray

    inputs = {"a": np.float32([[1, 2, 3], [0.5, -1, 4]]), "b": np.int32([5, -2]),
              "tag": np.array([b"t", b"u v"], dtype=object)}
    result = grpc.infer("multi", [_input(tgrpc, "a", inputs["a"], "FP32"), _input(tgrpc, "b", inputs["b"], "INT32"),
                                  _input(tgrpc, "tag", inputs["tag"], "BYTES")])
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "multi"
    for alias, value in inputs.items():
        from_ndarray(value, request.inputs[alias])
    with grpcio.insecure_channel(v2_server.grpc_target) as channel:
        expected = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    for alias in ("scaled", "total", "echo"):
        want = to_ndarray(expected.outputs[alias], alias)
        got = result.as_numpy(alias)
        assert got.dtype == want.dtype and got.tolist() == want.tolist(), alias
    assert result.as_numpy("echo").tolist() == [b"t!", b"u v!"] and result.as_numpy("total").tolist() == [30.0, -7.0]


@pytest.mark.parametrize("model, tensor, code, words", [
    ("nope", ("x", np.float32([[1]]), "FP32"), "NOT_FOUND", "Servable not found"),
    ("half", ("x", np.int32([[1]]), "INT32"), "INVALID_ARGUMENT", "has datatype INT32; the model expects FP32"),
    ("half", ("x", np.float32([[1, 2]]), "FP32"), "INVALID_ARGUMENT", "has shape [1, 2]"),
], ids=["unknown-model", "datatype", "shape"])
def test_grpc_bad_input(grpc, model, tensor, code, words):
    with pytest.raises(InferenceServerException) as caught:
        grpc.infer(model, [_input(tgrpc, *tensor)])
    assert caught.value.status() == f"StatusCode.{code}" and words in caught.value.message()
    assert grpc.is_model_ready("half")


def test_grpc_raw_size_mismatch_and_prediction_service_beside_it(grpc, v2_server):
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    import grpc as grpcio
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name="half")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 1])
    request.raw_input_contents.append(np.float32([1]).tobytes())
    with grpcio.insecure_channel(v2_server.grpc_target) as channel:
        with pytest.raises(grpcio.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
        assert caught.value.code() == grpcio.StatusCode.INVALID_ARGUMENT
        assert "needs 8 bytes but 4 were sent" in caught.value.details()
        # TF Serving's PredictionService still answers on the same port.
        predict = predict_pb2.PredictRequest()
        predict.model_spec.name = "half"
        x = predict.inputs["x"]
        x.dtype = 1  # DT_FLOAT
        x.tensor_shape.dim.add(size=1)
        x.tensor_shape.dim.add(size=1)
        x.float_val.append(2.0)
        answer = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(predict, timeout=30)
        assert list(answer.outputs["y"].float_val) == [3.0]


# ---- the model repository extension: unload and load while another model answers without pause -----
def test_repository_unload_and_load_while_another_model_serves(http, grpc, v2_server):
    import threading

    stop, failures, answered = threading.Event(), [], [0]

    def keep_sending():
        client = thttp.InferenceServerClient(f"127.0.0.1:{v2_server.rest_port}")
        try:
            while not stop.is_set():
                try:
                    client.infer("digits", [_input(thttp, "image", IMAGES[:1], "UINT8")])
                    answered[0] += 1
                except Exception as exc:  # every failure counts: none is allowed
                    failures.append(repr(exc))
        finally:
            client.close()

    sender = threading.Thread(target=keep_sending)
    sender.start()
    try:
        assert {"name": "multi", "version": "1", "state": "READY", "reason": ""} in http.get_model_repository_index()
        http.unload_model("multi")
        assert not http.is_model_ready("multi")
        entries = {e["name"]: e for e in http.get_model_repository_index()}
        assert entries["multi"]["state"] == "UNAVAILABLE" and entries["multi"]["reason"] == "unloaded"
        with pytest.raises(InferenceServerException, match="Servable not found"):
            http.infer("multi", [_input(thttp, "b", np.int32([1]), "INT32")])
        http.load_model("multi")
        assert http.is_model_ready("multi")
        # The same over gRPC.
        grpc.unload_model("multi")
        assert not grpc.is_model_ready("multi")
        assert "multi" not in {m.name for m in grpc.get_model_repository_index().models if m.state == "READY"}
        grpc.load_model("multi")
        assert grpc.is_model_ready("multi")
        with pytest.raises(InferenceServerException, match="not in the model repository"):
            http.load_model("nope")
    finally:
        stop.set()
        sender.join(30)
    assert failures == [] and answered[0] > 0
