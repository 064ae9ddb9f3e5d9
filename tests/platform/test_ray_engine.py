"""Issue 15, several hosts: ``modelyard platform --engine ray`` runs a deployed model's replicas as
Ray actors on the shared two-node Ray cluster (tests/ray_cluster.py). Two replicas land on the two
nodes (their actors' node ids, asked of Ray), predictions equal the model's own, a restarted
platform adopts them, a replica whose
``modelyard serve`` is killed with SIGKILL is replaced, and undeploying ends the actors and their
processes. A missing or unreachable cluster stops the platform at start with exit code 2."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from modelyard.ports import free_port
from tests.platform.client import Api
from tests.platform.conftest import _env, start_platform

# Asks Ray (from a short-lived driver, so pytest never becomes one) where each replica's actor runs.
_NODES_SCRIPT = """
import json, sys, ray
ray.init(address=sys.argv[1], namespace="modelyard", logging_level="ERROR", log_to_driver=False)
out = {}
for rid in sys.argv[2:]:
    try:
        out[rid] = ray.get(ray.get_actor("modelyard-replica-" + rid).info.remote(), timeout=60)["node_id"]
    except ValueError:
        out[rid] = None  # no such actor
print(json.dumps(out))
"""


# Ends every replica actor left in the namespace (a failed test must not hold the cluster's CPUs).
_CLEANUP_SCRIPT = """
import sys, ray
ray.init(address=sys.argv[1], namespace="modelyard", logging_level="ERROR", log_to_driver=False)
for name in ray.util.list_named_actors():
    if name.startswith("modelyard-replica-"):
        ray.kill(ray.get_actor(name), no_restart=True)
"""


def actor_nodes(address: str, replica_ids: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", _NODES_SCRIPT, address, *replica_ids], env=_env(),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _serving(api: Api, dm: str) -> list[dict]:
    return [r for r in api.replicas() if r["deployedModelId"] == dm and r["state"] == "SERVING"]


def _pid_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _assert_predictions(api: Api, ep: str, tiny_models: dict) -> None:
    r = api.predict(ep, tiny_models["instances"])
    assert r.status_code == 200, r.text
    got, want = r.json()["predictions"], tiny_models["models"]["tiny1"]["predictions"]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=1e-5)


def test_replicas_on_two_ray_nodes_replaced_and_stopped(ray_cluster, tiny_models, tmp_path_factory):
    p = start_platform(tmp_path_factory, "rayplatform", _env(),
                       ["--engine", "ray", "--ray-address", ray_cluster, "--artifact-root", tiny_models["root"]])
    try:
        api = Api(p.url)
        model = api.upload(tiny_models["models"]["tiny1"]["path"], "on-ray")
        ep = api.create_endpoint("ray")
        dm = api.deploy(ep, model, min_r=2, max_r=2)
        first = _serving(api, dm)
        assert len(first) == 2
        nodes = actor_nodes(ray_cluster, [r["id"] for r in first])
        assert None not in nodes.values() and len(set(nodes.values())) == 2, nodes  # one replica per node
        for _ in range(4):  # both replicas answer (least outstanding spreads them)
            _assert_predictions(api, ep, tiny_models)

        # A restarted platform finds the detached actors by name and adopts their replicas.
        p.stop()
        p.start()
        assert {r["id"] for r in _serving(api, dm)} == {r["id"] for r in first}
        _assert_predictions(api, ep, tiny_models)

        victim = first[0]
        os.kill(victim["pid"], signal.SIGKILL)  # the serve process on its node (one machine here)
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
    finally:
        p.cleanup()
        subprocess.run([sys.executable, "-c", _CLEANUP_SCRIPT, ray_cluster], env=_env(), capture_output=True,
                       timeout=180)


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
