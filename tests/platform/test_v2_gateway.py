"""The Open Inference Protocol (KServe V2) through the platform's gateway (issue 30): stock
``tritonclient.http`` against the session platform, at the root (``/v2/models/{endpoint or deployed
model id}``) and with an endpoint's URL as its base; ``:rawPredict`` passing a V2 body (JSON and
binary) through; bad input answered in V2's ``{"error": "..."}`` while the model stays ready."""
from __future__ import annotations

import numpy as np
import orjson
import pytest
import requests

from tests.platform.client import Api
from tests.platform.conftest import PARENT, require


@pytest.fixture(scope="module")
def deployed(platform, tiny_models):
    api = Api(platform.url)
    model = api.upload(tiny_models["models"]["tiny1"]["path"], "tiny1-v2")
    ep = api.create_endpoint("v2")
    dm = api.deploy(ep, model)
    return {"endpoint": ep, "dm": dm, "x": np.array(tiny_models["instances"], np.float32),
            "expected": np.array(tiny_models["models"]["tiny1"]["predictions"], np.float32),
            "host": platform.url.removeprefix("http://")}


def _client(url: str):
    http = require("tritonclient.http", "pip install 'tritonclient[http]' (the test extra)")
    return http, http.InferenceServerClient(url, network_timeout=60)


def _infer(http, client, name: str, x: np.ndarray, binary: bool):
    tensor = http.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return client.infer(name, [tensor], outputs=[http.InferRequestedOutput("probabilities", binary_data=binary)])


def test_tritonclient_at_the_root_and_under_the_endpoint(deployed):
    x, expected, ep, dm = deployed["x"], deployed["expected"], deployed["endpoint"], deployed["dm"]
    http, root = _client(deployed["host"])
    assert root.is_server_live() and root.is_server_ready()
    assert root.is_model_ready(ep) and root.is_model_ready(dm)
    meta = root.get_model_metadata(dm)
    assert meta["name"] == dm and meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert [o["name"] for o in meta["outputs"]] == ["probabilities"]
    for name in (ep, dm):  # the endpoint's split chooses, or the deployed model is named
        for binary in (False, True):
            result = _infer(http, root, name, x, binary)
            np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-5, atol=1e-6)
            assert result.get_response()["model_name"] == name
    # The endpoint's URL as the client's base: its own V2 routes, the deployed model pinned by its id.
    http, under = _client(f"{deployed['host']}/v1/{PARENT}/endpoints/{ep}")
    assert under.is_server_ready() and under.is_model_ready(dm)
    for name in (dm, ep):
        result = _infer(http, under, name, x, True)
        np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-5, atol=1e-6)


