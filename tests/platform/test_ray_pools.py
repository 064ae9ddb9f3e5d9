"""Issue 48 on the Ray engine: a deployment resource pool's replicas are Ray actors, placed as any replica
(SPREAD over the shared test cluster's two one-CPU nodes), told the pool's models by an actor call that
writes each replica's private model config on its node. Two models deployed into a pool of two replicas
both answer through the gateway, the replicas are on different nodes (the second node fetched the
models through object storage: it sees none of the head's files), and deleting the pool ends the actors.
The platform runs behind ``--auth-token`` with ``--auth-predict`` (as a shared cluster's platform would):
the replicas' fetches and the gateway's calls carry the platform's own credentials, a client needs the token."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from tests.platform.client import Api
from tests.platform.conftest import PARENT, TOKEN
from tests.platform.ray_platform import actor_infos, cleanup_actors, start_ray_platform

from modelyard.platform.dataplane import artifact_cache
from modelyard.platform.dataplane.pools import CHANGES_FILE, CONFIG_FILE
from modelyard.platform.dataplane.replicas_ray import PoolReplicaActor


@pytest.fixture(scope="module")
def ray_pool_platform(ray_cluster, tiny_models, tmp_path_factory):
    p = start_ray_platform(tmp_path_factory, "raypools", ray_cluster, ["--artifact-root", tiny_models["root"],
                                                                        "--auth-token", TOKEN, "--auth-predict"])
    try:
        yield p
    finally:
        p.cleanup()
        cleanup_actors(ray_cluster)


@pytest.mark.e2e
@pytest.mark.timeout(1800)  # the session's Ray cluster may start in this test
def test_two_models_in_a_pool_of_two_ray_replicas_on_two_nodes(ray_cluster, ray_pool_platform, tiny_models):
    api = Api(ray_pool_platform.url, token=TOKEN)
    op = api.ok("POST", "deploymentResourcePools", {
        "deploymentResourcePoolId": "on-ray",
        "deploymentResourcePool": {"dedicatedResources": {"minReplicaCount": 2, "maxReplicaCount": 2}}})
    api.wait(op)
    deployed = {}
    for name in ("tiny1", "tiny2"):
        model = api.upload(tiny_models["models"][name]["path"], f"pooled-{name}")
        ep = api.create_endpoint(f"pooled-{name}")
        body = {"deployedModel": {"model": f"{PARENT}/models/{model}",
                                  "sharedResources": f"{PARENT}/deploymentResourcePools/on-ray"}}
        dm = api.wait(api.ok("POST", f"endpoints/{ep}:deployModel", body))["deployedModel"]["id"]
        deployed[name] = (ep, dm)
    for name, (ep, _dm) in deployed.items():
        for _ in range(4):  # the gateway spreads over both replicas: each loads the model on its first request
            r = api.predict(ep, tiny_models["instances"])
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(r.json()["predictions"], tiny_models["models"][name]["predictions"],
                                       rtol=1e-5, atol=1e-6)
    no_token = Api(ray_pool_platform.url).predict(deployed["tiny1"][0], tiny_models["instances"])
    assert no_token.status_code == 401 and no_token.json()["error"]["status"] == "UNAUTHENTICATED", no_token.text

    rows = api.replicas()
    by_dm = {dm: {r["id"] for r in rows if r["deployedModelId"] == dm} for _ep, dm in deployed.values()}
    ids = by_dm[deployed["tiny1"][1]]
    assert len(ids) == 2 and by_dm[deployed["tiny2"][1]] == ids, rows  # the pool's two replicas serve both
    infos = actor_infos(ray_cluster, sorted(ids))
    assert None not in infos.values() and len({i["node_id"] for i in infos.values()}) == 2, infos

    for ep, dm in deployed.values():
        api.undeploy(ep, dm)
    api.wait(api.ok("DELETE", "deploymentResourcePools/on-ray"))
    deadline = time.monotonic() + 60
    while set(actor_infos(ray_cluster, sorted(ids)).values()) != {None}:
        assert time.monotonic() < deadline, "the pool's replica actors outlived its delete"
        time.sleep(0.5)


def test_a_pool_actor_writes_the_model_set_it_was_told_last(tmp_path, monkeypatch):
    """One layer down, no Ray: the actor's ``set_models`` links each model under its replica's directory on
    its node and writes the config; a call older than the last applied (a threaded actor may run two out
    of order) changes nothing; a model left out is removed by a line of the config's journal; a hot model
    is loaded ahead by another."""
    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path / "cache"))
    actor = PoolReplicaActor("r1", [], roots=None)
    paths = {name: tmp_path / "platform" / name for name in ("tiny1", "tiny2")}
    for name, path in paths.items():
        path.mkdir(parents=True)
        (path / "saved_model.pb").write_bytes(name.encode())
    sources = {f"dm-{name}": {"digest": artifact_cache.digest_of(path), "uri": "gs://unused/x", "path": str(path)}
               for name, path in paths.items()}  # the node has the platform's paths: used in place, not fetched
    assert actor.set_models(10, sources) == ["dm-tiny1", "dm-tiny2"]
    config = (actor.rdir / CONFIG_FILE).read_text()
    assert config.count("config {") == 2 and str(actor.rdir / "models" / "dm-tiny2") in config
    assert (actor.rdir / "models" / "dm-tiny1" / "1").resolve() == paths["tiny1"].resolve()
    assert actor.set_models(9, {}) == ["dm-tiny1", "dm-tiny2"]  # older: ignored
    assert (actor.rdir / CONFIG_FILE).read_text() == config
    assert actor.set_models(11, {"dm-tiny2": sources["dm-tiny2"]}) == ["dm-tiny2"]
    # The change is a line of the config's journal, which the replica applies after the config (O(1) a change).
    changes = [json.loads(line) for line in (actor.rdir / CHANGES_FILE).read_text().splitlines()]
    assert changes == [{"remove": "dm-tiny1"}] and (actor.rdir / CONFIG_FILE).read_text() == config
    actor.load_ahead("dm-tiny2")  # the platform found it hot
    actor.load_ahead("dm-tiny1")  # no longer served here: nothing to load
    assert (actor.rdir / CHANGES_FILE).read_text().splitlines()[1:] == [json.dumps({"load": "dm-tiny2"})]
    actor._release()
