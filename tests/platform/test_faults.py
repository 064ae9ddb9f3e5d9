"""Issue 35 on the local engine. Must-show 1: a replica that is up but stuck (SIGSTOP) under steady
load is taken out of routing within 3 s and replaced within 15 s; no request waits more than 5 s and
none fails; once SIGCONT'ed it is stopped (or re-admitted), never counted twice. Must-show 3: kill -9
of the platform before a deploy's rows, after a replica's row and mid-undeploy, then a restart: no
orphan, no pending operation, retrying works (the last two points and the SIGSTOP steps are shared
with the Ray engine's tests: tests/platform/fault_scenarios.py). Must-show 2: the state disk full
during a deploy. Its own platforms: these stop and kill replicas and platforms."""
from __future__ import annotations

import errno
import os
import signal
import subprocess
from pathlib import Path

import pytest
import requests

from tests.platform.client import Api
from tests.platform.conftest import _env, live_processes, start_platform
from tests.platform.fault_scenarios import (Leftovers, kill9_after_a_row_and_mid_undeploy, kill9_before_the_rows,
                                            pending_operations, resume, running, stop_one_under_load,
                                            stored_replicas, wait)


def test_a_stopped_replica_is_routed_around_and_replaced(tmp_path_factory, tiny_models):
    p = start_platform(tmp_path_factory, "faults", _env(), ["--artifact-root", tiny_models["root"]])
    stopped = None
    try:
        api = Api(p.url)
        model = api.upload(tiny_models["models"]["tiny1"]["path"], "faults")
        ep = api.create_endpoint("faults")
        dm = api.deploy(ep, model, min_r=2, max_r=2)
        # The warm spare is up (the replacement takes it), beside the two replicas.
        wait(lambda: len(p.replica_pids(spares=True)) == 3, 120, "the warm spare")
        victim = api.replicas()[0]
        stopped = victim["pid"]
        run = stop_one_under_load(p.url, ep, tiny_models["instances"], api.replicas, victim,
                                  out_within=10, replaced_within=30, batch=100)
        out, replaced, load = run.out_s, run.replaced_s, run.load
        print(f"out of routing after {out:.1f} s, replaced {replaced:.1f} s later; slowest request "
              f"{load.slowest:.2f} s, {load.ok} ok")
        assert out <= 3.0, f"out of routing only after {out:.1f} s"
        assert out + replaced <= 15.0, f"replaced only after {out + replaced:.1f} s"
        assert not load.failures, load.failures[:5]
        assert load.slowest <= 5.0, f"a request waited {load.slowest:.1f} s"
        # SIGCONT'ed: stopped (or re-admitted); two replicas counted, both live processes, no third.
        # Settled, not the first glance: the resumed one's row may still be listed while it is being stopped.
        wait(lambda: (not running(stopped) or stopped in {r["pid"] for r in api.replicas()})
             and len(api.replicas()) == 2, 15, "the resumed replica stopped or re-admitted, two replicas listed")
        replicas = api.replicas()
        assert len(replicas) == 2 and all(r["deployedModelId"] == dm and r["state"] == "SERVING" for r in replicas)
        assert set(p.replica_pids()) == {r["pid"] for r in replicas}, (p.replica_pids(), replicas)
        # The data-plane process (the public port's predicts) killed -9: the platform starts another on the
        # same port; predicts answer again, and the replicas are the same ones.
        (dataplane,) = _dataplanes(p)
        os.kill(dataplane, signal.SIGKILL)
        wait(lambda: set(_dataplanes(p)) - {dataplane}, 30, "a new data-plane process")
        answer = requests.post(api.url(f"endpoints/{ep}:predict"), json={"instances": tiny_models["instances"]},
                               timeout=60)
        assert answer.status_code == 200, answer.text
        assert {r["pid"] for r in api.replicas()} == {r["pid"] for r in replicas}
    finally:
        resume(stopped)
        p.cleanup()


def _dataplanes(p) -> dict[int, int]:
    """pid -> parent pid of each data-plane process (platform/dataplane/process.py) of ``p``'s state directory."""
    marker = str(p.workdir / "state").encode()
    out = {}
    for pid, cmdline, _cwd in live_processes():
        if marker in cmdline and b"modelyard.platform.dataplane.process" in cmdline:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    out[pid] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except OSError:  # gone meanwhile
                pass
    return out


