"""Serving at speed, workers: --workers 2 swaps versions and reloads config under load, and merges metrics.

One server with two worker processes sharing both ports. Clients send requests without
pause over REST (a new connection each time, so the kernel spreads them over the
workers) and gRPC (a new channel every few calls) while a new version is copied in and
two HandleReloadConfigRequest calls add then remove a model. The workers' state
directory is put under the test's TMPDIR so each worker's own metrics snapshot can be
read, which shows that both workers served and that the scrape sums them.
"""
from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests

import modelyard  # noqa: F401  (TF environment first)
import tensorflow as tf
from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc, predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2

from tests.serving.affine_models import save_affine
from tests.serving.server_process import ServerProcess, wait_for

METRICS = "/monitoring/prometheus/metrics"


def config_proto(models: dict[str, Path]) -> model_server_config_pb2.ModelServerConfig:
    config = model_server_config_pb2.ModelServerConfig()
    for name, path in models.items():
        entry = config.model_config_list.config.add()
        entry.name, entry.base_path, entry.model_platform = name, str(path), "tensorflow"
    return config


@pytest.fixture(scope="module")
def setup(tmp_path_factory, monitoring_config):
    root = tmp_path_factory.mktemp("workers")
    save_affine(root / "m" / "1", 1.0, 0.0)  # answers x
    save_affine(root / "staging_m2", 1.0, 100.0)  # version 2 of m: x + 100
    save_affine(root / "n" / "1", 1.0, -5.0)  # the model a reload adds: x - 5
    (root / "models.config").write_text(
        f'model_config_list: {{ config: {{ name: "m" base_path: "{root / "m"}" model_platform: "tensorflow" }} }}\n'
    )
    state = root / "tmp"
    state.mkdir()
    server = ServerProcess(
        "--workers", "2", "--model_config_file", str(root / "models.config"),
        "--file_system_poll_wait_seconds", "1", "--runtime", "tensorflow",
        "--monitoring_config_file", str(monitoring_config),
        log_dir=root, env={"TMPDIR": str(state)},
    )
    with server:
        wait_for(lambda: all(f"worker:{i} " in server.log() and _worker_line(server, i, "Exporting HTTP/REST API")
                             for i in (0, 1)), 120, what="both workers to serve")
        wait_for(lambda: len(list(root.glob("tmp/modelyard-serve-*/metrics-*.json"))) == 2, 30,
                 what="both workers' metrics snapshots")
        yield root, server


def _worker_line(server, index: int, text: str) -> bool:
    return any(f"worker:{index} " in line and text in line for line in server.log().splitlines())


def worker_snapshots(root: Path) -> list[dict]:
    """Each worker's own latest metrics snapshot, from the state directory."""
    files = sorted(root.glob("tmp/modelyard-serve-*/metrics-*.json"))
    assert len(files) == 2, files
    return [json.loads(f.read_text()) for f in files]


def snapshot_value(snapshot: dict, metric: str, labels: list[str]) -> float:
    return sum(v for k, v in snapshot.get(metric, []) if k == labels)


def scraped(server, pattern: str) -> float:
    text = requests.get(server.base + METRICS, timeout=10).text
    match = re.search(pattern, text)
    return float(match.group(1)) if match else 0.0


class Clients:
    """REST and gRPC callers running without pause; every answer is recorded."""

    def __init__(self, server):
        self.server = server
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.results: list[tuple[float, str, str, object, float]] = []  # (answered, model, protocol, answer or error, sent)
        self.models = ["m"]
        self.threads = [threading.Thread(target=self._rest) for _ in range(2)]
        self.threads += [threading.Thread(target=self._grpc)]

    def _record(self, model, protocol, answer, sent):
        # (answered, model, protocol, answer, sent): the thread may record its answer late on a busy machine,
        # so what must hold for requests sent after a moment is checked on the send time.
        with self.lock:
            self.results.append((time.monotonic(), model, protocol, answer, sent))

    def _rest(self):
        i = 0
        while not self.stop.is_set():
            model = self.models[i % len(self.models)]
            i += 1
            sent = time.monotonic()
            try:  # no keep-alive: each request a new connection, so both workers take some
                r = requests.post(f"{self.server.base}/v1/models/{model}:predict", data='{"instances": [[1.0]]}',
                                  headers={"Connection": "close"}, timeout=30)
                answer = r.json()["predictions"][0][0] if r.status_code == 200 else f"HTTP {r.status_code}: {r.text}"
            except Exception as exc:  # noqa: BLE001 - every failure is a finding
                answer = f"{type(exc).__name__}: {exc}"
            self._record(model, "rest", answer, sent)

    def _grpc(self):
        i = 0
        while not self.stop.is_set():
            with grpc.insecure_channel(self.server.grpc_target) as channel:
                stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
                for _ in range(5):  # a new channel (connection) every few calls
                    model = self.models[i % len(self.models)]
                    i += 1
                    request = predict_pb2.PredictRequest()
                    request.model_spec.name = model
                    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.0]], np.float32)))
                    sent = time.monotonic()
                    try:
                        answer = float(tf.make_ndarray(stub.Predict(request, timeout=30).outputs["y"])[0][0])
                    except grpc.RpcError as exc:
                        answer = f"gRPC {exc.code().name}: {exc.details()}"
                    self._record(model, "grpc", answer, sent)
                    if self.stop.is_set():
                        break

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def since(self, moment: float) -> list[tuple]:
        with self.lock:
            return [r for r in self.results if r[0] > moment]


