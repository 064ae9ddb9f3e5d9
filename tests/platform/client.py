"""A small REST client for the platform tests (Vertex AI v1 JSON over requests), and a load
generator that sends predicts without pause and counts every failure."""
from __future__ import annotations

import threading
import time
from collections import Counter

import requests

from tests.platform.conftest import PARENT


class Api:
    def __init__(self, base_url: str, token: str | None = None) -> None:
        self.base = base_url
        self.s = requests.Session()
        if token:
            self.s.headers["Authorization"] = f"Bearer {token}"

    def url(self, path: str) -> str:
        return f"{self.base}/v1/{PARENT}/{path}"

    def call(self, method: str, path: str, body: dict | None = None, **kw) -> requests.Response:
        return self.s.request(method, self.url(path), json=body, timeout=60, **kw)

    def ok(self, method: str, path: str, body: dict | None = None, **kw) -> dict:
        r = self.call(method, path, body, **kw)
        assert r.status_code == 200, r.text
        return r.json()

    def wait(self, op: dict, timeout: float = 180) -> dict:
        deadline = time.monotonic() + timeout
        while not op.get("done"):
            assert time.monotonic() < deadline, f"operation {op['name']} not done in {timeout} s"
            time.sleep(0.2)
            op = self.s.get(f"{self.base}/v1/{op['name']}", timeout=10).json()
        assert "error" not in op, op
        return op["response"]

    def upload(self, path: str, name: str = "m") -> str:
        op = self.ok("POST", "models:upload", {"model": {"displayName": name, "artifactUri": path}})
        return self.wait(op)["model"].rsplit("/", 1)[-1]

    def create_endpoint(self, name: str = "ep") -> str:
        return self.wait(self.ok("POST", "endpoints", {"displayName": name}))["name"].rsplit("/", 1)[-1]

    def deploy(self, endpoint: str, model: str, split: dict | None = None, min_r: int = 1, max_r: int = 1) -> str:
        body = {"deployedModel": {"model": f"{PARENT}/models/{model}",
                                  "automaticResources": {"minReplicaCount": min_r, "maxReplicaCount": max_r}}}
        if split is not None:
            body["trafficSplit"] = split
        return self.wait(self.ok("POST", f"endpoints/{endpoint}:deployModel", body))["deployedModel"]["id"]

    def undeploy(self, endpoint: str, dm: str, split: dict | None = None) -> None:
        body = {"deployedModelId": dm, **({"trafficSplit": split} if split is not None else {})}
        self.wait(self.ok("POST", f"endpoints/{endpoint}:undeployModel", body))

    def set_split(self, endpoint: str, split: dict) -> dict:
        return self.ok("PATCH", f"endpoints/{endpoint}", {"trafficSplit": split}, params={"updateMask": "trafficSplit"})

    def predict(self, endpoint: str, instances, headers: dict | None = None) -> requests.Response:
        return self.s.post(self.url(f"endpoints/{endpoint}:predict"), json={"instances": instances},
                           headers=headers, timeout=60)

    def replicas(self) -> list[dict]:
        r = self.s.get(f"{self.base}/modelyard/v1/replicas", timeout=10)
        assert r.status_code == 200, r.text
        return r.json()["replicas"]


class Load:
    """``threads`` clients sending predicts to one endpoint back to back until stopped."""

    def __init__(self, base_url: str, endpoint: str, instances, threads: int = 4) -> None:
        self.base, self.endpoint, self.instances = base_url, endpoint, instances
        self.ok = 0
        self.slowest = 0.0  # seconds: the longest any one request waited
        self.failures: list[str] = []
        self.by_model: Counter = Counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _run(self) -> None:
        api = Api(self.base)
        while not self._stop.is_set():
            try:
                sent = time.monotonic()
                r = api.predict(self.endpoint, self.instances)
                ok = r.status_code == 200
                with self._lock:
                    self.slowest = max(self.slowest, time.monotonic() - sent)
                    if ok:
                        self.ok += 1
                        self.by_model[r.json()["deployedModelId"]] += 1
                    else:
                        self.failures.append(f"{r.status_code} {r.text[:300]}")
            except requests.RequestException as exc:
                with self._lock:
                    self.failures.append(repr(exc))

    def wait_for(self, n: int, timeout: float = 60) -> None:
        """Until ``n`` more requests have succeeded."""
        target = self.ok + n
        deadline = time.monotonic() + timeout
        while self.ok < target:
            assert time.monotonic() < deadline, f"load stalled at {self.ok} ok, failures {self.failures[:3]}"
            time.sleep(0.05)
