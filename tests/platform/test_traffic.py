"""Tests 2-4 of issue 15 on one endpoint, while clients send predicts without pause:
a 90/10 split, a header-pinned canary, update-traffic to 0/100 and undeploy; kill -9 of one of two
replicas (retried elsewhere, replaced); the platform stopped by SIGTERM and by kill -9 (replicas keep
serving, state and replicas re-adopted). Zero failed client requests throughout. One layer down: the
split's chooser (how closely it keeps the percentages, over more draws than HTTP requests need)."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import requests

from modelyard.platform.dataplane import replica_secrets
from tests.platform.client import Api, Load

PIN = "X-Modelyard-Deployed-Model-Id"


@pytest.fixture(scope="module")
def live(platform, tiny_models):
    api = Api(platform.url)
    m1 = api.upload(tiny_models["models"]["tiny1"]["path"], "tiny1")
    m2 = api.upload(tiny_models["models"]["tiny2"]["path"], "tiny2")
    ep = api.create_endpoint("traffic")
    a = api.deploy(ep, m1)
    return {"api": api, "endpoint": ep, "a": a, "m2": m2, "x": tiny_models["instances"],
            "expected": {k: v["predictions"] for k, v in tiny_models["models"].items()}}


def _replicas_of(api: Api, dm: str) -> list[dict]:
    return [r for r in api.replicas() if r["deployedModelId"] == dm and r["state"] == "SERVING"]


def test_split_canary_update_traffic_and_undeploy_lose_no_request(platform, live):
    api, ep, a = live["api"], live["endpoint"], live["a"]
    with Load(platform.url, ep, live["x"]) as load:
        load.wait_for(20)
        b = api.deploy(ep, live["m2"], split={a: 90, "0": 10}, min_r=2, max_r=2)
        live["b"] = b
        assert api.ok("GET", f"endpoints/{ep}")["trafficSplit"] == {a: 90, b: 10}

        # The gateway follows the split: 200 answers, both models, b near 10% (its precision one layer
        # down: test_the_split_chooser_follows_the_percentages, the chooser the gateway routes with).
        counts = {a: 0, b: 0}
        for _ in range(200):
            r = api.predict(ep, live["x"])
            assert r.status_code == 200, r.text
            counts[r.json()["deployedModelId"]] += 1
        share = 100 * counts[b] / 200
        assert 3 <= share <= 17, counts  # 10% +- 7 points (over 3 standard deviations at n=200)

        for _ in range(20):  # the canary, pinned by header
            r = api.predict(ep, live["x"], headers={PIN: b})
            assert r.status_code == 200 and r.json()["deployedModelId"] == b
        np.testing.assert_allclose(r.json()["predictions"], live["expected"]["tiny2"], rtol=1e-5, atol=1e-6)

        api.set_split(ep, {a: 0, b: 100})
        load.wait_for(50)
        assert {api.predict(ep, live["x"]).json()["deployedModelId"] for _ in range(50)} == {b}
        api.undeploy(ep, a)
        load.wait_for(50)
    assert not load.failures, load.failures[:5]
    assert load.by_model[a] > 0 and load.by_model[b] > 0
    assert [d["id"] for d in api.ok("GET", f"endpoints/{ep}")["deployedModels"]] == [b]
    assert not [r for r in api.replicas() if r["deployedModelId"] == a]  # drained and stopped


def test_kill_9_of_one_replica_loses_no_request_and_is_replaced(platform, live):
    api, ep, b = live["api"], live["endpoint"], live["b"]
    before = _replicas_of(api, b)
    assert len(before) == 2
    with Load(platform.url, ep, live["x"]) as load:
        load.wait_for(100)
        os.kill(before[0]["pid"], signal.SIGKILL)
        load.wait_for(300)
        deadline = time.monotonic() + 120
        while True:
            now = _replicas_of(api, b)
            if len(now) == 2 and before[0]["pid"] not in {r["pid"] for r in now}:
                break
            assert time.monotonic() < deadline, f"no replacement replica: {now}"
            time.sleep(0.5)
        load.wait_for(100)
    assert not load.failures, load.failures[:5]
    new = [r for r in _replicas_of(api, b) if r["pid"] != before[1]["pid"]]
    assert len(new) == 1 and new[0]["served"] > 0  # the replacement serves


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_platform_restart_keeps_state_and_replicas(platform, live, sig):
    api, ep, b = live["api"], live["endpoint"], live["b"]
    endpoint = api.ok("GET", f"endpoints/{ep}")
    models = api.ok("GET", "models")
    replicas = sorted((r["pid"], r["port"]) for r in _replicas_of(api, b))
    platform.stop(sig)
    for pid, port in replicas:  # the replicas serve on while the control plane is down (to their secret)
        secret = replica_secrets.read_secret(replica_secrets.token_file_of(pid))
        r = requests.post(f"http://127.0.0.1:{port}/v1/models/model:predict", json={"instances": live["x"]},
                          headers={"Authorization": f"Bearer {secret}"}, timeout=10)
        assert r.status_code == 200
        np.testing.assert_allclose(r.json()["predictions"], live["expected"]["tiny2"], rtol=1e-5, atol=1e-6)
    platform.start()
    assert api.ok("GET", f"endpoints/{ep}") == endpoint
    assert api.ok("GET", "models") == models
    assert sorted((r["pid"], r["port"]) for r in _replicas_of(api, b)) == replicas  # adopted, not restarted
    r = api.predict(ep, live["x"])
    assert r.status_code == 200 and r.json()["deployedModelId"] == b


def test_the_split_chooser_follows_the_percentages():
    """The chooser the gateway routes each request with (routing.Router.choose_deployed): 90/10 over
    100,000 draws within half a point; a 0% model never answers; no traffic at all chooses none."""
    import random

    from modelyard.platform.dataplane.traffic import Chooser

    chooser = Chooser({"a": 90, "b": 10, "off": 0}, random.Random(0))
    draws = [chooser.choose() for _ in range(100_000)]
    assert set(draws) == {"a", "b"}
    assert abs(100 * draws.count("b") / len(draws) - 10) < 0.5  # sd 0.095 points at n=100,000
    assert Chooser({"a": 0}).choose() is None and Chooser({}).choose() is None
    shadow = Chooser({"a": 100}, random.Random(1))
    assert abs(sum(shadow.coin(25) for _ in range(100_000)) / 1000 - 25) < 0.5  # mirrored 25% of requests
