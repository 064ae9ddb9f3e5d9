"""Deployment resource pools (issue 48) with the stock SDK: several models on one pool's replicas, each
behind its own endpoint, loaded on demand under the pool's memory budget.

Must-show 1: two models in one pool on two endpoints answer, one replica process serves both,
``query_deployed_models`` lists them, undeploying one leaves the other serving, and the pool cannot be
deleted while it holds a model. Must-show 2 and 3: a budget that fits 3 of 5 models (at most 3 loaded at
once, loads and unloads in the platform's metrics), and ten concurrent first requests that share one load.
"""
from __future__ import annotations

import concurrent.futures
import re
import shutil
import time

import numpy as np
import pytest
import requests

from modelyard.model.footprint import footprint_bytes
from modelyard.platform.dataplane import replica_secrets
from tests.platform.conftest import PARENT
from tests.platform.jobs_helpers import aiplatform  # noqa: F401  (the SDK pointed at the session platform)

pytestmark = pytest.mark.e2e


def _metric(platform, name: str, **labels: str) -> float | None:
    text = requests.get(f"{platform.url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def _wait_metric(platform, name: str, check, **labels: str) -> float:
    """The metric once ``check(value)`` holds (the pool's probe refreshes it every second)."""
    import time

    deadline = time.monotonic() + 30
    while True:
        value = _metric(platform, name, **labels)
        if value is not None and check(value):
            return value
        assert time.monotonic() < deadline, (name, labels, value)
        time.sleep(0.2)


def _wait_done(platform, operation: str) -> dict:
    import time

    deadline = time.monotonic() + 180
    while True:
        op = requests.get(f"{platform.url}/v1/{operation}", timeout=10).json()
        if op.get("done"):
            assert "error" not in op, op
            return op
        assert time.monotonic() < deadline, op
        time.sleep(0.2)


def _pool_pids(platform, pool_id: str) -> set[int]:
    marker = f"/pools/{pool_id}/".encode()
    return {pid for pid in platform.replica_pids() if marker in open(f"/proc/{pid}/cmdline", "rb").read()}


def _replicas_of(platform, dm_id: str) -> set[int]:
    rows = requests.get(f"{platform.url}/modelyard/v1/replicas", timeout=10).json()["replicas"]
    return {r["pid"] for r in rows if r["deployedModelId"] == dm_id and r["state"] == "SERVING"}


def test_two_models_share_one_pool_replica(aiplatform, platform, tiny_models):
    from google.api_core import exceptions

    tiny1, tiny2 = tiny_models["models"]["tiny1"], tiny_models["models"]["tiny2"]
    X = tiny_models["instances"]
    pool = aiplatform.DeploymentResourcePool.create(deployment_resource_pool_id="two-models",
                                                    machine_type="n1-standard-2", min_replica_count=1,
                                                    max_replica_count=1)
    assert pool.resource_name == f"{PARENT}/deploymentResourcePools/two-models"
    assert pool.gca_resource.dedicated_resources.min_replica_count == 1
    assert "two-models" in [p.name for p in aiplatform.DeploymentResourcePool.list()]
    models = [aiplatform.Model.upload(display_name=f"pooled-{i}", artifact_uri=t["path"],
                                      serving_container_image_uri="modelyard/serve")
              for i, t in enumerate((tiny1, tiny2))]
    endpoints = [aiplatform.Endpoint.create(display_name=f"pooled-{i}") for i in range(2)]
    for model, endpoint in zip(models, endpoints):
        endpoint.deploy(model, deployment_resource_pool=pool)
    answers = [endpoint.predict(instances=X) for endpoint in endpoints]
    for answer, expected, model in zip(answers, (tiny1, tiny2), models):
        np.testing.assert_allclose(answer.predictions, expected["predictions"], rtol=1e-5, atol=1e-6)
        assert answer.model_resource_name == model.resource_name
    dm_ids = [a.deployed_model_id for a in answers]
    assert endpoints[0].list_models()[0].shared_resources == pool.resource_name
    # One replica process serves both models.
    pids = _pool_pids(platform, "two-models")
    assert len(pids) == 1 and _replicas_of(platform, dm_ids[0]) == _replicas_of(platform, dm_ids[1]) == pids
    # The Open Inference Protocol through the gateway too: the endpoint's name, answered by its pooled model.
    x = np.asarray(X, np.float32)
    v2 = requests.post(f"{platform.url}/v2/models/{endpoints[1].name}/infer", timeout=30, json={
        "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]})
    assert v2.status_code == 200, v2.text
    assert v2.json()["model_name"] == endpoints[1].name
    np.testing.assert_allclose(np.reshape(v2.json()["outputs"][0]["data"], (3, 3)), tiny2["predictions"], rtol=1e-5,
                               atol=1e-6)
    meta = requests.get(f"{platform.url}/v2/models/{dm_ids[0]}", timeout=30).json()
    assert meta["name"] == dm_ids[0] and meta["inputs"][0]["name"] == "x"
    # The pool replica trusts only its platform and has no management scope either: it learns its models from
    # its private config file, so the repository's load stays refused even with its own secret.
    (pid,) = pids
    token_file = replica_secrets.token_file_of(pid)
    secret, scopes = token_file.read_text().split()
    assert "admin" not in scopes.split(",") and oct(token_file.stat().st_mode & 0o777) == "0o600"
    args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    assert b"--model_roots" in args and b"--model_config_file" in args
    port = int(args[args.index(b"--rest_api_port") + 1])
    load = f"http://127.0.0.1:{port}/v2/repository/models/{dm_ids[0]}/load"
    assert requests.post(load, json={}, timeout=10).status_code == 401
    assert requests.post(load, json={}, headers={"Authorization": f"Bearer {secret}"}, timeout=10).status_code == 403
    refs = [ref for page in pool.query_deployed_models() for ref in page]
    assert sorted(r.deployed_model_id for r in refs) == sorted(dm_ids)
    with pytest.raises(exceptions.BadRequest, match="undeploy them"):  # FAILED_PRECONDITION is HTTP 400
        pool.delete()
    refused = requests.delete(f"{platform.url}/v1/{pool.resource_name}", timeout=10)
    assert refused.status_code == 400 and refused.json()["error"]["status"] == "FAILED_PRECONDITION"

    endpoints[0].undeploy_all()
    again = endpoints[1].predict(instances=X)
    np.testing.assert_allclose(again.predictions, tiny2["predictions"], rtol=1e-5, atol=1e-6)
    assert [r.deployed_model_id for page in pool.query_deployed_models() for r in page] == [dm_ids[1]]
    assert _pool_pids(platform, "two-models") == pids  # the pool's replica stays
    endpoints[1].undeploy_all()
    pool.delete()
    assert not _pool_pids(platform, "two-models")  # the delete operation ended once its replica stopped
    with pytest.raises(exceptions.NotFound):
        aiplatform.DeploymentResourcePool("two-models")
    for endpoint in endpoints:
        endpoint.delete()
    for model in models:
        model.delete()


def test_a_budget_for_three_of_five_models(aiplatform, platform, tiny_models, tmp_path):
    from google.api_core import exceptions

    X = tiny_models["instances"]
    # Each model weighs max(its files, what its load was measured to cost): 2 MB of padding in its assets (never
    # read, so never resident) makes the files the weight, so "any 3 fit, no 4" holds whatever a load measures.
    tiny = []
    for name in ("tiny1", "tiny2"):
        padded = tmp_path / f"padded-{name}"
        shutil.copytree(tiny_models["models"][name]["path"], padded)
        (padded / "assets").mkdir(exist_ok=True)
        (padded / "assets" / "padding.bin").write_bytes(b"\0" * (2 << 20))  # a tiny model measures ~0.4 MB
        tiny.append({**tiny_models["models"][name], "path": str(padded)})
    sizes = [footprint_bytes(t["path"]) for t in tiny]
    budget = 3 * max(sizes) + min(sizes) // 2  # any 3 fit, no 4
    r = requests.post(platform.api("deploymentResourcePools"), timeout=30, json={
        "deploymentResourcePoolId": "three-of-five",
        "deploymentResourcePool": {"dedicatedResources": {"minReplicaCount": 1, "maxReplicaCount": 1},
                                   "modelMemoryBudgetBytes": budget}})
    assert r.status_code == 200, r.text
    _wait_done(platform, r.json()["name"])  # the create operation ends once the pool's replica answers
    pool = aiplatform.DeploymentResourcePool("three-of-five")
    assert _metric(platform, "modelyard_pool_replicas", pool="three-of-five") == 1

    again = requests.post(platform.api("deploymentResourcePools"), timeout=30, json={
        "deploymentResourcePoolId": "three-of-five", "deploymentResourcePool": {"dedicatedResources": {}}})
    assert again.status_code == 409 and again.json()["error"]["status"] == "ALREADY_EXISTS"

    # A model larger than the whole budget is refused at deploy, before anything changes.
    big = tmp_path / "big"
    shutil.copytree(tiny[0]["path"], big)
    (big / "assets" / "padding.bin").write_bytes(b"\0" * budget)
    big_model = aiplatform.Model.upload(display_name="too-big", artifact_uri=str(big),
                                        serving_container_image_uri="modelyard/serve")
    big_endpoint = aiplatform.Endpoint.create(display_name="too-big")
    with pytest.raises(exceptions.BadRequest, match="model memory budget"):  # FAILED_PRECONDITION
        big_endpoint.deploy(big_model, deployment_resource_pool=pool)

    both = requests.post(f"{platform.url}/v1/{big_endpoint.resource_name}:deployModel", timeout=30, json={
        "deployedModel": {"model": big_model.resource_name, "sharedResources": pool.resource_name,
                          "dedicatedResources": {"minReplicaCount": 1}}})
    assert both.status_code == 400 and "takes its pool's replicas" in both.json()["error"]["message"]

    models = [aiplatform.Model.upload(display_name=f"five-{i}", artifact_uri=tiny[i % 2]["path"],
                                      serving_container_image_uri="modelyard/serve") for i in range(5)]
    endpoints = [aiplatform.Endpoint.create(display_name=f"five-{i}") for i in range(5)]
    with concurrent.futures.ThreadPoolExecutor(5) as pool_threads:  # five deploys at once
        list(pool_threads.map(lambda me: me[1].deploy(me[0], deployment_resource_pool=pool), zip(models, endpoints)))
    dm_ids = [e.list_models()[0].id for e in endpoints]
    for _ in range(2):  # all five in turn, twice: every request needs a load, and an unload after the third
        for i, endpoint in enumerate(endpoints):
            np.testing.assert_allclose(endpoint.predict(instances=X).predictions, tiny[i % 2]["predictions"],
                                       rtol=1e-5, atol=1e-6)
    deadline = time.monotonic() + 30  # five loaded into room for three: two unloaded at least
    while sum(_metric(platform, "modelyard_pool_model_unloads_total", deployed_model=d) or 0 for d in dm_ids) < 2:
        assert time.monotonic() < deadline, "fewer than two unloads"
        time.sleep(0.2)
    # Five models through room for three, twice: at least 5 + 2 loads under any eviction order (Belady's
    # bound). Plain LRU makes it 10, but a request's hold on its model ends just after its answer is sent,
    # so under load the next request can find the least recently used model still held and evict another.
    loads = {d: _wait_metric(platform, "modelyard_pool_model_loads_total", lambda v: v >= 1, deployed_model=d)
             for d in dm_ids}
    deadline = time.monotonic() + 30
    while sum(loads.values()) < 7 and time.monotonic() < deadline:
        time.sleep(0.2)
        loads = {d: _metric(platform, "modelyard_pool_model_loads_total", deployed_model=d) for d in dm_ids}
    assert sum(loads.values()) >= 7, loads
    assert _metric(platform, "modelyard_pool_models_resident_peak", pool="three-of-five") == 3
    assert _metric(platform, "modelyard_pool_models_resident", pool="three-of-five") <= 3
    # The console shows each pooled model's state: where it is loaded, its loads, how long since it was used
    # (as the once-a-second probe saw it: waited for until it saw the last request's load).
    deadline = time.monotonic() + 30
    while True:
        state = requests.get(f"{platform.url}/console/api/state", timeout=10).json()
        pooled = {dm["id"]: dm["pool"] for ep in state["endpoints"] for dm in ep["deployedModels"] if dm["pool"]}
        if pooled[dm_ids[-1]]["loadedOn"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert all(pooled[d]["loads"] >= 1 for d in dm_ids) and {pooled[d]["pool"] for d in dm_ids} == {"three-of-five"}
    last = pooled[dm_ids[-1]]  # used last: loaded now, on the pool's one replica
    assert len(last["loadedOn"]) == 1 and last["idleSeconds"] is not None and last["lastLoadSeconds"] > 0
    assert sum(1 for d in dm_ids if pooled[d]["loadedOn"]) <= 3

    # Ten concurrent first requests to a model not loaded: one load, ten answers.
    cold = dm_ids[1]  # loaded second in the last round: unloaded since
    assert _wait_metric(platform, "modelyard_pool_model_loaded", lambda v: v == 0, deployed_model=cold) == 0
    url = f"{platform.url}/v1/{endpoints[1].resource_name}:predict"
    with concurrent.futures.ThreadPoolExecutor(10) as threads:
        answers = list(threads.map(lambda _: requests.post(url, json={"instances": X}, timeout=60), range(10)))
    for answer in answers:
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(answer.json()["predictions"], tiny[1]["predictions"], rtol=1e-5, atol=1e-6)
    assert _wait_metric(platform, "modelyard_pool_model_loads_total", lambda v: v != 2, deployed_model=cold) == 3
    assert _metric(platform, "modelyard_pool_models_resident_peak", pool="three-of-five") == 3

    for endpoint in endpoints + [big_endpoint]:
        endpoint.undeploy_all()
        endpoint.delete()
    pool.delete()
    for model in models + [big_model]:
        model.delete()
    assert re.search(r'modelyard_pool_replicas\{pool="three-of-five"\}', requests.get(
        f"{platform.url}/metrics", timeout=10).text) is None


@pytest.mark.parametrize("body,status,words", [
    ({"deploymentResourcePoolId": "Bad_Id", "deploymentResourcePool": {"dedicatedResources": {}}}, 400,
     "deployment_resource_pool_id"),
    ({"deploymentResourcePoolId": "p1", "deploymentResourcePool": {}}, 400, "dedicated_resources is required"),
    ({"deploymentResourcePoolId": "p1", "deploymentResourcePool": {"dedicatedResources": {
        "minReplicaCount": 3, "maxReplicaCount": 2}}}, 400, "min_replica_count (3) <= max_replica_count (2)"),
    ({"deploymentResourcePoolId": "p1", "deploymentResourcePool": {"dedicatedResources": {},
                                                                   "modelMemoryBudgetBytes": -1}}, 400, "0 (no budget)"),
    ({"deploymentResourcePoolId": "p1", "deploymentResourcePool": {"dedicatedResources": {}, "size": 3}}, 400,
     'Unknown name "size"'),
])
def test_bad_pool_requests_get_googles_errors(platform, body, status, words):
    r = requests.post(platform.api("deploymentResourcePools"), json=body, timeout=30)
    assert r.status_code == status and words in r.json()["error"]["message"], r.text
    assert r.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert requests.get(platform.api("deploymentResourcePools/p1"), timeout=10).status_code == 404  # nothing made


def test_a_pool_that_is_not_there(platform, tiny_models):
    missing = requests.get(platform.api("deploymentResourcePools/nowhere"), timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["status"] == "NOT_FOUND"
    assert requests.get(platform.api("deploymentResourcePools?filter=x"), timeout=10).status_code == 400
    assert requests.get(platform.api("deploymentResourcePools/nowhere:queryDeployedModels"),
                        timeout=10).status_code == 404
    model = requests.post(platform.api("models:upload"), timeout=60, json={"model": {
        "displayName": "no-pool", "artifactUri": tiny_models["models"]["tiny1"]["path"]}}).json()
    endpoint = requests.post(platform.api("endpoints"), json={"displayName": "no-pool"}, timeout=30).json()
    model_name = _wait_done(platform, model["name"])["response"]["model"]
    endpoint_name = _wait_done(platform, endpoint["name"])["response"]["name"]
    r = requests.post(f"{platform.url}/v1/{endpoint_name}:deployModel", timeout=30, json={"deployedModel": {
        "model": model_name, "sharedResources": f"{PARENT}/deploymentResourcePools/nowhere"}})
    assert r.status_code == 404 and "nowhere" in r.json()["error"]["message"]
    assert "deployedModels" not in requests.get(f"{platform.url}/v1/{endpoint_name}", timeout=10).json()
    requests.delete(f"{platform.url}/v1/{endpoint_name}", timeout=10)
    requests.delete(f"{platform.url}/v1/{model_name}", timeout=10)