def reload(server, models: dict[str, Path]) -> None:
    with grpc.insecure_channel(server.grpc_target) as channel:
        request = model_management_pb2.ReloadConfigRequest()
        request.config.CopyFrom(config_proto(models))
        response = model_service_pb2_grpc.ModelServiceStub(channel).HandleReloadConfigRequest(request, timeout=120)
    assert response.status.error_code == 0, response.status.error_message


def test_swap_and_reload_under_load_drop_nothing_and_reach_every_worker(setup):
    root, server = setup
    before = [snapshot_value(s, ":tensorflow:serving:request_count", ["m", "OK"]) for s in worker_snapshots(root)]
    with Clients(server) as clients:
        wait_for(lambda: len(clients.results) > 40, 60, what="traffic")
        # 1. A new version copied in (non-atomically) while requests flow.
        shutil.copytree(root / "staging_m2", root / "m" / "2")
        wait_for(lambda: all(_worker_line(server, i, "Unloaded servable version {name: m version: 1}")
                             for i in (0, 1)), 90, what="every worker to swap m to version 2")
        swapped = time.monotonic()
        after_swap = [snapshot_value(s, ":tensorflow:serving:request_count", ["m", "OK"])
                      for s in worker_snapshots(root)]
        # 2. A reload (sent to whichever worker takes the connection) adds model n on every worker.
        reload(server, {"m": root / "m", "n": root / "n"})
        added = time.monotonic()
        clients.models = ["m", "n"]
        wait_for(lambda: Counter(r[2] for r in clients.since(added) if r[1] == "n")["rest"] > 30, 60,
                 what="requests to n")
        # 3. Another reload removes it again, everywhere.
        removing = time.monotonic()
        reload(server, {"m": root / "m"})
        removed = time.monotonic()
        clients.models = ["m"]
        wait_for(lambda: len(clients.since(removed)) > 30, 60, what="traffic after the removal")
    results = clients.results
    failures = [r for r in results if r[1] == "m" and not isinstance(r[3], float)]
    assert not failures, f"{len(failures)} of {len(results)} requests to m failed, e.g. {failures[:3]}"
    assert {r[3] for r in results if r[1] == "m"} == {1.0, 101.0}
    # Once both workers unloaded version 1, every request sent from then on is answered by version 2.
    assert {r[3] for r in results if r[1] == "m" and r[4] > swapped} == {101.0}
    # n answered on every request between its reloads (the reload returns once every worker applied it).
    added_to_removed = [r for r in results if r[1] == "n" and added < r[0] < removing]
    bad = [(round(r[0] - added, 3), r[2], r[3]) for r in added_to_removed if r[3] != -4.0]
    assert added_to_removed and not bad, (f"{len(bad)} of {len(added_to_removed)} requests to n failed "
                                          f"(seconds after the reload returned, protocol, answer): {bad[:5]}")
    # After removal no worker serves n.
    for _ in range(20):
        r = requests.post(f"{server.base}/v1/models/n:predict", data='{"instances": [[1.0]]}',
                          headers={"Connection": "close"}, timeout=30)
        assert r.status_code == 404 and r.json() == {"error": "Servable not found for request: Latest(n); served models: m"}
    # Both workers answered requests for version 2 (their own counters grew after the swap).
    wait_for(lambda: all(snapshot_value(s, ":tensorflow:serving:request_count", ["m", "OK"]) > a
                         for s, a in zip(worker_snapshots(root), after_swap)), 10, what="worker snapshots")
    assert all(a >= b for a, b in zip(after_swap, before))
    for snapshot in worker_snapshots(root):
        gauges = {tuple(k): v for k, v in snapshot[":modelyard:serving:model_runtime"]}
        assert gauges[("m", "2", "tensorflow")] == 1 and gauges[("m", "1", "tensorflow")] == 0, gauges


def test_prometheus_scrape_sums_both_workers(setup):
    root, server = setup
    pattern = r':tensorflow:serving:request_count\{model_name="m",status="OK"\} (\d+)'

    def settled():
        """Per-worker counts once every scrape (whichever worker answers) reports their sum."""
        per_worker = [snapshot_value(s, ":tensorflow:serving:request_count", ["m", "OK"])
                      for s in worker_snapshots(root)]
        totals = {scraped(server, pattern) for _ in range(6)}
        return per_worker if totals == {sum(per_worker)} else None

    before = wait_for(settled, 15, what="the workers' snapshots to settle")
    for _ in range(60):  # new connections: both workers answer some
        r = requests.post(f"{server.base}/v1/models/m:predict", data='{"instances": [[2.0]]}',
                          headers={"Connection": "close"}, timeout=30)
        assert r.status_code == 200 and r.json() == {"predictions": [[102.0]]}
    after = wait_for(lambda: (lambda counts: counts if counts and sum(counts) == sum(before) + 60 else None)(
        settled()), 15, what="the scrape to count all 60 requests")
    # The scrape's request_count is the sum of both workers' own counts, and both served some.
    assert all(a > b for a, b in zip(after, before)), (before, after)
