"""Serving at speed, batching: --enable_batching with global and per-version BatchingParameters.

One batching server (module-scoped) serves five small models:
- ``rows``: per-row outputs, global parameters (max 8, allowed sizes 4 and 8, 20 ms timeout);
- ``probe``: answers the batch size and row index it ran at, global parameters;
- ``merge``: the probe with its own batching_params.pbtxt (max 8, a batch runs only when full);
- ``tiny``: ``rows`` with its own file (max 2 x 2 enqueued batches: larger requests are refused);
- ``sleepy``: sleeps as long as a request asks, its own file (max 2, one queued batch, one thread).
The server has ``--rest_api_timeout_in_ms 2000`` for the REST deadline test.
Unit tests of BatchingServable cover what is hard to reach from outside deterministically.
"""
from __future__ import annotations

import gc
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests

import modelyard  # noqa: F401  (TF environment first)
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from modelyard.errors import Code, ServingError
from modelyard.serving.batching.scheduler import DEADLINE_MESSAGE, QUEUE_FULL, BatchingServable
from modelyard.serving.batching.config import BatchingParams, parse_batching_parameters
from modelyard.model.runtime.servable import Servable
from tests.serving.affine_models import save_batch_probe, save_per_row, save_sleepy
from tests.serving.server_process import ServerProcess, wait_for

GLOBAL_PARAMS = """
max_batch_size { value: 8 }
batch_timeout_micros { value: 20000 }
max_enqueued_batches { value: 100 }
num_batch_threads { value: 2 }
allowed_batch_sizes: 4
allowed_batch_sizes: 8
"""
MERGE_PARAMS = """
max_batch_size { value: 8 }
batch_timeout_micros { value: 30000000 }
max_enqueued_batches { value: 4 }
num_batch_threads { value: 1 }
"""
TINY_PARAMS = """
max_batch_size { value: 2 }
max_enqueued_batches { value: 2 }
num_batch_threads { value: 1 }
allowed_batch_sizes: 2
"""
SLEEPY_PARAMS = """
max_batch_size { value: 2 }
batch_timeout_micros { value: 0 }
max_enqueued_batches { value: 1 }
num_batch_threads { value: 1 }
"""
REST_TIMEOUT_MS = 2000


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("batching")
    save_per_row(root / "rows" / "1")
    save_batch_probe(root / "probe" / "1")
    save_batch_probe(root / "merge" / "1")
    (root / "merge" / "1" / "batching_params.pbtxt").write_text(MERGE_PARAMS)
    save_per_row(root / "tiny" / "1")
    (root / "tiny" / "1" / "batching_params.pbtxt").write_text(TINY_PARAMS)
    save_sleepy(root / "sleepy" / "1")
    (root / "sleepy" / "1" / "batching_params.pbtxt").write_text(SLEEPY_PARAMS)
    (root / "params.txt").write_text(GLOBAL_PARAMS)
    body = "".join(
        f'  config: {{ name: "{name}" base_path: "{root / name}" model_platform: "tensorflow" }}\n'
        for name in ("rows", "probe", "merge", "tiny", "sleepy")
    )
    (root / "models.config").write_text("model_config_list: {\n" + body + "}\n")
    return root


@pytest.fixture(scope="module")
def server(model_dirs, monitoring_config):
    proc = ServerProcess(
        "--model_config_file", str(model_dirs / "models.config"),
        "--enable_batching", "--batching_parameters_file", str(model_dirs / "params.txt"),
        "--enable_per_model_batching_params",
        "--runtime", "tensorflow",
        # Batch threads run their graphs themselves (TF's caller-thread mode): the bitwise test
        # below compares that with a session on TF's default threads.
        "--tensorflow_intra_op_parallelism", "1", "--tensorflow_inter_op_parallelism", "-1",
        "--rest_api_timeout_in_ms", str(REST_TIMEOUT_MS),
        "--file_system_poll_wait_seconds", "0",
        "--monitoring_config_file", str(monitoring_config),
        log_dir=model_dirs,
    )
    with proc:
        yield proc


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.grpc_target)
    yield prediction_service_pb2_grpc.PredictionServiceStub(channel)
    channel.close()


def rest_predict(server, model: str, x: np.ndarray, session=None) -> requests.Response:
    body = json.dumps({"inputs": {"x": x.tolist()}})
    return (session or requests).post(f"{server.base}/v1/models/{model}:predict", data=body, timeout=60)


def rest_outputs(response: requests.Response, dtypes: dict[str, type]) -> dict[str, np.ndarray]:
    assert response.status_code == 200, response.text
    outputs = response.json()["outputs"]
    return {name: np.asarray(outputs[name], dtype=dtype) for name, dtype in dtypes.items()}


def grpc_request(model: str, x: np.ndarray) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
    return request


def grpc_predict(stub, model: str, x: np.ndarray, timeout: float = 60.0) -> dict[str, np.ndarray]:
    response = stub.Predict(grpc_request(model, x), timeout=timeout)
    return {name: tf.make_ndarray(proto) for name, proto in response.outputs.items()}


