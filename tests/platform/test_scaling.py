"""Test 3 (scaling) and test 2 (shadow) of issue 15: under sustained load a deployed model scales
from 1 to 2 replicas, and back to 1 after the cool-down (draining), with zero failed requests; a
shadow deployment gets mirrored requests whose agreement shows in the Prometheus metrics and whose
answers never reach clients."""
from __future__ import annotations

import re
import signal
import time

import requests

from tests.platform.client import Api, Load
from tests.platform.conftest import PARENT, _env, start_platform


def _serving(api: Api, dm: str) -> int:
    return sum(1 for r in api.replicas() if r["deployedModelId"] == dm and r["state"] == "SERVING")


def _wait(pred, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not pred():
        assert time.monotonic() - start < timeout, f"{what} not within {timeout} s"
        time.sleep(0.25)
    return time.monotonic() - start


def _metric(text: str, name: str, dm: str) -> float:
    m = re.search(rf'^{name}{{[^}}]*deployed_model="{dm}"[^}}]*}} (\S+)$', text, re.M)
    assert m, f"{name} for {dm} missing from /metrics"
    return float(m.group(1))


def test_autoscaling_and_shadow_under_load(platform, tiny_models):
    api = Api(platform.url)
    m1 = api.upload(tiny_models["models"]["tiny1"]["path"], "scaled")
    m2 = api.upload(tiny_models["models"]["tiny2"]["path"], "shadow")
    ep = api.create_endpoint("scaling")
    # Both deployments at once: their replicas start side by side.
    body = {"deployedModel": {"model": f"{PARENT}/models/{m2}"}, "shadowTrafficPercentage": 50}
    shadow_op = api.ok("POST", f"endpoints/{ep}:deployModel", body)
    primary = api.deploy(ep, m1, min_r=1, max_r=2)
    shadow = api.wait(shadow_op)["deployedModel"]["id"]
    assert api.ok("GET", f"endpoints/{ep}")["trafficSplit"] == {primary: 100}
    assert _serving(api, primary) == 1

    with Load(platform.url, ep, tiny_models["instances"], threads=8) as load:
        up = _wait(lambda: _serving(api, primary) == 2, 60, "scale-up to 2 replicas")
        load.wait_for(200)
    down = _wait(lambda: _serving(api, primary) == 1 and len([r for r in api.replicas()
                                                               if r["deployedModelId"] == primary]) == 1,
                 60, "scale-down to 1 replica after the cool-down")
    assert not load.failures, load.failures[:5]
    # The warm spare, replenished: one `modelyard serve` beyond the replicas, waiting for the next one.
    _wait(lambda: len(platform.replica_pids(spares=True)) > len(platform.replica_pids()), 60, "a warm spare")
    assert set(load.by_model) == {primary}  # the shadow never answered a client
    print(f"scale-up took {up:.1f} s under load; scale-down {down:.1f} s after it stopped")

    metrics = requests.get(f"{platform.url}/metrics", timeout=10).text
    mirrored = _metric(metrics, "modelyard_shadow_requests_total", shadow)
    assert 0.3 * load.ok < mirrored <= load.ok
    assert 0.0 <= _metric(metrics, "modelyard_shadow_agreement_ratio", shadow) <= 1.0
    assert _metric(metrics, "modelyard_shadow_max_abs_diff", shadow) > 0  # different weights
    assert _metric(metrics, "modelyard_shadow_failures_total", shadow) == 0
    assert _metric(metrics, "modelyard_endpoint_requests_total", primary) >= load.ok

    api.undeploy(ep, shadow)
    api.undeploy(ep, primary)
    api.ok("DELETE", f"endpoints/{ep}")
    assert not [r for r in api.replicas() if r["deployedModelId"] in (primary, shadow)]


def test_warm_spare_of_a_killed_platform_is_reaped(tmp_path_factory, tiny_models):
    """The spare is no replica: a platform killed with SIGKILL leaves it behind, and the next platform on
    the same state stops it (and starts its own), while the adopted replica keeps serving."""
    p = start_platform(tmp_path_factory, "spare", _env(), ["--artifact-root", tiny_models["root"]])
    try:
        api = Api(p.url)
        ep = api.create_endpoint("spare")
        dm = api.deploy(ep, api.upload(tiny_models["models"]["tiny1"]["path"], "spare"))
        _wait(lambda: len(p.replica_pids(spares=True)) == 2, 60, "a warm spare beside the replica")
        replica = p.replica_pids()
        old_spare = set(p.replica_pids(spares=True)) - set(replica)
        p.stop(signal.SIGKILL)
        p.start()
        _wait(lambda: not old_spare & set(p.replica_pids(spares=True)), 30, "the old spare stopped")
        assert p.replica_pids() == replica  # adopted, not restarted
        assert api.predict(ep, tiny_models["instances"]).status_code == 200
        _wait(lambda: len(p.replica_pids(spares=True)) == 2, 60, "a new warm spare")
        api.undeploy(ep, dm)
    finally:
        p.cleanup()
