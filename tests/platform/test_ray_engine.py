"""Issues 15 and 31, several machines that share nothing: ``modelyard platform --engine ray`` runs a
deployed model's replicas as Ray actors on the shared Ray cluster (tests/ray_cluster.py), whose
second node sees none of the head's test files. Two replicas land on the two nodes (their actors'
node ids, asked of Ray); the model, uploaded from the platform host's local path or from gs://, is
fetched by the node without it through object storage into its own cache; predictions equal the
model's own; a restarted platform adopts the replicas; a replica whose ``modelyard serve`` is killed
is replaced; a node killed under predict load costs no request and its replica is replaced on a live
node; undeploying ends the actors and their processes. A missing or unreachable cluster stops the
platform at start with exit code 2."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from modelyard.ports import free_port
from tests.platform.client import Api
from tests.platform.conftest import RAY_MODELS_BUCKET as GS_BUCKET, _env, require
from tests.platform.ray_platform import actor_infos, cleanup_actors, running
from tests.ray_cluster import alive_nodes, session_cluster


# The session's Ray cluster starts in the first test that asks for it: minutes on the busy shared 2-core
# machine (a node whose agents start too slowly is started again), beyond the suite's 600 s per test.
pytestmark = pytest.mark.timeout(1800)

def actor_nodes(address: str, replica_ids: list[str]) -> dict:
    return {rid: info and info.get("node_id") for rid, info in actor_infos(address, replica_ids).items()}


def _serving(api: Api, dm: str) -> list[dict]:
    return [r for r in api.replicas() if r["deployedModelId"] == dm and r["state"] == "SERVING"]


def _pid_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _assert_predictions(api: Api, ep: str, tiny_models: dict, model: str = "tiny1") -> None:
    r = api.predict(ep, tiny_models["instances"])
    assert r.status_code == 200, r.text
    got, want = r.json()["predictions"], tiny_models["models"][model]["predictions"]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=1e-5)


@pytest.fixture(scope="module")
def ray_platform(ray_platform, ray_cluster):
    """The session's platform on the Ray cluster (tests/platform/conftest.py), running; the replica actors
    this module leaves are ended at its end."""
    try:
        yield running(ray_platform)
    finally:
        cleanup_actors(ray_cluster)


def _assert_spread_and_cached(ray_cluster: str, replicas: list[dict], local_path: str | None) -> None:
    """One replica per node; the one on the node without the platform's files holds the model in that
    node's own cache (seen through the node's mount namespace, absent from the head's disk)."""
    cluster = session_cluster()
    infos = actor_infos(ray_cluster, [r["id"] for r in replicas])
    assert None not in infos.values() and len({i["node_id"] for i in infos.values()}) == 2, infos
    head_id = cluster.node_id(cluster.head)
    on_head = next(i for i in infos.values() if i["node_id"] == head_id)
    elsewhere = next(i for i in infos.values() if i["node_id"] != head_id)
    if local_path is not None:  # the platform's host has the path: used in place there
        assert on_head["model_dir"] == local_path and not on_head["cached"], on_head
    assert elsewhere["cached"], elsewhere
    node = cluster.node_of(elsewhere["node_id"])
    copy = cluster.node_root(node) / elsewhere["model_dir"].lstrip("/")
    assert (copy / "saved_model.pb").is_file(), f"{copy} is not in the node's cache"
    assert copy.parent.name == "artifacts" and copy.name.isalnum()  # <cache>/artifacts/<content hash>
    if local_path is not None:
        assert not (cluster.node_root(node) / local_path.lstrip("/")).exists()  # the node never had the path