def assert_bitwise_equal(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape, (what, got.dtype, got.shape, expected.shape)
    assert got.tobytes() == expected.tobytes(), f"{what}: {got} != {expected}"


# ---- (a) batched answers equal the model's own answers, bit for bit ----------------------------
def test_concurrent_batched_answers_equal_unbatched_bitwise(server, stub, model_dirs):
    from modelyard.model.runtime.tf_session import load_saved_model

    direct = load_saved_model(model_dirs / "rows" / "1", None)
    signature = direct.signatures["serving_default"]
    rng = np.random.default_rng(7)
    # Row counts 1..6 merge and pad; 11 and 19 exceed max_batch_size 8 and are split.
    sizes = [int(n) for n in rng.choice([1, 2, 3, 4, 5, 6, 11, 19], size=96)]
    inputs = [rng.normal(scale=50, size=(n, 3)).astype(np.float32) for n in sizes]
    try:
        expected = [direct.run(signature, {"x": x}, ("y", "s", "k")) for x in inputs]  # each alone
    finally:
        direct.close()
    local = threading.local()

    def call(index: int) -> tuple[int, dict[str, np.ndarray]]:
        x = inputs[index]
        if index % 2:
            return index, grpc_predict(stub, "rows", x)
        if not hasattr(local, "session"):
            local.session = requests.Session()
        return index, rest_outputs(rest_predict(server, "rows", x, local.session),
                                   {"y": np.float32, "s": np.float32, "k": np.int32})

    with ThreadPoolExecutor(12) as pool:
        answers = dict(pool.map(call, range(len(inputs))))
    assert len(answers) == len(inputs)
    for index, want in enumerate(expected):
        for name in ("y", "s", "k"):
            assert_bitwise_equal(answers[index][name], want[name], f"request {index} ({sizes[index]} rows) {name}")


# ---- (b) padding never leaks; big requests are split and reassembled, or refused --------------
@pytest.mark.parametrize("rows, padded_to", [(1, 4), (3, 4), (5, 8), (8, 8)])
def test_padded_batch_returns_exactly_the_requests_rows(server, stub, rows, padded_to):
    x = (np.arange(rows, dtype=np.float32) + 0.25).reshape(rows, 1) * (1 + rows)
    for out in (rest_outputs(rest_predict(server, "probe", x), {"y": np.float32, "n": np.int32, "i": np.int32}),
                grpc_predict(stub, "probe", x)):
        assert_bitwise_equal(out["y"], x, "y")  # exactly its rows, in order: no padding row
        # It ran in a padded batch of an allowed size (padding happened, and stayed inside):
        assert out["n"].shape == (rows,) and set(out["n"].tolist()) <= {4, 8}
        assert min(out["n"].tolist()) >= rows
        # Its rows sit together in the batch, in order.
        assert out["i"].tolist() == list(range(out["i"][0], out["i"][0] + rows))
    # Sent alone, nothing else shares its batch: it is padded to the smallest allowed size.
    alone = grpc_predict(stub, "probe", x)
    assert alone["n"].tolist() == [padded_to] * rows and alone["i"].tolist() == list(range(rows))


def test_request_larger_than_max_batch_size_is_split_and_reassembled(server, stub):
    x = np.arange(20, dtype=np.float32).reshape(20, 1) - 7.5
    out = grpc_predict(stub, "probe", x)
    assert_bitwise_equal(out["y"], x, "y")
    # Three chunks of at most max_batch_size 8 rows, each its own batch (the last padded 4 -> 4).
    assert out["n"].tolist() == [8] * 8 + [8] * 8 + [4] * 4
    assert out["i"].tolist() == list(range(8)) + list(range(8)) + list(range(4))
    rest = rest_outputs(rest_predict(server, "probe", x), {"y": np.float32})
    assert_bitwise_equal(rest["y"], x, "REST y")


def test_concurrent_requests_share_one_batch_without_mixing_rows(server, stub):
    # ``merge`` (its own batching_params.pbtxt) runs a batch only once it holds 8 rows.
    a = np.full((3, 1), 11.0, np.float32) + np.arange(3, dtype=np.float32).reshape(3, 1)
    b = np.full((5, 1), -4.0, np.float32) - np.arange(5, dtype=np.float32).reshape(5, 1)
    with ThreadPoolExecutor(2) as pool:
        fa = pool.submit(grpc_predict, stub, "merge", a)
        fb = pool.submit(lambda: rest_outputs(rest_predict(server, "merge", b),
                                              {"y": np.float32, "n": np.int32, "i": np.int32}))
        out_a, out_b = fa.result(), fb.result()
    assert_bitwise_equal(out_a["y"], a, "a")
    assert_bitwise_equal(out_b["y"], b, "b")
    assert out_a["n"].tolist() == [8] * 3 and out_b["n"].tolist() == [8] * 5  # one batch of both
    assert sorted(out_a["i"].tolist() + out_b["i"].tolist()) == list(range(8))


def test_request_that_cannot_fit_the_queue_is_refused_clearly(server, stub):
    x = np.ones((5, 3), np.float32)  # tiny: max_batch_size 2 x max_enqueued_batches 2 = 4 rows at most
    r = rest_predict(server, "tiny", x)
    assert r.status_code == 400
    assert r.json()["error"].startswith("Task size 5 is larger than maximum input batch size 4")
    with pytest.raises(grpc.RpcError) as info:
        grpc_predict(stub, "tiny", x)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Task size 5 is larger than maximum input batch size 4" in info.value.details()
    ok = rest_outputs(rest_predict(server, "tiny", x[:4]), {"k": np.int32})  # 4 rows: split in two
    assert ok["k"].tolist() == [100] * 4


# ---- (c) a full queue answers at once, and the server keeps serving ----------------------------
def sleepy_input(rows: int, seconds: float, value: float = 1.0) -> np.ndarray:
    return np.array([[value + i, seconds] for i in range(rows)], np.float32)


def wait_until_running(server, stub, deadline_s: float) -> grpc.RpcError:
    """Once sleepy's only batch thread runs a slow batch: a 1-row probe then waits in the queue and expires.

    Before the slow request reaches the server the probe runs at once (OK); while the slow batch
    waits in the queue the probe is refused (RESOURCE_EXHAUSTED). Returns the expired probe's error
    once the server has dropped the probe's row from the queue: the client gives up at its
    deadline, the server at its own a moment later, and then counts the request DEADLINE_EXCEEDED.
    Waiting for that count (server state, not a clock) keeps the queue's room exact for what follows.
    """
    expired_before = request_count(server, "sleepy", "DEADLINE_EXCEEDED")
    for _ in range(100):
        try:
            grpc_predict(stub, "sleepy", sleepy_input(1, 0.0, 6.0), timeout=deadline_s)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                wait_for(lambda: request_count(server, "sleepy", "DEADLINE_EXCEEDED") > expired_before, 30,
                         interval=0.02, what="the server to drop the expired probe")
                return exc
        time.sleep(0.02)
    raise AssertionError("the slow request never started")


def metric(server, line: str) -> float:
    """One value of the server's Prometheus metrics: ``line`` is the name and labels, e.g. ``x{a="b"}``."""
    text = requests.get(server.base + "/monitoring/prometheus/metrics", timeout=30).text
    for row in text.splitlines():
        if row.startswith(line + " "):
            return float(row[len(line) + 1:])
    return 0.0


def request_count(server, model: str, status: str) -> int:
    """The server's own count of ``model``'s requests answered with ``status``."""
    return int(metric(server, f':tensorflow:serving:request_count{{model_name="{model}",status="{status}"}}'))


def test_full_queue_answers_429_and_resource_exhausted_at_once(server, stub):
    # sleepy: max_batch_size 2, one queued batch, one thread. A fills a batch and holds the thread.
    events: list[tuple[float, str, object]] = []
    lock = threading.Lock()

    def record(kind, result):
        with lock:
            events.append((time.monotonic(), kind, result))

    def slow():
        # 1.5 s: under the REST timeout (2 s), for a REST request queued behind A to be served.
        record("A", grpc_predict(stub, "sleepy", sleepy_input(2, 1.5, value=10.0)))

    def rest_one(i):
        r = rest_predict(server, "sleepy", sleepy_input(2, 0.0, value=20.0 + 10 * i))
        record("rest", (r.status_code, r.json()))

    def grpc_one(i):
        try:
            record("grpc", grpc_predict(stub, "sleepy", sleepy_input(2, 0.0, value=60.0 + 10 * i)))
        except grpc.RpcError as exc:
            record("grpc", exc)

    a = threading.Thread(target=slow)
    a.start()
    assert wait_until_running(server, stub, 0.2).code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # Four requests of 2 rows while A runs: one fits the single queued batch, three are refused.
    others = [threading.Thread(target=rest_one, args=(i,)) for i in range(2)]
    others += [threading.Thread(target=grpc_one, args=(i,)) for i in range(2)]
    for t in others:
        t.start()
    for t in others + [a]:
        t.join()
    a_done = next(at for at, kind, _ in events if kind == "A")
    a_result = next(result for _, kind, result in events if kind == "A")
    assert a_result["y"].ravel().tolist() == [21.0, 23.0]
    refused, served = [], []
    for at, kind, result in events:
        if kind == "rest" and result[0] == 429:
            assert result[1] == {"error": QUEUE_FULL}
            refused.append((at, kind))
        elif kind == "grpc" and isinstance(result, grpc.RpcError):
            assert result.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, result
            assert result.details() == QUEUE_FULL
            refused.append((at, kind))
        elif kind == "rest":
            assert result[0] == 200, result
            served.append(result[1]["outputs"])
        elif kind == "grpc":
            served.append(result["y"].tolist())
    assert len(refused) == 3 and len(served) == 1, events
    assert {kind for _, kind in refused} == {"rest", "grpc"}
    assert served[0] in ([[41.0], [43.0]], [[61.0], [63.0]], [[121.0], [123.0]], [[141.0], [143.0]])
    # Refused at once: every refusal came back while A was still running.
    assert all(at < a_done for at, _ in refused), events
    # The server keeps serving.
    assert grpc_predict(stub, "sleepy", sleepy_input(1, 0.0, 3.0))["y"].ravel().tolist() == [7.0]
    r = rest_predict(server, "sleepy", sleepy_input(2, 0.0, 3.0))
    assert r.status_code == 200 and r.json() == {"outputs": [[7.0], [9.0]]}


# ---- (d) deadlines shorter than the queue wait -------------------------------------------------
def test_rest_predict_on_a_batching_model_is_counted_and_timed_like_any_other(server):
    """REST predicts on batching models wait in the queue without a thread: same metrics as before."""
    names = {
        "ok": ':tensorflow:serving:request_count{model_name="probe",status="OK"}',
        "invalid": ':tensorflow:serving:request_count{model_name="probe",status="INVALID_ARGUMENT"}',
        "latency": ':tensorflow:serving:request_latency_count{model_name="probe",API="predict",entrypoint="REST"}',
        "runtime": ':tensorflow:serving:runtime_latency_count{model_name="probe",API="Predict",runtime="tensorflow"}',
    }
    before = {key: metric(server, name) for key, name in names.items()}
    ok = rest_outputs(rest_predict(server, "probe", np.ones((3, 1), np.float32)), {"y": np.float32})
    assert ok["y"].ravel().tolist() == [1.0, 1.0, 1.0]
    bad = requests.post(f"{server.base}/v1/models/probe:predict", timeout=60,
                        data=json.dumps({"signature_name": "nope", "inputs": {"x": [[1.0]]}}))
    assert bad.status_code == 400
    assert bad.json() == {"error": 'Serving signature name: "nope" not found in signature def'}
    bad_input = requests.post(f"{server.base}/v1/models/probe:predict", timeout=60,
                              data=json.dumps({"inputs": {"z": [[1.0]]}}))
    assert bad_input.status_code == 400, bad_input.text
    after = {key: metric(server, name) for key, name in names.items()}
    assert after["ok"] - before["ok"] == 1
    assert after["invalid"] - before["invalid"] == 2
    assert after["latency"] - before["latency"] == 1
    assert after["runtime"] - before["runtime"] == 1


def test_grpc_predict_on_a_batching_model_is_answered_counted_and_timed_like_any_other(server, stub):
    """gRPC Predicts on batching models also wait in the queue without a thread: same answers and metrics."""
    names = {
        "ok": ':tensorflow:serving:request_count{model_name="probe",status="OK"}',
        "invalid": ':tensorflow:serving:request_count{model_name="probe",status="INVALID_ARGUMENT"}',
        "precondition": ':tensorflow:serving:request_count{model_name="probe",status="FAILED_PRECONDITION"}',
        "latency": ':tensorflow:serving:request_latency_count{model_name="probe",API="Predict",entrypoint="GRPC"}',
        "runtime": ':tensorflow:serving:runtime_latency_count{model_name="probe",API="Predict",runtime="tensorflow"}',
    }
    before = {key: metric(server, name) for key, name in names.items()}
    response = stub.Predict(grpc_request("probe", np.ones((3, 1), np.float32)), timeout=60)
    assert tf.make_ndarray(response.outputs["y"]).ravel().tolist() == [1.0, 1.0, 1.0]
    assert response.model_spec.name == "probe" and response.model_spec.signature_name == "serving_default"
    assert response.model_spec.version.value > 0
    bad_signature = grpc_request("probe", np.ones((1, 1), np.float32))
    bad_signature.model_spec.signature_name = "nope"
    bad_input = predict_pb2.PredictRequest()
    bad_input.model_spec.name = "probe"
    bad_input.inputs["z"].CopyFrom(tf.make_tensor_proto(np.ones((1, 1), np.float32)))
    # TF Serving's gRPC answers, as for models without batching.
    for request, code, message in (
        (bad_signature, grpc.StatusCode.FAILED_PRECONDITION, 'Serving signature key "nope" not found.'),
        (bad_input, grpc.StatusCode.INVALID_ARGUMENT, "input"),
    ):
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(request, timeout=60)
        assert info.value.code() == code
        assert message in info.value.details()
    after = {key: metric(server, name) for key, name in names.items()}
    assert after["ok"] - before["ok"] == 1
    assert after["invalid"] - before["invalid"] == 1
    assert after["precondition"] - before["precondition"] == 1
    assert after["latency"] - before["latency"] == 1
    assert after["runtime"] - before["runtime"] == 1


def test_a_shape_the_model_refuses_in_a_batch_is_the_shape_rules_error(server):
    """Through the batching queue too: the signature's shape rule and V2's words, not TensorFlow's node."""
    bad = requests.post(f"{server.base}/v1/models/rows:predict", timeout=60, data=json.dumps({"instances": [[1.0, 2.0]]}))
    assert bad.status_code == 400
    assert bad.json() == {"error": "input 'x' has shape [1, 2]; the model expects [-1, 3] (-1: any size)"}, bad.text


def test_deadline_passing_in_the_queue(server, stub):
    expired_before = request_count(server, "sleepy", "DEADLINE_EXCEEDED")
    a_result = {}
    # A holds sleepy's only batch thread for 6 s: far longer than what follows needs (about 2.5 s).
    a = threading.Thread(target=lambda: a_result.update(grpc_predict(stub, "sleepy", sleepy_input(2, 6.0))))
    a.start()
    # gRPC: a deadline shorter than the wait behind A's batch; it returns once the server has
    # dropped the expired row (its metrics count it), not after a wall-clock guess.
    expired = wait_until_running(server, stub, 0.5)
    assert expired.code() == grpc.StatusCode.DEADLINE_EXCEEDED, expired
    # REST: 2 rows fit the queue only if the expired request's row has left it (else: 429 queue full);
    # then --rest_api_timeout_in_ms (2 s) passes while A still runs.
    r = rest_predict(server, "sleepy", sleepy_input(2, 0.0, 5.0))
    assert r.status_code == 504, r.text  # DEADLINE_EXCEEDED, TF Serving's HTTP status for it
    a.join()
    assert a_result["y"].ravel().tolist() == [3.0, 5.0]
    # The server counted both timeouts.
    wait_for(lambda: request_count(server, "sleepy", "DEADLINE_EXCEEDED") >= expired_before + 2, 30,
             interval=0.02, what="the REST timeout in the server's metrics")
    # The server keeps serving, on both protocols.
    assert grpc_predict(stub, "sleepy", sleepy_input(1, 0.0, 2.0), timeout=30)["y"].ravel().tolist() == [5.0]
    ok = rest_predict(server, "sleepy", sleepy_input(1, 0.0, 2.0))
    assert ok.status_code == 200 and ok.json() == {"outputs": [[5.0]]}
    expect_tf_serving_timeout_message(r)


def test_grpc_call_cancelled_in_the_queue_leaves_it_at_once(server, stub):
    """A client that resets its call (RST_STREAM) frees its rows now, not when the batch ahead finishes."""
    a = threading.Thread(target=lambda: grpc_predict(stub, "sleepy", sleepy_input(2, 4.0)))
    a.start()
    wait_until_running(server, stub, 0.2)  # A runs; the queue is empty again
    queued = stub.Predict.future(grpc_request("sleepy", sleepy_input(2, 0.0, 7.0)), timeout=60)
    # Queued: the queue's single batch is full, so a third request is refused.
    wait_for(lambda: _refused(stub), 10, interval=0.05, what="the cancelled call to sit in the queue")
    cancelled_before = request_count(server, "sleepy", "CANCELLED")
    expired_before = request_count(server, "sleepy", "DEADLINE_EXCEEDED")
    queued.cancel()  # 60 s before its deadline: a cancel, counted as one
    wait_for(lambda: request_count(server, "sleepy", "CANCELLED") > cancelled_before, 30,
             interval=0.02, what="the server to drop the cancelled call")
    assert request_count(server, "sleepy", "DEADLINE_EXCEEDED") == expired_before
    assert a.is_alive(), "the drop must not wait for A's batch"
    assert not _refused(stub), "the cancelled call's rows must have left the queue"
    a.join()
    assert grpc_predict(stub, "sleepy", sleepy_input(1, 0.0, 2.0), timeout=30)["y"].ravel().tolist() == [5.0]


def test_rest_client_gone_in_the_queue_leaves_it_at_once(server, stub):
    """A REST client that closes its connection while its predict waits frees its rows now."""
    a = threading.Thread(target=lambda: grpc_predict(stub, "sleepy", sleepy_input(2, 4.0)))
    a.start()
    wait_until_running(server, stub, 0.2)  # A runs; the queue is empty again
    body = json.dumps({"inputs": {"x": sleepy_input(2, 0.0, 7.0).tolist()}}).encode()
    host, port = server.base.removeprefix("http://").rsplit(":", 1)
    cancelled_before = request_count(server, "sleepy", "CANCELLED")
    with socket.create_connection((host, int(port)), timeout=30) as client:
        client.sendall(b"POST /v1/models/sleepy:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(body) + body)
        # A probe must not overtake the predict (it would take the queue's place): give the REST
        # thread time to read it first; the probe then proves it is queued.
        time.sleep(0.5)
        wait_for(lambda: _refused(stub), 10, interval=0.05, what="the REST predict to sit in the queue")
    wait_for(lambda: request_count(server, "sleepy", "CANCELLED") > cancelled_before, 30,
             interval=0.02, what="the server to drop the abandoned predict")
    assert a.is_alive(), "the drop must not wait for A's batch"
    assert not _refused(stub), "the abandoned predict's rows must have left the queue"
    a.join()
    ok = rest_predict(server, "sleepy", sleepy_input(1, 0.0, 2.0))
    assert ok.status_code == 200 and ok.json() == {"outputs": [[5.0]]}


def _v2_json(x: np.ndarray) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()


def test_v2_rest_and_grpc_infers_wait_in_the_queue_and_share_one_batch(server):
    """The Open Inference Protocol's infers on a batching model take TF Serving's queued path: REST JSON,
    REST binary and gRPC ModelInfer rows run in one batch of ``merge`` (it runs only when full)."""
    try:
        import tritonclient.grpc as grpcclient
    except ImportError as exc:
        pytest.fail(f"tritonclient.grpc is needed ({exc}): pip install -e '.[test]'", pytrace=False)
    a = np.arange(2, dtype=np.float32).reshape(2, 1) + 10
    b = np.array([[-3.0]], np.float32)
    c = np.arange(5, dtype=np.float32).reshape(5, 1) - 20

    def rest_json():
        r = requests.post(f"{server.base}/v2/models/merge/infer", data=_v2_json(a), timeout=60)
        assert r.status_code == 200, r.text
        return {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}

    def rest_binary():
        head = json.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32",
                                       "parameters": {"binary_data_size": 4}}],
                           "parameters": {"binary_data_output": True}}).encode()
        r = requests.post(f"{server.base}/v2/models/merge/infer", data=head + b.tobytes(), timeout=60,
                          headers={"Inference-Header-Content-Length": str(len(head))})
        assert r.status_code == 200, r.text
        length = int(r.headers["Inference-Header-Content-Length"])
        out, offset = {}, length
        for o in json.loads(r.content[:length])["outputs"]:
            size = o["parameters"]["binary_data_size"]
            dtype = {"FP32": np.float32, "INT32": np.int32}[o["datatype"]]
            out[o["name"]] = np.frombuffer(r.content[offset:offset + size], dtype).reshape(o["shape"])
            offset += size
        return out

    def grpc_infer():
        client = grpcclient.InferenceServerClient(server.grpc_target)
        tensor = grpcclient.InferInput("x", [5, 1], "FP32")
        tensor.set_data_from_numpy(c)
        result = client.infer("merge", [tensor], client_timeout=60)
        return {name: result.as_numpy(name) for name in ("y", "n", "i")}

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(f) for f in (rest_json, rest_binary, grpc_infer)]
        outs = [f.result() for f in futures]
    for out, x in zip(outs, (a, b, c)):
        assert np.array_equal(np.asarray(out["y"], np.float32), x)
        assert np.asarray(out["n"]).ravel().tolist() == [8] * len(x)  # one batch of all three
    assert sorted(np.concatenate([np.asarray(o["i"]).ravel() for o in outs]).tolist()) == list(range(8))


