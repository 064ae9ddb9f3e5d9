"""Issue 35's fault scenarios, written once for both engines (tests/platform/test_faults.py runs them
on local replicas, tests/platform/test_ray_faults.py on Ray replica actors): a replica stopped with
SIGSTOP under load, and kill -9 of the platform before a deploy's rows, after it wrote a replica's
row and in the middle of an undeploy, each followed by a restart on the same store and state
directory.

What differs between the engines is only how a test sees what the platform started
(``Leftovers``): local replicas are ``modelyard serve`` processes of this host carrying their
platform's pid; Ray replicas are actors of the ``modelyard`` namespace whose ``modelyard serve``
children run on the nodes (which share this host's pid namespace)."""
from __future__ import annotations

import os
import signal
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tests.platform.client import Api, Load
from tests.platform.conftest import PARENT, live_processes


def wait(pred, timeout: float, what: str) -> float:
    """Seconds until ``pred()`` holds; fails saying ``what`` after ``timeout``."""
    start = time.monotonic()
    while not pred():
        assert time.monotonic() - start < timeout, f"{what} not within {timeout} s"
        time.sleep(0.1)
    return time.monotonic() - start


def running(pid: int) -> bool:
    return any(p == pid for p, _cmd, _cwd in live_processes())


def resume(pid: int | None) -> None:
    """SIGCONT, if it still runs."""
    if pid is not None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def pending_operations(p, db_path: Path | None = None) -> int:
    with sqlite3.connect(db_path or p.workdir / "platform.db") as db:
        return db.execute("select count(*) from operations where done = 0").fetchone()[0]


def stored_replicas(p, db_path: Path | None = None) -> int:
    with sqlite3.connect(db_path or p.workdir / "platform.db") as db:
        return db.execute("select count(*) from replicas").fetchone()[0]


def operation(p, op: dict) -> dict:
    return Api(p.url).s.get(f"{p.url}/v1/{op['name']}", timeout=10).json()


@dataclass
class StoppedUnderLoad:
    out_s: float  # from the SIGSTOP until the replica left routing
    replaced_s: float  # from then until a replacement served
    load: Load


def stop_one_under_load(url: str, ep: str, instances, replicas: Callable[[], list[dict]], victim: dict,
                        out_within: float, replaced_within: float, batch: int) -> StoppedUnderLoad:
    """Under steady load (8 clients): SIGSTOP ``victim``'s serve process, wait until it leaves routing
    and until two others serve (``replicas()``: the deployed model's replica rows), then SIGCONT it.
    ``batch`` predicts must succeed before the stop, after the replacement and after the SIGCONT.
    The caller resumes ``victim['pid']`` again in its ``finally`` (a failed wait leaves it stopped)."""
    with Load(url, ep, instances, threads=8) as load:
        load.wait_for(batch)
        os.kill(victim["pid"], signal.SIGSTOP)
        out = wait(lambda: {r["id"]: r["state"] for r in replicas()}.get(victim["id"]) != "SERVING", out_within,
                   "the stopped replica out of routing")
        replaced = wait(lambda: sum(r["state"] == "SERVING" and r["id"] != victim["id"] for r in replicas()) == 2,
                        replaced_within, "a replacement serving")
        load.wait_for(batch)
        resume(victim["pid"])  # it may be gone already: stopped by the supervisor
        load.wait_for(batch)
    return StoppedUnderLoad(out, replaced, load)


@dataclass
class Leftovers:
    """How a test sees one engine's replicas (what differs between the engines).

    ``serve_pids()``: every live ``modelyard serve`` process the platform under test may have started
    for its replicas. ``untracked()``: what the platform started and its replica list does not account
    for (processes, Ray actors), described; empty when every process and actor is listed."""
    serve_pids: Callable[[], set[int]]
    untracked: Callable[[], list]


def _deploy_body(model: str) -> dict:
    return {"deployedModel": {"model": f"{PARENT}/models/{model}",
                              "automaticResources": {"minReplicaCount": 2, "maxReplicaCount": 2}}}


def _restart(p, what: str, seen: Leftovers, timeout: float) -> dict:
    """kill -9 of the platform, a start on the same store and state directory, and the checks every
    kill point shares: nothing untracked is left (within ``timeout``), no operation is pending."""
    p.stop(signal.SIGKILL)
    started = time.monotonic()
    p.start()
    restart = time.monotonic() - started
    settled = wait(lambda: not seen.untracked(), timeout, f"no untracked replica after a kill -9 {what}")
    assert pending_operations(p) == 0, f"an operation still pending after a kill -9 {what}"
    return {"restart_s": restart, "settled_s": settled}