def test_replicas_on_two_ray_nodes_replaced_and_stopped(ray_cluster, ray_platform, tiny_models):
    p = ray_platform
    api = Api(p.url)
    local = tiny_models["models"]["tiny1"]["path"]
    model = api.upload(local, "on-ray")
    ep = api.create_endpoint("ray")
    dm = api.deploy(ep, model, min_r=2, max_r=2)
    first = _serving(api, dm)
    assert len(first) == 2
    _assert_spread_and_cached(ray_cluster, first, str(Path(local).resolve()))
    for _ in range(4):  # both replicas answer (least outstanding spreads them)
        _assert_predictions(api, ep, tiny_models)

    # A restarted platform finds the detached actors by name and adopts their replicas.
    p.stop()
    p.start()
    assert {r["id"] for r in _serving(api, dm)} == {r["id"] for r in first}
    _assert_predictions(api, ep, tiny_models)

    victim = first[0]
    os.kill(victim["pid"], signal.SIGKILL)  # its serve process (no PID namespace: the node's pids are the host's)
    deadline = time.monotonic() + 180
    while True:
        now = _serving(api, dm)
        if len(now) == 2 and victim["id"] not in {r["id"] for r in now}:
            break
        assert time.monotonic() < deadline, f"no replacement for the killed replica: {api.replicas()}"
        time.sleep(0.5)
    replacement = next(r for r in now if r["id"] != first[1]["id"])
    assert actor_nodes(ray_cluster, [victim["id"]]) == {victim["id"]: None}  # its actor ended
    assert actor_nodes(ray_cluster, [replacement["id"]])[replacement["id"]] is not None
    _assert_predictions(api, ep, tiny_models)

    api.undeploy(ep, dm)
    assert not [r for r in api.replicas() if r["deployedModelId"] == dm]
    gone = actor_nodes(ray_cluster, [r["id"] for r in now])
    assert set(gone.values()) == {None}, gone
    assert not [r["pid"] for r in now if _pid_running(r["pid"])]
    api.ok("DELETE", f"endpoints/{ep}")


def test_model_from_gs_on_two_nodes(ray_cluster, ray_platform, tiny_models):
    """A model uploaded from gs:// (the platform's own Cloud Storage) deploys 2 replicas over 2 nodes;
    both answer; the node without the platform's copy fetched it into its own cache."""
    storage = require("google.cloud.storage", "pip install -e '.[test]' (google-cloud-aiplatform brings it)")
    import google.auth.credentials

    client = storage.Client(project="local", credentials=google.auth.credentials.AnonymousCredentials(),
                            client_options={"api_endpoint": ray_platform.storage_url})
    bucket = client.bucket(GS_BUCKET)
    if not bucket.exists():
        client.create_bucket(GS_BUCKET)
    src = Path(tiny_models["models"]["tiny2"]["path"])
    for f in sorted(x for x in src.rglob("*") if x.is_file()):
        bucket.blob(f"tiny2/{f.relative_to(src).as_posix()}").upload_from_filename(str(f))
    api = Api(ray_platform.url)
    model = api.upload(f"gs://{GS_BUCKET}/tiny2", "from-gs")
    ep = api.create_endpoint("ray-gs")
    dm = api.deploy(ep, model, min_r=2, max_r=2)
    try:
        replicas = _serving(api, dm)
        assert len(replicas) == 2
        _assert_spread_and_cached(ray_cluster, replicas, None)
        for _ in range(4):
            _assert_predictions(api, ep, tiny_models, "tiny2")
    finally:
        api.undeploy(ep, dm)
        api.ok("DELETE", f"endpoints/{ep}")


class _Load:
    """``threads`` clients predicting in a loop until stopped; counts answers and failures."""

    def __init__(self, api: Api, ep: str, instances, threads: int = 16) -> None:
        self.api, self.ep, self.instances = api, ep, instances
        self.ok = 0
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        import requests

        session = requests.Session()
        url = self.api.url(f"endpoints/{self.ep}:predict")
        while not self.stop.is_set():
            try:
                r = session.post(url, json={"instances": self.instances}, timeout=60)
                failure = None if r.status_code == 200 else f"{r.status_code} {r.text[:200]}"
            except Exception as exc:  # the gateway itself must not drop the connection
                failure = f"{type(exc).__name__}: {exc}"
            with self.lock:
                if failure is None:
                    self.ok += 1
                else:
                    self.failed.append(failure)

    def __enter__(self) -> "_Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)


