"""Deployment resource pools under faults (issue 48, must-show 4 and 5), on a platform of their own (it is
restarted): a hot model loaded ahead on the pool's second replica (load_ahead.py), a pool replica killed
under load (requests fail over, the models load on the other replica, none fails after the gateway's
retry, the pool gets its replica back), then a platform restart that adopts the pool's replicas with the
models they hold loaded (no reload, same processes); a follower platform on the same store routes to them.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
import requests

from tests.platform.client import Api
from tests.platform.conftest import PARENT, PlatformProcess, _env, start_platform

pytestmark = pytest.mark.e2e


def _wait(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)


def _metrics(url: str, name: str) -> dict[tuple, float]:
    """{(replica, deployed_model): value} of one pool metric family."""
    out = {}
    for line in requests.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{"):
            labels = dict(part.split("=", 1) for part in line[len(name) + 1:line.index("}")].split(","))
            out[(labels.get("replica", "").strip('"'), labels.get("deployed_model", "").strip('"'))] = \
                float(line.rsplit(" ", 1)[1])
    return out


def _pool_replicas(api: Api, dm: str) -> list[dict]:
    return [r for r in api.replicas() if r["deployedModelId"] == dm and r["state"] == "SERVING"]


def test_a_killed_pool_replica_fails_over_and_a_restart_adopts_the_pool(tmp_path_factory, tiny_models):
    p = start_platform(tmp_path_factory, "pool-faults", _env(), ["--artifact-root", tiny_models["root"]])
    try:
        api = Api(p.url)
        X = tiny_models["instances"]
        expected = {name: tiny_models["models"][name]["predictions"] for name in ("tiny1", "tiny2")}
        api.wait(api.ok("POST", "deploymentResourcePools", {
            "deploymentResourcePoolId": "faults",
            "deploymentResourcePool": {"dedicatedResources": {"minReplicaCount": 2, "maxReplicaCount": 2}}}))
        endpoints, dms = {}, {}
        for name in ("tiny1", "tiny2"):
            model = api.upload(tiny_models["models"][name]["path"], name)
            endpoints[name] = api.create_endpoint(name)
            dms[name] = api.wait(api.ok("POST", f"endpoints/{endpoints[name]}:deployModel", {"deployedModel": {
                "model": f"{PARENT}/models/{model}", "sharedResources": f"{PARENT}/deploymentResourcePools/faults"}}))[
                "deployedModel"]["id"]
        before = {r["pid"] for r in _pool_replicas(api, dms["tiny1"])}
        assert len(before) == 2 and before == {r["pid"] for r in _pool_replicas(api, dms["tiny2"])}

        # Load ahead (dataplane/load_ahead.py): one client asks tiny1 back to back, so its home replica is never
        # busy and no request spills to the other; once its rate is hot, the pool loads it there too.
        session = requests.Session()

        def on_both() -> bool:
            for _ in range(20):
                assert session.post(api.url(f"endpoints/{endpoints['tiny1']}:predict"), json={"instances": X},
                                    timeout=60).status_code == 200
            return len({rep for (rep, dm), v in _metrics(p.url, "modelyard_pool_model_loaded").items()
                        if dm == dms["tiny1"] and v == 1}) == 2

        _wait(on_both, 60, "tiny1 loaded ahead on the second replica")

        # Load on both models; one pool replica is killed in the middle of it.
        failures, answered, stop = [], [0], threading.Event()

        def client(name: str) -> None:
            session = requests.Session()
            while not stop.is_set():
                r = session.post(api.url(f"endpoints/{endpoints[name]}:predict"), json={"instances": X}, timeout=60)
                if r.status_code != 200:
                    failures.append(r.text)
                else:
                    np.testing.assert_allclose(r.json()["predictions"], expected[name], rtol=1e-5, atol=1e-6)
                    answered[0] += 1

        threads = [threading.Thread(target=client, args=(name,)) for name in ("tiny1", "tiny2") for _ in range(2)]
        for t in threads:
            t.start()
        _wait(lambda: answered[0] >= 50, 60, "answers before the kill")
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        killed_at = answered[0]
        _wait(lambda: answered[0] >= killed_at + 200, 60, "answers after the kill")
        replaced = _wait(lambda: {r["pid"] for r in _pool_replicas(api, dms["tiny1"])} - before, 120,
                         "a new pool replica")
        stop.set()
        for t in threads:
            t.join(60)
        assert not failures, failures[:3]
        survivor = (before - {victim}).pop()
        assert {r["pid"] for r in _pool_replicas(api, dms["tiny1"])} == {survivor, *replaced}

        # Both models loaded on both replicas (the survivor took the killed replica's; one client asking each
        # back to back keeps both hot, so each is loaded ahead where it is not); then a restart adopts it all.
        def everywhere() -> set | None:
            for name in ("tiny1", "tiny2"):
                for _ in range(10):
                    assert session.post(api.url(f"endpoints/{endpoints[name]}:predict"), json={"instances": X},
                                        timeout=60).status_code == 200
            got = {k for k, v in _metrics(p.url, "modelyard_pool_model_loaded").items() if v == 1}
            return got if len(got) == 4 else None

        loaded = _wait(everywhere, 60, "both models loaded on both replicas")
        assert {dm for _, dm in loaded} == set(dms.values())
        loads = _metrics(p.url, "modelyard_pool_model_loads_total")
        pids = {r["pid"] for r in _pool_replicas(api, dms["tiny1"])}
        p.stop()
        p.start()
        assert _wait(lambda: {r["pid"] for r in _pool_replicas(api, dms["tiny1"])} == pids and
                     {r["pid"] for r in _pool_replicas(api, dms["tiny2"])} == pids, 60, "the pool adopted")
        _wait(lambda: {k for k, v in _metrics(p.url, "modelyard_pool_model_loaded").items() if v == 1} == loaded,
              30, "the adopted replicas' loaded models seen")
        for name in ("tiny1", "tiny2"):
            for _ in range(5):
                r = api.predict(endpoints[name], X)
                assert r.status_code == 200, r.text
                np.testing.assert_allclose(r.json()["predictions"], expected[name], rtol=1e-5, atol=1e-6)
        # Served by what was loaded before the restart: no model loaded again.
        after = _wait(lambda: _metrics(p.url, "modelyard_pool_model_loads_total"), 10, "metrics")
        assert {k: v for k, v in after.items() if k in loads} == loads
        assert set(p.replica_pids()) == pids  # no other serve process: nothing started, nothing orphaned

        # A second platform on the same store (a follower: it serves the API and routes) routes to the pool's
        # replicas the leader keeps.
        follower = PlatformProcess(tmp_path_factory.mktemp("pool-follower"), _env(),
                                   ["--store", str(p.workdir / "platform.db"), "--artifact-root", tiny_models["root"]])
        follower.start()
        try:
            for name in ("tiny1", "tiny2"):
                r = Api(follower.url).predict(endpoints[name], X)
                assert r.status_code == 200, r.text
                np.testing.assert_allclose(r.json()["predictions"], expected[name], rtol=1e-5, atol=1e-6)
            assert set(p.replica_pids()) == pids
        finally:
            follower.stop()
    finally:
        p.cleanup()