def test_raw_predict_passes_a_v2_body_through(platform, deployed):
    x, expected = deployed["x"], deployed["expected"]
    url = f"{platform.url}/v1/{PARENT}/endpoints/{deployed['endpoint']}:rawPredict"
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    r = requests.post(url, json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["X-Vertex-AI-Deployed-Model-Id"] == deployed["dm"]
    out = r.json()["outputs"][0]
    assert out["name"] == "probabilities" and out["datatype"] == "FP32" and out["shape"] == [3, 3]
    np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(3, 3), expected, rtol=1e-5, atol=1e-6)
    # The binary extension: JSON header, then the raw tensor; the answer's binary output as sent.
    head = orjson.dumps({"inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}})
    r = requests.post(url, data=head + x.tobytes(), timeout=60,
                      headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 200, r.text
    length = int(r.headers["Inference-Header-Content-Length"])
    answer = orjson.loads(r.content[:length])
    assert answer["outputs"][0]["parameters"]["binary_data_size"] == 36
    np.testing.assert_allclose(np.frombuffer(r.content[length:], np.float32).reshape(3, 3), expected, rtol=1e-5)
    # A TF Serving body on :rawPredict still goes to :predict.
    r = requests.post(url, json={"instances": x.tolist()}, timeout=60)
    assert r.status_code == 200 and "predictions" in r.json(), r.text


def test_bad_v2_input_gets_v2_errors_and_the_model_stays_ready(platform, deployed):
    x, ep, dm = deployed["x"], deployed["endpoint"], deployed["dm"]
    base = f"{platform.url}/v2/models"

    def infer(name: str, body: bytes, headers: dict | None = None, status: int = 400) -> str:
        r = requests.post(f"{base}/{name}/infer", data=body, headers=headers or {}, timeout=60)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert isinstance(error, str) and error, r.text  # V2's {"error": "..."}, not Google's object
        return error

    good = {"name": "x", "shape": [3, 4], "datatype": "FP32", "data": x.ravel().tolist()}
    assert "neither an endpoint id nor a deployed model id" in infer("nope", orjson.dumps({"inputs": [good]}),
                                                                     status=404)
    assert "FP32" in infer(dm, orjson.dumps({"inputs": [{**good, "datatype": "INT32",
                                                         "data": [1] * 12}]}))
    assert "shape" in infer(ep, orjson.dumps({"inputs": [{**good, "shape": [3, 5], "data": [0.0] * 15}]}))
    assert "probz" in infer(ep, orjson.dumps({"inputs": [good], "outputs": [{"name": "probz"}]}))
    assert "JSON" in infer(ep, orjson.dumps({"inputs": [good]})[:-7])  # a truncated body
    head = orjson.dumps({"inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 40}}]})
    assert "48 bytes" in infer(ep, head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head))})
    r = requests.post(f"{base}/{dm}/versions/999/infer", json={"inputs": [good]}, timeout=60)
    assert r.status_code == 404 and "version" in r.json()["error"], r.text
    r = requests.get(f"{platform.url}/v2/nowhere", timeout=10)
    assert r.status_code == 404 and isinstance(r.json()["error"], str), r.text
    # Through tritonclient: the message reaches the client's exception.
    http, client = _client(deployed["host"])
    bad = http.InferInput("x", [3, 4], "INT32")
    bad.set_data_from_numpy(np.zeros((3, 4), np.int32))
    with pytest.raises(http.InferenceServerException, match="FP32"):
        client.infer(dm, [bad])
    assert client.is_model_ready(dm)
    np.testing.assert_allclose(_infer(http, client, dm, x, False).as_numpy("probabilities"), deployed["expected"],
                               rtol=1e-5, atol=1e-6)


# ---- one layer down: which V2 call a URL is, a V2 body told from TF Serving's, the answer renamed ----------
def test_unit_v2_paths_and_bodies():
    from modelyard.platform.dataplane import v2_paths

    call = v2_paths.parse(b"/v2/models/123/versions/2/infer", b"POST")
    assert (call.kind, call.name, call.version, call.endpoint_id) == (v2_paths.INFER, "123", "2", None)
    call = v2_paths.parse(f"/v1/{PARENT}/endpoints/77/v2/models/9/ready".encode(), b"GET")
    assert (call.kind, call.name, call.endpoint_id, call.parent) == (v2_paths.MODEL_READY, "9", "77", PARENT)
    assert v2_paths.parse(b"/v2/health/live", b"GET").kind == v2_paths.LIVE
    assert v2_paths.parse(b"/v2/models/9/infer", b"GET").kind is None  # a V2 path, no such call: 404 in V2's form
    assert v2_paths.parse(f"/v1/{PARENT}/endpoints/77:predict".encode(), b"POST") is None
    assert v2_paths.parse(b"/v2x", b"GET") is None
    v2 = orjson.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]})
    assert v2_paths.is_v2_body(v2, None) and v2_paths.is_v2_body(b"anything", b"12")
    assert not v2_paths.is_v2_body(b'{"instances": [{"datatype": 1}]}', None)
    assert not v2_paths.is_v2_body(b'{"inputs": {"datatype": [1]}}', None)  # TF Serving's columnar inputs


def test_unit_v2_answer_renamed_keeps_the_binary_header_length():
    from modelyard.platform.dataplane.gateway import _v2_renamed

    head = b'{"model_name":"model","model_version":"1","outputs":[]}'
    headers, data = _v2_renamed([(b"Content-Type", b"application/octet-stream"),
                                 (b"Inference-Header-Content-Length", str(len(head)).encode()), (b"Date", b"x")],
                                head + b"\x01\x02", "endpoint-7", "3")
    new_length = int(dict(headers)[b"Inference-Header-Content-Length"])
    assert orjson.loads(data[:new_length]) == {"model_name": "endpoint-7", "model_version": "3", "outputs": []}
    assert data[new_length:] == b"\x01\x02" and b"Date" not in dict(headers)