def kill9_before_the_rows(p, ep: str, model: str, seen: Leftovers, settle_s: float = 30,
                          at_kill: Callable[[int], None] | None = None) -> dict:
    """The first kill point of issue 35, must-show 3 (figures returned): after a deploy of 2 replicas
    started a serve process, before any replica's row is written (rows come once a replica serves,
    seconds later). The restart stops everything of it, ends the operation ABORTED (code 10) with a
    retry hint, and nothing is deployed. ``at_kill(pid of the killed platform)``: the engine's own
    checks of what the dead platform left, before the restart."""
    api = Api(p.url)
    before = seen.serve_pids()
    op = api.ok("POST", f"endpoints/{ep}:deployModel", _deploy_body(model))
    wait(lambda: seen.serve_pids() - before, 120, "a serve process of the deploy")
    killed = p.proc.pid
    p.stop(signal.SIGKILL)
    assert stored_replicas(p) == 0 and pending_operations(p) == 1, "no kill point before the replicas' rows"
    if at_kill is not None:
        at_kill(killed)
    figures = _restart(p, "before the replicas' rows", seen, settle_s)
    done = operation(p, op)
    assert done["done"] and done["error"]["code"] == 10 and "retry" in done["error"]["message"], done
    assert api.replicas() == [] and stored_replicas(p) == 0
    assert "deployedModels" not in api.ok("GET", f"endpoints/{ep}")
    return figures


def kill9_after_a_row_and_mid_undeploy(p, ep: str, model: str, instances, seen: Leftovers,
                                       settle_s: float = 30) -> dict:
    """Two kill points of issue 35, must-show 3, each followed by a restart (figures returned):

    1. After a deploy of 2 replicas wrote one replica's row, before it committed: the other replica's
       serve process is stopped (SIGSTOP) as soon as it appears, so the deploy cannot finish and the
       kill lands in that window every time. The restart stops both (the listed one, whose model is
       not deployed, and the unlisted, stopped one), ends the operation ABORTED (code 10) with a retry
       hint, and the retried deploy succeeds.
    2. Right after an undeploy of those 2 replicas was accepted, while they drain and stop one after
       the other: the restart stops what is left and ends the undeploy done (it had committed when it
       was accepted, and only its replicas were left to stop); the model is not deployed any more (a
       retry is NOT_FOUND), and nothing of it runs."""
    api = Api(p.url)
    figures: dict = {}
    # 1. After a replica's row, before the deploy commits.
    before = seen.serve_pids()
    op = api.ok("POST", f"endpoints/{ep}:deployModel", _deploy_body(model))
    held = None
    try:
        wait(lambda: seen.serve_pids() - before, 120, "a serve process of the deploy")
        held = min(seen.serve_pids() - before)
        os.kill(held, signal.SIGSTOP)  # it cannot become ready: the deploy waits for it
        wait(lambda: stored_replicas(p) >= 1, 120, "the other replica's row")
        assert stored_replicas(p) == 1 and pending_operations(p) == 1, "the deploy finished: no kill point"
        assert "deployedModels" not in api.ok("GET", f"endpoints/{ep}")
        figures["after_row"] = _restart(p, "after a replica's row", seen, settle_s)
    finally:
        resume(held)  # if the restart did not end it, so that a failure leaves no stopped process
    assert not running(held), f"the stopped serve process {held} of the killed deploy still runs"
    done = operation(p, op)
    assert done["done"] and done["error"]["code"] == 10 and "retry" in done["error"]["message"], done
    assert api.replicas() == [] and stored_replicas(p) == 0
    assert "deployedModels" not in api.ok("GET", f"endpoints/{ep}")
    started = time.monotonic()
    dm = api.wait(api.ok("POST", f"endpoints/{ep}:deployModel", _deploy_body(model)))["deployedModel"]["id"]
    figures["redeploy_s"] = time.monotonic() - started
    listed = api.replicas()
    assert len(listed) == 2 and {r["pid"] for r in listed} == seen.serve_pids(), (listed, seen.serve_pids())
    assert api.predict(ep, instances).status_code == 200

    # 2. Mid-undeploy: accepted (the model is out of the split and the store), its replicas stopping.
    op = api.ok("POST", f"endpoints/{ep}:undeployModel", {"deployedModelId": dm})
    p.stop(signal.SIGKILL)
    left = stored_replicas(p)
    assert left >= 1, "the undeploy had stopped every replica before the kill: no kill point mid-undeploy"
    figures["undeploy_rows_left"] = left
    figures["mid_undeploy"] = _restart(p, "mid-undeploy", seen, settle_s)
    done = operation(p, op)
    assert done["done"] and "error" not in done, done
    assert done["response"]["@type"].endswith("UndeployModelResponse"), done
    assert api.replicas() == [] and stored_replicas(p) == 0 and seen.serve_pids() == set()
    assert "deployedModels" not in api.ok("GET", f"endpoints/{ep}")
    # Nothing to retry: the undeploy is done (a retry says so), and a predict says no model is deployed.
    again = api.call("POST", f"endpoints/{ep}:undeployModel", {"deployedModelId": dm})
    assert again.status_code == 404 and again.json()["error"]["status"] == "NOT_FOUND", again.text
    assert api.predict(ep, instances).status_code != 200
    return figures