def _orphans(p, api: Api) -> list[int]:
    """Processes started for this platform's state directory that neither its replica list nor the
    running platform (its warm spare, a replica starting) accounts for."""
    listed = {r["pid"] for r in api.replicas()}
    marker = str(p.workdir / "state").encode()
    out = []
    for pid, cmdline, _cwd in live_processes():
        if marker not in cmdline or b"serve" not in cmdline or pid in listed:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if f"MODELYARD_PLATFORM_PID={p.proc.pid}\0".encode() not in env:
            out.append(pid)
    return out


def test_kill_9_of_the_platform_during_deploy_and_undeploy_leaves_no_orphan(tmp_path_factory, tiny_models):
    p = start_platform(tmp_path_factory, "kill9", _env(), ["--artifact-root", tiny_models["root"], "--no-warm-spare"])
    try:
        api = Api(p.url)
        model = api.upload(tiny_models["models"]["tiny1"]["path"], "kill9")
        ep = api.create_endpoint("kill9")
        seen = Leftovers(serve_pids=lambda: set(p.replica_pids(spares=True)), untracked=lambda: _orphans(p, api))
        # The kill points as on Ray (fault_scenarios): 1. after the deploy's replica processes start,
        # before their rows are written; 2. after a replica's row, before the deploy commits (its retry
        # succeeds); 3. mid-undeploy.
        figures = {"before_rows": kill9_before_the_rows(p, ep, model, seen, settle_s=10)}
        figures.update(kill9_after_a_row_and_mid_undeploy(p, ep, model, tiny_models["instances"], seen, settle_s=10))
        print(f"local engine, kill -9 at three points: {figures}")
        # Each killed platform's data-plane process died with it: the one left is the running platform's.
        wait(lambda: list(_dataplanes(p).values()) == [p.proc.pid], 10, "one data-plane process, the platform's")
    finally:
        p.cleanup()


def _fill(path: Path) -> None:
    """Writes ``path`` until its file system is full.

    Unbuffered: a buffered file keeps the tail of a partial write (the last 4 KB page short of a
    64 KB chunk) and raises ENOSPC again when the ``with`` closes it, so the fill failed or passed
    with the free space modulo 64 KB (i.e. the database's size), not with the platform.
    """
    with open(path, "wb", buffering=0) as f:
        try:
            while f.write(b"\0" * 65536):
                pass
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def test_the_state_disk_full_during_a_deploy_ends_its_operation(tmp_path_factory, tiny_models):
    if os.geteuid() != 0:
        pytest.fail("this test mounts a small tmpfs for the platform's store: run it as root")
    disk = tmp_path_factory.mktemp("statedisk")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], check=True)
    db = disk / "platform.db"
    p = None
    try:
        p = start_platform(tmp_path_factory, "diskfull", _env(), ["--artifact-root", tiny_models["root"],
                                                                 "--store", str(db), "--no-warm-spare"])
        api = Api(p.url)
        model = api.upload(tiny_models["models"]["tiny1"]["path"], "diskfull")
        ep = api.create_endpoint("diskfull")
        deploy = {"deployedModel": {"model": f"projects/local/locations/us-central1/models/{model}"}}
        op = api.ok("POST", f"endpoints/{ep}:deployModel", deploy)
        wait(lambda: len(p.replica_pids()) == 1, 60, "the deploy's replica process")
        _fill(disk / "filler")
        # The replica's row cannot be written: the deploy stops its replica; its outcome waits for space.
        wait(lambda: p.replica_pids() == [], 200, "the replica of the failed deploy stopped")
        (disk / "filler").unlink()
        wait(lambda: api.s.get(f"{p.url}/v1/{op['name']}", timeout=10).json().get("done"), 10,
              "the operation done once space returned")
        op = api.s.get(f"{p.url}/v1/{op['name']}", timeout=10).json()
        assert "error" in op and "full" in op["error"]["message"], op
        # Consistent: nothing deployed, no replica row, no replica process; the platform serves, a retry works.
        assert "deployedModels" not in api.ok("GET", f"endpoints/{ep}")
        assert stored_replicas(p, db) == 0 and pending_operations(p, db) == 0 and p.replica_pids() == []
        api.deploy(ep, model)
        assert api.predict(ep, tiny_models["instances"]).status_code == 200
    finally:
        if p is not None:
            p.cleanup()
        subprocess.run(["umount", "-l", str(disk)], check=False)
