"""Test 4 (PostgreSQL part) of issue 15: two platform processes on one real PostgreSQL server (started
here with initdb/pg_ctl in a temporary directory) see the same models and endpoints, and the schema is
migrated once. Issue 35: a follower that takes the lead from a leader killed mid-deploy reconciles as
a restart does (the deploy ends ABORTED, no process of the dead leader is left, a retry serves).
Needs Debian's ``postgresql`` package (initdb, pg_ctl) and ``psycopg`` (test extra)."""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from modelyard.ports import free_port
from tests.platform.client import Api
from tests.platform.conftest import PARENT, _env, live_processes, require, start_platform
from tests.platform.fault_scenarios import operation, resume, running, wait
from tests.platform.test_operation_commit import check_deploy_commits_its_operation
from tests.platform.test_pipeline_schedules import check_schedules_store
from tests.platform.test_vizier import check_vizier_store


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next((str(p) for p in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None)
    if not found:
        pytest.fail(f"PostgreSQL's {name} is needed: apt-get install postgresql", pytrace=False)
    return found


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    require("psycopg", "pip install -e '.[test]' (installs psycopg[binary])")
    # Not under pytest's tmp dirs: those are private to root, and the server runs as postgres.
    top = Path(tempfile.mkdtemp(prefix="modelyard-pg-"))
    data = top / "data"
    port = free_port()
    as_postgres = []
    if os.geteuid() == 0:  # initdb refuses to run as root
        as_postgres = ["runuser", "-u", "postgres", "--"]
        pw = pwd.getpwnam("postgres")
        os.chown(top, pw.pw_uid, pw.pw_gid)
    subprocess.run([*as_postgres, _pg_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                   check=True, capture_output=True, timeout=120)
    ctl = [*as_postgres, _pg_bin("pg_ctl"), "-D", str(data), "-w", "-t", "60"]
    subprocess.run([*ctl, "-l", str(data.parent / "pg.log"), "-o", f"-p {port} -k {data.parent} -h 127.0.0.1",
                    "start"], check=True, capture_output=True, timeout=90)
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*ctl, "-m", "fast", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(top, ignore_errors=True)


def test_two_platforms_share_one_postgres_store(tmp_path_factory, postgres, tiny_models):
    first = start_platform(tmp_path_factory, "pg-a", _env(), ["--store", postgres])
    second = start_platform(tmp_path_factory, "pg-b", _env(), ["--store", postgres])
    try:
        a, b = Api(first.url), Api(second.url)
        model = a.upload(tiny_models["models"]["tiny1"]["path"], "shared")
        endpoint = b.create_endpoint("shared-ep")
        assert b.ok("GET", f"models/{model}") == a.ok("GET", f"models/{model}")
        assert a.ok("GET", "endpoints") == b.ok("GET", "endpoints")
        assert [e["name"].rsplit("/", 1)[-1] for e in a.ok("GET", "endpoints")["endpoints"]] == [endpoint]
        b.ok("DELETE", f"models/{model}")
        assert a.call("GET", f"models/{model}").status_code == 404
        # Restarted, the first platform reads the same state back (schema already at the latest version).
        first.stop()
        first.start()
        assert [e["name"].rsplit("/", 1)[-1] for e in a.ok("GET", "endpoints")["endpoints"]] == [endpoint]

        # Deployed through the first (the leader, which supervises replicas), served through the second too:
        # one replica, no duplicate started by the second. Killed, the first hands supervision over.
        model = a.upload(tiny_models["models"]["tiny1"]["path"], "shared")
        dm = a.deploy(endpoint, model)
        deadline = time.monotonic() + 30
        while len(b.replicas()) != 1:
            assert time.monotonic() < deadline, b.replicas()
            time.sleep(0.2)
        r = b.predict(endpoint, tiny_models["instances"])
        assert r.status_code == 200 and r.json()["deployedModelId"] == dm, r.text
        assert [x["pid"] for x in b.replicas()] == [x["pid"] for x in a.replicas()]
        first.stop(signal.SIGKILL)
        time.sleep(2.5)  # the second takes over supervision at its next sync
        assert b.predict(endpoint, tiny_models["instances"]).status_code == 200
        assert len(first.replica_pids()) == 1 and second.replica_pids() == []  # adopted, not duplicated
        b.undeploy(endpoint, dm)
        assert first.replica_pids() == []  # the new leader stopped the first one's replica
    finally:
        first.cleanup()
        second.cleanup()


def _started_by(pid: int) -> list[int]:
    """Live processes whose environment says platform ``pid`` started them (any state directory)."""
    out = []
    for p, _cmdline, _cwd in live_processes():
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                if f"MODELYARD_PLATFORM_PID={pid}\0".encode() in f.read():
                    out.append(p)
        except OSError:
            continue
    return out


def test_a_follower_taking_the_lead_ends_the_dead_leaders_deploy(tmp_path_factory, postgres, tiny_models):
    """kill -9 of the leader while its deploy of 2 replicas waits for the second (SIGSTOP'ed, as in
    fault_scenarios), one row written: the follower (another state directory) takes the lead and
    reconciles as a restart does. The deploy ends ABORTED (code 10, retry it); the dead leader's
    listed replica, its unlisted stopped one and its warm spare are stopped; a retry serves."""
    from sqlalchemy import create_engine, text

    db = create_engine(postgres)

    def count(query: str) -> int:
        with db.connect() as c:
            return c.execute(text(query)).scalar_one()

    leader = start_platform(tmp_path_factory, "pg-lead", _env(), ["--store", postgres])
    follower = start_platform(tmp_path_factory, "pg-follow", _env(), ["--store", postgres])
    held = None
    try:
        a, b = Api(leader.url), Api(follower.url)
        model = a.upload(tiny_models["models"]["tiny1"]["path"], "takeover")
        ep = a.create_endpoint("takeover-ep")
        body = {"deployedModel": {"model": f"{PARENT}/models/{model}",
                                  "automaticResources": {"minReplicaCount": 2, "maxReplicaCount": 2}}}
        pending_before = count("select count(*) from operations where done = 0")
        op = a.ok("POST", f"endpoints/{ep}:deployModel", body)
        wait(lambda: leader.replica_pids(), 120, "a serve process of the leader's deploy")
        held = min(leader.replica_pids())
        os.kill(held, signal.SIGSTOP)  # it cannot become ready: the deploy waits for it
        wait(lambda: count("select count(*) from replicas") >= 1, 120, "the other replica's row")
        assert count("select count(*) from operations where done = 0") == pending_before + 1
        assert "deployedModels" not in b.ok("GET", f"endpoints/{ep}")
        dead = leader.proc.pid
        assert _started_by(dead), "the leader started no process to leave behind"
        leader.stop(signal.SIGKILL)

        took = wait(lambda: operation(follower, op)["done"], 60, "the follower ending the dead leader's deploy")
        done = operation(follower, op)
        assert done["error"]["code"] == 10 and "retry" in done["error"]["message"], done
        gone = wait(lambda: not _started_by(dead), 30, "no process of the dead leader")
        print(f"the follower ended the dead leader's deploy {took:.1f} s after the kill; its processes gone "
              f"{gone:.1f} s later")
        assert not running(held) and leader.replica_pids(spares=True) == []
        assert count("select count(*) from replicas") == 0 and b.replicas() == []
        assert count("select count(*) from operations where done = 0") == 0

        # The retry, through the new leader: its own replicas serve.
        dm = b.wait(b.ok("POST", f"endpoints/{ep}:deployModel", body))["deployedModel"]["id"]
        assert b.predict(ep, tiny_models["instances"]).status_code == 200
        listed = b.replicas()
        assert len(listed) == 2 and {r["pid"] for r in listed} == set(follower.replica_pids()), listed
        b.undeploy(ep, dm)
    finally:
        resume(held)
        leader.cleanup()
        follower.cleanup()
        db.dispose()


def test_a_deploy_commits_its_operation_on_postgres(postgres):
    check_deploy_commits_its_operation(postgres, "-pg")


def test_vizier_store_on_postgres(postgres):
    check_vizier_store(postgres)


def test_pipeline_schedules_store_on_postgres(postgres):
    check_schedules_store(postgres)


def test_a_schema_v3_registry_is_upgraded_on_postgres(postgres):
    """Schema v4 on PostgreSQL: a v3 database (32-wide model ids, "default" implied) gets wide ids, the
    stored "default" alias and the version columns; then the registry's writes work on it."""
    from sqlalchemy import create_engine, text

    from modelyard.platform.state.store import Store
    from tests.platform.conftest import PARENT
    from tests.platform.v3_registry import write_v3_registry

    admin = create_engine(postgres, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text("CREATE DATABASE registry_v3"))
    admin.dispose()
    url = postgres.rsplit("/", 1)[0] + "/registry_v3"
    write_v3_registry(url)
    store = Store(url)
    try:
        assert store.migrated_from == 3
        assert [(v["version_id"], v["aliases"]) for v in store.versions("123")] == [
            ("1", ["stable"]), ("2", ["default"])]
        long_id = "m" * 63  # wider than the v3 columns
        version = {"model_id": long_id, "version_id": "1", "artifact_uri": "gs://b/m", "local_path": "/m",
                   "container": {}, "aliases": ["default"], "created": 2.0, "updated": 2.0, "description": ""}
        store.add_model({"id": long_id, "parent": PARENT, "display_name": "long", "description": "", "labels": {},
                         "created": 2.0, "updated": 2.0}, version)
        assert store.add_version({**version, "aliases": ["stable"]}) == "2"
        store.update_version(long_id, "1", {}, add=["stable"])  # the alias moves back to version 1
        assert [v["aliases"] for v in store.versions(long_id)] == [["default", "stable"], []]
    finally:
        store.close()