def test_v2_rest_client_gone_in_the_queue_leaves_it_at_once(server, stub):
    """A V2 infer waits in the queue holding no thread, as a predict does: its client closing the
    connection frees its rows now (the blocking path could not know until the batch ran)."""
    a = threading.Thread(target=lambda: grpc_predict(stub, "sleepy", sleepy_input(2, 4.0)))
    a.start()
    wait_until_running(server, stub, 0.2)  # A runs; the queue is empty again
    body = _v2_json(sleepy_input(2, 0.0, 7.0))
    host, port = server.base.removeprefix("http://").rsplit(":", 1)
    cancelled_before = request_count(server, "sleepy", "CANCELLED")
    with socket.create_connection((host, int(port)), timeout=30) as client:
        client.sendall(b"POST /v2/models/sleepy/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(0.5)  # as above: the probe must not overtake the infer
        wait_for(lambda: _refused(stub), 10, interval=0.05, what="the V2 infer to sit in the queue")
    wait_for(lambda: request_count(server, "sleepy", "CANCELLED") > cancelled_before, 30,
             interval=0.02, what="the server to drop the abandoned infer")
    assert a.is_alive(), "the drop must not wait for A's batch"
    assert not _refused(stub), "the abandoned infer's rows must have left the queue"
    a.join()
    ok = requests.post(f"{server.base}/v2/models/sleepy/infer", data=_v2_json(sleepy_input(1, 0.0, 2.0)), timeout=60)
    assert ok.status_code == 200 and ok.json()["outputs"][0]["data"] == [5.0], ok.text


def _refused(stub) -> bool:
    """Whether a 2-row sleepy call is refused at once (queue full); a call that is let in runs to the end."""
    try:
        grpc_predict(stub, "sleepy", sleepy_input(2, 0.0, 9.0), timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
        return True
    return False


def test_rest_timeout_while_the_batch_runs(server):
    r = rest_predict(server, "sleepy", sleepy_input(1, REST_TIMEOUT_MS / 1000 + 1.0))
    assert r.status_code == 504, r.text
    ok = rest_predict(server, "sleepy", sleepy_input(1, 0.0, 4.0))
    assert ok.status_code == 200 and ok.json() == {"outputs": [[9.0]]}
    expect_tf_serving_timeout_message(r)


def expect_tf_serving_timeout_message(r: requests.Response) -> None:
    """TF Serving's REST body on a --rest_api_timeout_in_ms timeout: TensorFlow's Session.run message.

    The batching queue answers it at the deadline; so does the HTTP layer, whichever comes
    first: both must say the same.
    """
    assert r.json() == {"error": DEADLINE_MESSAGE}


# ---- BatchingServable on its own: the fine points, deterministic -------------------------------
class GatedRows(Servable):
    """``y = 3x + 1`` per row; records each batch's rows; can hold batches until a gate opens."""

    def __init__(self):
        super().__init__(Path("."), {}, {})
        self.batches: list[np.ndarray] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Semaphore(0)
        self.runtime = "fake"
        self.closed = False

    def run(self, signature, inputs, output_aliases):
        self.batches.append(inputs["x"].copy())
        self.entered.release()
        assert self.gate.wait(30)
        return {"y": inputs["x"] * 3 + 1}

    def close(self):
        self.closed = True


class _Sig:
    """Stands for a Signature: BatchingServable keys its queues by the name; the fake ignores it."""

    name = "serving_default"


def batching(inner, **params) -> BatchingServable:
    return BatchingServable(inner, BatchingParams(**params))


def test_unit_padding_rows_never_leave_and_order_holds():
    inner = GatedRows()
    servable = batching(inner, max_batch_size=8, allowed_batch_sizes=(4, 8), num_batch_threads=1,
                        batch_timeout_micros=0)
    try:
        for rows in (1, 3, 5):
            x = np.arange(rows, dtype=np.float32).reshape(rows, 1) + 10 * rows
            out = servable.run(_Sig, {"x": x}, ("y",))
            assert out["y"].tolist() == (x * 3 + 1).tolist()
        assert [len(b) for b in inner.batches] == [4, 4, 8]
        # Padding repeats the batch's first row (TF Serving's rule), and stays inside.
        assert inner.batches[0].ravel().tolist() == [10.0] * 4
    finally:
        servable.close()
    assert inner.closed


def test_unit_queue_full_and_deadlines():
    inner = GatedRows()
    inner.gate.clear()
    servable = batching(inner, max_batch_size=2, max_enqueued_batches=1, num_batch_threads=1,
                        batch_timeout_micros=0)
    results: dict[str, object] = {}

    def call(name, x, deadline=None):
        try:
            results[name] = servable.run(_Sig, {"x": x}, ("y",), deadline=deadline)
        except ServingError as exc:
            results[name] = exc

    try:
        running = threading.Thread(target=call, args=("running", np.ones((2, 1), np.float32),
                                                        time.monotonic() + 0.3))
        running.start()
        assert inner.entered.acquire(timeout=30)  # its batch is in the model now
        queued = threading.Thread(target=call, args=("queued", np.full((2, 1), 2.0, np.float32),
                                                       time.monotonic() + 0.3))
        queued.start()
        while not servable._queues:  # wait until it is queued
            time.sleep(0.01)
        call("full", np.full((1, 1), 5.0, np.float32))  # the one queued batch is full: refused at once
        full = results["full"]
        assert isinstance(full, ServingError) and (full.code, full.message) == (Code.RESOURCE_EXHAUSTED, QUEUE_FULL)
        queued.join(30)
        running.join(30)
        q, r = results["queued"], results["running"]
        for error in (q, r):  # expired in the queue, expired while its batch ran
            assert isinstance(error, ServingError) and (error.code, error.message) == (
                Code.DEADLINE_EXCEEDED, DEADLINE_MESSAGE)
        inner.gate.set()
        call("after", np.full((1, 1), 7.0, np.float32))
        assert results["after"]["y"].tolist() == [[22.0]]
        # The timed-out queued request never reached the model.
        assert [b.ravel().tolist() for b in inner.batches] == [[1.0, 1.0], [7.0]]
    finally:
        inner.gate.set()
        servable.close()


def test_unit_model_error_fails_every_request_of_its_batch_and_not_the_next():
    class Failing(GatedRows):
        def run(self, signature, inputs, output_aliases):
            if (inputs["x"] < 0).any():
                raise ServingError(Code.INVALID_ARGUMENT, "negative input")
            return super().run(signature, inputs, output_aliases)

    inner = Failing()
    servable = batching(inner, max_batch_size=4, num_batch_threads=1, batch_timeout_micros=5_000_000)
    try:
        with ThreadPoolExecutor(2) as pool:
            good = pool.submit(servable.run, _Sig, {"x": np.ones((2, 1), np.float32)}, ("y",))
            bad = pool.submit(servable.run, _Sig, {"x": -np.ones((2, 1), np.float32)}, ("y",))
            for future in (good, bad):
                with pytest.raises(ServingError) as info:
                    future.result(30)
                assert info.value.code == Code.INVALID_ARGUMENT
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(servable.run, _Sig, {"x": np.full((2, 1), v, np.float32)}, ("y",)) for v in (1, 2)]
            assert [f.result(30)["y"].ravel().tolist() for f in futures] == [[4.0, 4.0], [7.0, 7.0]]
    finally:
        servable.close()


def test_unit_parameters_file_is_read_strictly():
    params = parse_batching_parameters(GLOBAL_PARAMS)
    assert (params.max_batch_size, params.batch_timeout_micros, params.max_enqueued_batches,
            params.num_batch_threads, params.allowed_batch_sizes) == (8, 20000, 100, 2, (4, 8))
    with pytest.raises(ServingError, match="allowed_batch_sizes"):
        parse_batching_parameters("max_batch_size { value: 8 }\nallowed_batch_sizes: 4\n")
    with pytest.raises(ServingError, match="max_batch_sise"):
        parse_batching_parameters("max_batch_sise { value: 8 }\n")


# ---- submit(): the same queue, answered through a future ---------------------------------------
def test_unit_submit_shares_batches_with_run_and_answers_through_futures():
    inner = GatedRows()
    # A batch runs only when full (8 rows) or after 30 s: three submits and one run() fill one batch.
    servable = batching(inner, max_batch_size=8, num_batch_threads=1, batch_timeout_micros=30_000_000)
    try:
        futures = [servable.submit(_Sig, {"x": np.full((2, 1), v, np.float32)}, ("y",)) for v in (1, 2, 3)]
        called = threading.Event()
        futures[0].add_done_callback(lambda f: called.set())
        assert not any(f.done() for f in futures)  # queued: nothing blocked, nothing ran
        out = servable.run(_Sig, {"x": np.full((2, 1), 4.0, np.float32)}, ("y",))  # the 8th row: runs at once
        assert out["y"].ravel().tolist() == [13.0, 13.0]
        assert [f.result(30)["y"].ravel().tolist() for f in futures] == [[4.0, 4.0], [7.0, 7.0], [10.0, 10.0]]
        assert called.wait(30)
        assert [len(b) for b in inner.batches] == [8]  # one batch for all four
        # A request refused at the door raises at once, as run() does.
        with pytest.raises(ServingError) as info:
            servable.submit(_Sig, {"x": np.ones((2, 1), np.float32)}, ("y",), deadline=time.monotonic() - 1)
        assert (info.value.code, info.value.message) == (Code.DEADLINE_EXCEEDED, DEADLINE_MESSAGE)
        # Inputs that cannot be batched run on the executor given, unbatched.
        with ThreadPoolExecutor(1) as pool:
            scalar = servable.submit(_Sig, {"x": np.float32(2.0)}, ("y",), executor=pool)
            assert scalar.result(30)["y"].tolist() == 7.0
    finally:
        servable.close()


def test_unit_finished_requests_leave_no_reference_cycles():
    """Answered, failed and expired requests are freed by reference counting: the cyclic GC, which
    the server runs rarely, finds nothing of theirs (so a failed request's tensors never linger)."""
    class FailsOnNegative(GatedRows):
        def run(self, signature, inputs, output_aliases):
            if (inputs["x"] < 0).any():
                raise ServingError(Code.INVALID_ARGUMENT, "negative input")  # raised: it has a traceback
            return super().run(signature, inputs, output_aliases)

    inner = FailsOnNegative()
    servable = batching(inner, max_batch_size=4, num_batch_threads=1, batch_timeout_micros=0)
    gc.collect()
    gc.disable()
    try:
        for _ in range(10):
            assert servable.run(_Sig, {"x": np.ones((1, 1), np.float32)}, ("y",))["y"].tolist() == [[4.0]]
        futures = [servable.submit(_Sig, {"x": np.full((1, 1), v, np.float32)}, ("y",)) for v in range(8)]
        assert [f.result(30)["y"].item() for f in futures] == [3.0 * v + 1 for v in range(8)]
        for _ in range(3):  # the model fails the batch: on both entry points
            with pytest.raises(ServingError) as info:
                servable.run(_Sig, {"x": -np.ones((1, 1), np.float32)}, ("y",))
            assert info.value.code == Code.INVALID_ARGUMENT
            with pytest.raises(ServingError) as info:
                servable.submit(_Sig, {"x": -np.ones((1, 1), np.float32)}, ("y",)).result(30)
            assert info.value.code == Code.INVALID_ARGUMENT
        inner.gate.clear()
        running = servable.submit(_Sig, {"x": np.ones((1, 1), np.float32)}, ("y",))
        assert inner.entered.acquire(timeout=30)
        queued = servable.submit(_Sig, {"x": np.ones((1, 1), np.float32)}, ("y",))
        queued.expire()
        running.expire(ServingError(Code.CANCELLED, "gone"))
        blocked = ThreadPoolExecutor(1)
        waiting = blocked.submit(servable.run, _Sig, {"x": np.ones((1, 1), np.float32)}, ("y",),
                                 time.monotonic() + 0.2)
        with pytest.raises(ServingError) as info:
            waiting.result(30)  # run() past its deadline, while the gate holds the batch thread
        assert info.value.code == Code.DEADLINE_EXCEEDED
        inner.gate.set()
        for future, code in ((queued, Code.DEADLINE_EXCEEDED), (running, Code.CANCELLED)):
            with pytest.raises(ServingError) as info:
                future.result(30)
            assert info.value.code == code
        blocked.shutdown()
        del futures, running, queued, waiting, future, info
        # Only this test's objects count: other threads of the test process (servers and
        # model builders of earlier tests) may leave cyclic garbage of their own meanwhile.
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        ours = [o for o in gc.garbage
                if isinstance(o, (np.ndarray, BaseException)) or type(o).__module__.startswith("modelyard")]
        assert ours == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        servable.close()


def test_unit_submit_expire_frees_the_queue_and_drops_running_rows():
    inner = GatedRows()
    inner.gate.clear()
    servable = batching(inner, max_batch_size=2, max_enqueued_batches=1, num_batch_threads=1,
                        batch_timeout_micros=0)
    try:
        running = servable.submit(_Sig, {"x": np.ones((2, 1), np.float32)}, ("y",))
        assert inner.entered.acquire(timeout=30)  # its batch is in the model now
        queued = servable.submit(_Sig, {"x": np.full((2, 1), 2.0, np.float32)}, ("y",))
        with pytest.raises(ServingError) as info:  # the one queued batch is full
            servable.submit(_Sig, {"x": np.full((1, 1), 5.0, np.float32)}, ("y",))
        assert info.value.code == Code.RESOURCE_EXHAUSTED
        queued.expire()  # its rows leave the queue: room again
        with pytest.raises(ServingError) as info:
            queued.result(0)
        assert (info.value.code, info.value.message) == (Code.DEADLINE_EXCEEDED, DEADLINE_MESSAGE)
        after = servable.submit(_Sig, {"x": np.full((1, 1), 7.0, np.float32)}, ("y",))
        running.expire()  # while its batch runs: answered now, its rows dropped later
        with pytest.raises(ServingError) as info:
            running.result(0)
        assert info.value.code == Code.DEADLINE_EXCEEDED
        inner.gate.set()
        assert after.result(30)["y"].tolist() == [[22.0]]
        running.expire()  # answered already: nothing happens
        # The expired queued request never reached the model.
        assert [b.ravel().tolist() for b in inner.batches] == [[1.0, 1.0], [7.0]]
    finally:
        inner.gate.set()
        servable.close()


def test_unit_close_fails_queued_futures_unavailable():
    inner = GatedRows()
    servable = batching(inner, max_batch_size=8, num_batch_threads=1, batch_timeout_micros=30_000_000)
    future = servable.submit(_Sig, {"x": np.ones((1, 1), np.float32)}, ("y",))
    servable.close()
    with pytest.raises(ServingError) as info:
        future.result(30)
    assert info.value.code == Code.UNAVAILABLE
    assert inner.batches == []


def test_unit_batch_threads_wake_for_a_full_batch_and_for_a_timeout():
    """Wake-ups are sent only when a batch opens or fills: every batch must still run.

    Full batches under a 30 s timeout run (woken by the fill, or by the thread that took the
    batch before), and a lone row runs after its batch timeout with no further request.
    (A lost wake-up would show as a delay of up to _MAX_WAIT_S, not as a hang: timings are
    not asserted here.)
    """
    inner = GatedRows()
    servable = batching(inner, max_batch_size=4, num_batch_threads=2, batch_timeout_micros=30_000_000)
    try:
        time.sleep(0.05)  # both threads asleep, nothing queued
        futures = [servable.submit(_Sig, {"x": np.full((1, 1), v, np.float32)}, ("y",)) for v in range(8)]
        # Two full batches: both run, each thread woken (the second by the first, or by its own fill).
        assert [f.result(30)["y"].ravel().tolist() for f in futures] == [[3.0 * v + 1] for v in range(8)]
        assert sorted(len(b) for b in inner.batches) == [4, 4]
    finally:
        servable.close()
    inner = GatedRows()
    servable = batching(inner, max_batch_size=4, num_batch_threads=2, batch_timeout_micros=50_000)
    try:
        lone = servable.submit(_Sig, {"x": np.full((1, 1), 2.0, np.float32)}, ("y",))
        assert lone.result(30)["y"].tolist() == [[7.0]]  # closed by its timeout, nothing else arrived
    finally:
        servable.close()


# ---- the server fixture itself -----------------------------------------------------------------
def test_failed_start_leaves_no_server_process(tmp_path):
    proc = ServerProcess("--model_name", "m", "--model_base_path", str(tmp_path), log_dir=tmp_path)
    with pytest.raises(TimeoutError):
        proc.wait_ready(timeout=0)  # the readiness probe gives up before the server can answer
    assert proc.proc.poll() is not None
    assert not proc._group_alive()
    proc.stop()  # idempotent
