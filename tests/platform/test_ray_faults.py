"""Issue 35 on the Ray engine (``modelyard platform --engine ray``, replicas are Ray actors on the
session's two-node cluster, tests/ray_cluster.py): the faults tests/platform/test_faults.py injects
into local replicas, injected into Ray replicas.

1. A replica's ``modelyard serve`` process (the child its actor started on its node; the nodes share
   this host's pid namespace) is stopped with SIGSTOP under steady load: the other replica answers
   every request, the stopped one is out of routing within seconds and replaced by a new actor;
   SIGCONT'ed, it is stopped or re-admitted, never counted twice (the replica list, the namespace's
   actors and the serve processes all say 2).
2. The platform is killed (SIGKILL) right after a deploy started its replica actors, before the
   operation finished (no row for them yet): the restarted platform on the same state directory
   leaves no actor or serve process of that deploy untracked (it ends them), the operation is
   ended ABORTED with a retry hint, and retrying the deploy succeeds.
3. The platform is killed after a deploy wrote one replica's row but before it committed (its other
   replica's serve process is held with SIGSTOP so the kill lands there every time), and again right
   after an undeploy was accepted, while its replicas stop: each restart ends every actor and serve
   process nothing lists, ends the operation (the deploy ABORTED with a retry hint, the undeploy done,
   since it had committed), and deploying again succeeds. The scenario is the local engine's too
   (tests/platform/fault_scenarios.py, as is the SIGSTOP scenario of 1).
4. The platform is killed while its deploy's actor waits for a CPU (another driver holds both of the
   cluster's): the restarted platform cannot ask that actor its owner yet, but once the CPUs free and
   Ray places it, the supervisor's timer ends it; the deploy, retried, succeeds.

The platform is the session's Ray one (shared with test_ray_engine and test_ray_jobs): these tests stop
replicas and kill it, then start it again on the same state dir, which the next module's tests then use."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.platform.client import Api
from tests.platform.conftest import PARENT, _env, live_processes
from tests.platform.fault_scenarios import (Leftovers, kill9_after_a_row_and_mid_undeploy, kill9_before_the_rows,
                                            operation, pending_operations, resume, stop_one_under_load, wait)
from tests.platform.ray_platform import actor_infos, cleanup_actors, running, serve_processes
from tests.ray_cluster import ask_driver

# The session's Ray cluster starts in the first test that asks for it: minutes on the busy shared machine.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def platform(ray_platform, ray_cluster):
    """The session's platform on the Ray cluster (tests/platform/conftest.py): these tests kill it and start
    it again on the same state, as its users would; the replica actors left are ended at the module's end."""
    try:
        yield running(ray_platform)
    finally:
        cleanup_actors(ray_cluster)


def _serve(address: str) -> dict[int, str]:
    """``serve_processes()`` less those of another Ray cluster on this host (a benchmark's has replicas
    of its own): a ``modelyard serve`` that descends from a raylet of another cluster is left out; one
    under a raylet of the cluster at ``address``, or under none (an orphan, reparented), is counted."""
    parents, raylets = {}, {}
    for pid, cmdline, _cwd in live_processes():
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                parents[pid] = int(f.read().rsplit(b")", 1)[1].split()[1])
        except OSError:
            continue
        gcs = [a for a in cmdline.split(b"\0") if a.startswith(b"--gcs-address=")]
        if b"raylet" in cmdline and gcs:  # its GCS's port says which cluster (the host may be named apart)
            raylets[pid] = gcs[0].rpartition(b":")[2] == address.rpartition(":")[2].encode()

    def ours(pid: int) -> bool:
        for _ in range(32):  # serve <- its actor's worker <- the raylet, or up to init for an orphan
            pid = parents.get(pid, 0)
            if pid in raylets:
                return raylets[pid]
            if pid <= 1:
                return True
        return True

    return {pid: rid for pid, rid in serve_processes().items() if ours(pid)}


def _of(api: Api, dm: str) -> list[dict]:
    return [r for r in api.replicas() if r["deployedModelId"] == dm]


def _assert_counted_once(ray_cluster: str, api: Api, dm: str, want: int) -> None:
    """``want`` replicas listed, all SERVING, and exactly their actors and serve processes run."""
    listed = _of(api, dm)
    assert len(listed) == want and all(r["state"] == "SERVING" for r in listed), listed
    ids = {r["id"] for r in listed}
    # The namespace holds no other replica actor (one just ended may keep its name a moment).
    wait(lambda: set(actor_infos(ray_cluster)) == ids, 30, f"the replica actors exactly {sorted(ids)}")
    procs = _serve(ray_cluster)
    assert set(procs.values()) == ids and {r["pid"] for r in listed} <= set(procs), (procs, listed)