def test_node_killed_under_load_costs_no_request(ray_cluster, ray_platform, tiny_models):
    """Must show 4 of issue 31: a third node joins, 2 replicas run on 2 of the 3 nodes, and a node other
    than the head that holds one is killed (raylet, workers, serve: SIGKILL) under predict load at
    concurrency 16. No request fails (the gateway retries on the other replica), and a replacement
    comes up on a live node. How long that takes is measured by bench/ray_node_death.py, not asserted."""
    cluster = session_cluster()
    cluster.add_node()
    api = Api(ray_platform.url)
    model = api.upload(tiny_models["models"]["tiny1"]["path"], "node-death")
    ep = api.create_endpoint("ray-node-death")
    dm = api.deploy(ep, model, min_r=2, max_r=2)
    try:
        first = _serving(api, dm)
        nodes = actor_nodes(ray_cluster, [r["id"] for r in first])
        head_id = cluster.node_id(cluster.head)
        victim_id, victim_node = next((rid, n) for rid, n in nodes.items() if n != head_id)
        victim = cluster.node_of(victim_node)
        with _Load(api, ep, tiny_models["instances"]) as load:
            deadline = time.monotonic() + 60
            while load.ok < 50:  # the load runs before the kill
                assert time.monotonic() < deadline and not load.failed, (load.ok, load.failed[:3])
                time.sleep(0.1)
            cluster.kill_node(victim)
            deadline = time.monotonic() + 180
            while True:
                now = _serving(api, dm)
                if len(now) == 2 and victim_id not in {r["id"] for r in now}:
                    break
                assert time.monotonic() < deadline, f"no replacement for the dead node's replica: {api.replicas()}"
                time.sleep(0.25)
            served_before = load.ok
            deadline = time.monotonic() + 60
            while load.ok < served_before + 50:  # the replacement is in routing and the load goes on
                assert time.monotonic() < deadline, load.ok
                time.sleep(0.1)
        assert load.failed == [], f"{len(load.failed)} failed of {load.ok + len(load.failed)}: {load.failed[:5]}"
        new = next(r for r in now if r["id"] != victim_id and r["id"] not in {f["id"] for f in first})
        placed = actor_nodes(ray_cluster, [new["id"]])[new["id"]]
        assert placed is not None and placed != victim_node
        # Ray's GCS marks the killed node dead after its health check's misses, which on a busy machine can
        # come after the platform has already replaced the replica: wait for it, as the platform did.
        deadline = time.monotonic() + 60
        while victim_node in {n["id"] for n in alive_nodes(ray_cluster)}:
            assert time.monotonic() < deadline, f"Ray still lists the killed node {victim_node} alive"
            time.sleep(1.0)
        _assert_predictions(api, ep, tiny_models)
    finally:
        api.undeploy(ep, dm)
        api.ok("DELETE", f"endpoints/{ep}")
        assert len(alive_nodes(ray_cluster, want=2)) >= 2  # the session's cluster keeps two nodes


def test_ray_engine_without_a_cluster_stops_the_start(tmp_path):
    port = free_port()  # nothing listens there
    proc = subprocess.run([sys.executable, "-m", "modelyard.platform", "--port", str(free_port()),
                           "--store", str(tmp_path / "db.sqlite"), "--engine", "ray",
                           "--ray-address", f"127.0.0.1:{port}"], env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot reach the Ray cluster at '127.0.0.1:{port}'" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "modelyard.platform", "--port", str(free_port()),
                           "--store", str(tmp_path / "db.sqlite"), "--engine", "ray"],
                          env={**_env(), "RAY_ADDRESS": ""}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--engine ray needs --ray-address" in proc.stderr