def test_a_stopped_ray_replica_is_routed_around_and_replaced(ray_cluster, platform, tiny_models):
    api = Api(platform.url)
    model = api.upload(tiny_models["models"]["tiny1"]["path"], "ray-sigstop")
    ep = api.create_endpoint("ray-sigstop")
    started = time.monotonic()
    dm = api.deploy(ep, model, min_r=2, max_r=2)
    deployed = time.monotonic() - started
    stopped = None
    try:
        victim = _of(api, dm)[0]
        assert _serve(ray_cluster).get(victim["pid"]) == victim["id"]  # its row's pid is its serve process
        stopped = victim["pid"]
        run = stop_one_under_load(platform.url, ep, tiny_models["instances"], lambda: _of(api, dm), victim,
                                  out_within=15, replaced_within=60, batch=50)
        out, replaced, load = run.out_s, run.replaced_s, run.load
        print(f"deploy of 2 Ray replicas {deployed:.1f} s; stopped replica out of routing after {out:.1f} s, "
              f"replaced {replaced:.1f} s later ({out + replaced:.1f} s from the SIGSTOP); slowest request "
              f"{load.slowest:.2f} s, {load.ok} ok; load average {os.getloadavg()[0]:.1f}")
        assert not load.failures, load.failures[:5]
        assert out <= 3.0, f"out of routing only after {out:.1f} s"
        assert load.slowest <= 5.0, f"a request waited {load.slowest:.1f} s"
        # The replacement's 15 s (issue 35) is not asserted on Ray: 10 s on a quiet host, but 23-34 s at
        # load 14-17, mostly Ray placing the new actor and starting its worker (docs/operations.md).
        # SIGCONT'ed: stopped (its actor ended) or re-admitted; two replicas, their two actors and processes.
        wait(lambda: stopped not in _serve(ray_cluster) or stopped in {r["pid"] for r in _of(api, dm)}, 15,
              "the resumed replica stopped or re-admitted")
        _assert_counted_once(ray_cluster, api, dm, 2)
        assert api.predict(ep, tiny_models["instances"]).status_code == 200
    finally:
        resume(stopped)
        api.undeploy(ep, dm)
        api.ok("DELETE", f"endpoints/{ep}")


def test_kill_9_of_the_ray_platform_during_a_deploy_leaves_no_untracked_replica(ray_cluster, platform,
                                                                               tiny_models):
    api = Api(platform.url)
    model = api.upload(tiny_models["models"]["tiny1"]["path"], "ray-kill9")
    ep = api.create_endpoint("ray-kill9")
    left = {}

    def at_kill(killed: int) -> None:
        # What the dead platform left: its actors, created with its identity, and no row lists them.
        left.update({rid: info for rid, info in actor_infos(ray_cluster).items() if info and "owner" in info})
        assert left and all(info["owner"]["pid"] == killed for info in left.values()), left

    seen = Leftovers(serve_pids=lambda: set(_serve(ray_cluster)), untracked=lambda: _untracked(ray_cluster, api))
    figures = kill9_before_the_rows(platform, ep, model, seen, settle_s=60, at_kill=at_kill)
    assert actor_infos(ray_cluster, list(left)) == {rid: None for rid in left}  # those actors ended
    print(f"kill -9 with {len(left)} untracked actor(s); restart {figures['restart_s']:.1f} s; they and their "
          f"serve processes gone {figures['settled_s']:.1f} s after it")

    dm = api.deploy(ep, model, min_r=2, max_r=2)  # retrying succeeds
    try:
        assert api.predict(ep, tiny_models["instances"]).status_code == 200
        _assert_counted_once(ray_cluster, api, dm, 2)
    finally:
        api.undeploy(ep, dm)
        api.ok("DELETE", f"endpoints/{ep}")


def _untracked(ray_cluster: str, api: Api) -> list[str]:
    """Replica ids with a serve process (on any node) or an actor in the namespace that the platform's
    replica list does not have."""
    listed = {r["id"] for r in api.replicas()}
    return sorted((set(_serve(ray_cluster).values()) | set(actor_infos(ray_cluster))) - listed)


def test_kill_9_of_the_ray_platform_after_a_row_and_mid_undeploy_leaves_nothing_behind(ray_cluster, platform,
                                                                                      tiny_models):
    """The local engine's kill points after a replica's row and mid-undeploy (fault_scenarios), on Ray:
    the restarted platform ends the actor whose row it has and the stopped, unlisted one of the killed
    deploy (its serve child dies with it), and the actors left by a cut-short undeploy."""
    api = Api(platform.url)
    model = api.upload(tiny_models["models"]["tiny1"]["path"], "ray-kill9-row")
    ep = api.create_endpoint("ray-kill9-row")
    seen = Leftovers(serve_pids=lambda: set(_serve(ray_cluster)), untracked=lambda: _untracked(ray_cluster, api))
    assert not seen.untracked(), "replica actors or processes left by an earlier test"
    started = time.monotonic()
    try:
        figures = kill9_after_a_row_and_mid_undeploy(platform, ep, model, tiny_models["instances"], seen,
                                                     settle_s=60)
    finally:
        api.call("DELETE", f"endpoints/{ep}")  # not asserted: a failure above may have left a model deployed
    print(f"Ray engine, kill -9 after a row and mid-undeploy ({time.monotonic() - started:.1f} s): {figures}")


_NAMES_SCRIPT = """
import json, sys, ray
ray.init(address=sys.argv[1], namespace="modelyard", logging_level="ERROR", log_to_driver=False)
print(RESULT + json.dumps([n for n in ray.util.list_named_actors() if n.startswith("modelyard-replica-")]))
"""

# A driver holding both CPUs of the cluster (one actor on each node) for as long as its stdin is open.
_HOLD_SCRIPT = """
import sys, ray
ray.init(address=sys.argv[1], namespace="modelyard-test-hold", logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=1)
class Hold:
    def ready(self):
        return True

held = [Hold.options(scheduling_strategy="SPREAD").remote() for _ in range(2)]
ray.get([h.ready.remote() for h in held], timeout=120)
print("HELD", flush=True)
sys.stdin.read()
"""


def _replica_actor_ids(address: str) -> set[str]:
    """Every replica actor's id in the namespace, placed or not (a name is registered at creation;
    asking an unplaced actor anything would wait for its placement)."""
    return {n[len("modelyard-replica-"):] for n in ask_driver(_NAMES_SCRIPT, address)}


def test_kill_9_while_a_deploys_actor_waits_for_a_cpu_ends_that_actor_once_placed(ray_cluster, platform, tiny_models):
    api = Api(platform.url)
    model = api.upload(tiny_models["models"]["tiny1"]["path"], "ray-unplaced")
    ep = api.create_endpoint("ray-unplaced")
    hold = subprocess.Popen([sys.executable, "-c", _HOLD_SCRIPT, ray_cluster], env=_env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert hold.stdout.readline().strip() == "HELD", "the driver could not hold the cluster's CPUs"
        before = _replica_actor_ids(ray_cluster)
        op = api.ok("POST", f"endpoints/{ep}:deployModel",
                    {"deployedModel": {"model": f"{PARENT}/models/{model}"}})
        wait(lambda: _replica_actor_ids(ray_cluster) - before, 60, "the deploy's actor created")
        unplaced = _replica_actor_ids(ray_cluster) - before
        platform.stop(signal.SIGKILL)
        started = time.monotonic()
        platform.start()
        restarted = time.monotonic() - started
        # The restart could not ask it its owner (no CPU, not placed): it is still there.
        assert unplaced <= _replica_actor_ids(ray_cluster), "the kill point was missed: the actor is gone already"
        hold.stdin.close()  # the holding driver ends: its actors and the CPUs are free, Ray places ours
        hold.wait(60)
        ended = wait(lambda: not unplaced & _replica_actor_ids(ray_cluster), 60,
                     "the killed deploy's actor ended once placed")
        assert not _serve(ray_cluster), _serve(ray_cluster)
        assert pending_operations(platform) == 0
        done = operation(platform, op)
        assert done["done"] and done["error"]["code"] == 10 and "retry" in done["error"]["message"], done
        dm = api.deploy(ep, model)  # retrying succeeds
        try:
            assert api.predict(ep, tiny_models["instances"]).status_code == 200
            _assert_counted_once(ray_cluster, api, dm, 1)
        finally:
            api.undeploy(ep, dm)
        print(f"kill -9 with an unplaced actor; restart {restarted:.1f} s; that actor ended {ended:.1f} s after "
              f"the CPUs were freed")
    finally:
        if hold.poll() is None:
            hold.kill()
            hold.wait(30)
        api.call("DELETE", f"endpoints/{ep}")
