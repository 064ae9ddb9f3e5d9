"""The platform's part of bench/chaos.py: a ``modelyard platform`` (its own store and state directory,
the schedule's storage as its Cloud Storage) whose registry, jobs and predicts are exercised while the
nemesis kills the platform and its replicas with SIGKILL (issue 43).

Clients (each answer checked; no answer or a 5xx is indeterminate, as for the storage):

- registry: endpoints created (the answer is their done operation) and models uploaded (an operation,
  followed to its end); a 200 is an acknowledged record;
- jobs: CustomJobs of a short ``python -c`` sleep, some cancelled while they run; a 200 to the create
  is an acknowledged job;
- predicts: one client predicting on an endpoint deployed at the start (one replica) back to back.

Faults: kill -9 of the platform, then the same command again (same port, store and state directory:
it adopts the replicas and job processes that outlived it); kill -9 of the endpoint's replica (the
platform must start another). After each, the first predict *sent after the fault* that is answered
200 ends its recovery; a fault not recovered from within ``RECOVER_S`` is a violation.

At the end, after one more kill -9 and start of the platform: every acknowledged endpoint, model
and job is there (lost otherwise); every job reaches a final state and every operation is done
within ``SETTLE_S`` (stuck otherwise); the deployment has its one replica, no more (a replica the
platform lost track of is an orphan); then ``POST /modelyard/v1/stop`` and no process naming the
platform's state directory may remain.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import requests

from harness import Service, env, free_port, http_ok, log

PARENT = "projects/local/locations/us-central1"
FINAL = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")
RECOVER_S = 120.0  # a predict answered 200 within this long after each platform or replica kill
SETTLE_S = 180.0  # every job final and every operation done within this long after the run
TIMEOUT_S = 30.0
NO_ANSWER, FAILED = "no answer", "5xx"  # the two kinds of indeterminate outcome


class Indeterminate(Exception):
    """No answer, or a 5xx: the operation may or may not have taken effect. ``outcome`` says which."""

    def __init__(self, outcome: str, why: str) -> None:
        super().__init__(why)
        self.outcome = outcome


class Platform:
    """``modelyard platform`` on one port, store and state directory, killed and started again."""

    def __init__(self, work: Path, storage_url: str) -> None:
        self.work = work
        self.state = work / "state"
        self.store = work / "platform.db"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.storage_url = storage_url
        self.starts = 0
        self.service: Service | None = None
        self.up = threading.Event()  # set while it answers (cleared from the kill to the next ready)

    def start(self) -> None:
        self.starts += 1
        cmd = [sys.executable, "-m", "modelyard.platform", "--port", str(self.port), "--store", str(self.store),
               "--state-dir", str(self.state)]
        self.service = Service(f"platform #{self.starts}", cmd, self.work / f"platform-{self.starts}.log",
                               ready=http_ok(self.url + "/healthz"), env=env(STORAGE_EMULATOR_HOST=self.storage_url),
                               cwd=self.work, timeout=180)
        self.service.start()
        self.up.set()

    def kill9(self) -> None:
        self.up.clear()
        os.kill(self.service.pid, signal.SIGKILL)
        self.service.proc.wait()
        self.service.stop()  # closes its log; the process is gone already

    def alive(self) -> bool:
        return self.service is not None and self.service.proc.poll() is None

    def stop_everything(self) -> None:
        """``modelyard platform stop``: its jobs cancelled, its replicas stopped, then it exits."""
        try:
            requests.post(self.url + "/modelyard/v1/stop", json={}, timeout=120)
            self.service.proc.wait(120)
        except (requests.RequestException, OSError) as exc:
            log(f"platform stop: {exc}")
        self.up.clear()
        self.service.stop()


class PlatformChaos:
    """The platform's clients, its two faults and its final check; violations go to ``chaos``."""

    def __init__(self, chaos, platform: Platform, model_dir: str, predict_body: bytes, seed: int) -> None:
        self.c = chaos
        self.p = platform
        self.model_dir = model_dir
        self.predict_body = predict_body
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.endpoints: set[str] = set()  # acknowledged endpoint names
        self.models: set[str] = set()  # acknowledged model names
        self.jobs: dict[str, bool] = {}  # acknowledged job name -> its cancel was acknowledged
        self.operations: set[str] = set()  # model upload operations seen (followed to their end)
        self.pending: list[tuple[str, float]] = []  # faults not recovered from yet: (what, when)
        self.recoveries: dict[str, list[float]] = {}  # fault kind -> seconds until a predict was answered
        self.predicts = {"ok": 0, "failed": 0}
        self.endpoint_id = ""
        self.lost = self.stuck_jobs = self.stuck_operations = self.not_recovered = 0
        self.replicas_left = self.extra_replicas = 0

    # ---- plumbing -------------------------------------------------------------------------------
    def api(self, path: str) -> str:
        return f"{self.p.url}/v1/{PARENT}/{path}"

    def call(self, method: str, url: str, session: requests.Session | None = None, **kw) -> requests.Response:
        """One request; no answer or a 5xx raises the schedule's Indeterminate."""
        try:
            r = (session or requests).request(method, url, timeout=TIMEOUT_S, **kw)
        except requests.RequestException as exc:
            time.sleep(0.2)  # the platform is down: back off as a retrying client would
            raise Indeterminate(NO_ANSWER, type(exc).__name__) from None
        if r.status_code >= 500:
            raise Indeterminate(FAILED, str(r.status_code))
        return r

    def answered(self, method: str, url: str, deadline_s: float = 180.0, **kw) -> requests.Response:
        """The same request until it is answered (the checker's own calls)."""
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                return self.call(method, url, **kw)
            except Indeterminate:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def follow(self, op: dict, deadline_s: float = 120.0) -> dict | None:
        """An operation followed until done (None: not answered meanwhile)."""
        deadline = time.monotonic() + deadline_s
        while not op.get("done") and time.monotonic() < deadline and not self.c.stop.is_set():
            time.sleep(0.2)
            try:
                r = self.call("GET", f"{self.p.url}/v1/{op['name']}")
            except Indeterminate:
                continue
            if r.status_code != 200:
                self.c.violation(f"operation {op['name']}: {r.status_code} {r.text[:200]}")
                return None
            op = r.json()
        return op if op.get("done") else None

    # ---- set-up ---------------------------------------------------------------------------------
    def deploy(self) -> None:
        """One endpoint with the model deployed on one replica, for the predict client."""
        op = self.answered("POST", self.api("models:upload"),
                           json={"model": {"displayName": "chaos-served", "artifactUri": self.model_dir}}).json()
        model = self.follow(op)["response"]["model"]
        op = self.answered("POST", self.api("endpoints"), json={"displayName": "chaos-serving"}).json()
        self.endpoint_id = op["response"]["name"].rsplit("/", 1)[-1]
        op = self.answered("POST", self.api(f"endpoints/{self.endpoint_id}:deployModel"), json={"deployedModel": {
            "model": model, "automaticResources": {"minReplicaCount": 1, "maxReplicaCount": 1}}}).json()
        done = self.follow(op, deadline_s=300)
        if done is None or "error" in done:
            raise RuntimeError(f"deploy failed: {done}")

    # ---- clients --------------------------------------------------------------------------------
    def registry(self) -> None:
        n = 0
        while not self.c.stop.is_set():
            n += 1
            kind = "model upload" if n % 10 == 0 else "endpoint create"
            try:
                if kind == "endpoint create":
                    r = self.call("POST", self.api("endpoints"),
                                  json={"displayName": f"chaos-{n}", "labels": {"n": str(n % 7)}})
                else:
                    r = self.call("POST", self.api("models:upload"),
                                  json={"model": {"displayName": f"chaos-{n}", "artifactUri": self.model_dir}})
            except Indeterminate as exc:
                self.c.count(kind, exc.outcome)
                continue
            if r.status_code != 200:
                self.c.violation(f"{kind}: {r.status_code} {r.text[:200]}")
                continue
            self.c.count(kind, "ok")
            op = r.json()
            if kind == "endpoint create":
                with self.lock:
                    self.endpoints.add(op["response"]["name"])
            else:
                with self.lock:
                    self.operations.add(op["name"])
                done = self.follow(op)
                if done is not None and "response" in done:
                    with self.lock:
                        self.models.add(done["response"]["model"])
            self.c.stop.wait(0.05)

    def submitter(self) -> None:
        n = 0
        out = self.p.work / "job-outputs"
        while not self.c.stop.wait(self.rng.uniform(1.0, 3.0)):
            n += 1
            sleep = self.rng.uniform(0.5, 6.0)
            body = {"displayName": f"chaos-job-{n}", "jobSpec": {
                "workerPoolSpecs": [{"replicaCount": "1", "containerSpec": {"imageUri": "python", "command": [
                                         sys.executable, "-c", f"import time; time.sleep({sleep:.2f})"]}}],
                "baseOutputDirectory": {"outputUriPrefix": str(out / str(n))}}}
            try:
                r = self.call("POST", self.api("customJobs"), json=body)
            except Indeterminate as exc:
                self.c.count("custom job", exc.outcome)
                continue
            if r.status_code != 200:
                self.c.violation(f"custom job create: {r.status_code} {r.text[:200]}")
                continue
            self.c.count("custom job", "ok")
            name = r.json()["name"]
            with self.lock:
                self.jobs[name] = False
            if self.rng.random() < 0.3:  # cancelled while it runs (or just after it ended)
                self.c.stop.wait(self.rng.uniform(0.2, 2.0))
                try:
                    r = self.call("POST", f"{self.p.url}/v1/{name}:cancel", json={})
                except Indeterminate as exc:
                    self.c.count("job cancel", exc.outcome)
                    continue
                if r.status_code == 200:
                    self.c.count("job cancel", "ok")
                    with self.lock:
                        self.jobs[name] = True
                elif r.status_code in (400, 409):  # FAILED_PRECONDITION: it had ended already
                    self.c.count("job cancel", "refused")
                else:
                    self.c.violation(f"cancel {name}: {r.status_code} {r.text[:200]}")

    def predictor(self) -> None:
        session = requests.Session()
        url = self.api(f"endpoints/{self.endpoint_id}:predict")
        while not self.c.stop.is_set():
            sent = time.monotonic()
            try:
                r = session.post(url, data=self.predict_body, headers={"Content-Type": "application/json"},
                                 timeout=TIMEOUT_S)
                ok = r.status_code == 200 and "predictions" in r.json()
            except (requests.RequestException, ValueError):
                ok = False
                session = requests.Session()
            with self.lock:
                self.predicts["ok" if ok else "failed"] += 1
                if ok and self.pending:
                    still = []
                    for what, when in self.pending:
                        if sent >= when:
                            self.recoveries.setdefault(what, []).append(time.monotonic() - when)
                        else:
                            still.append((what, when))
                    self.pending = still
            if not ok:
                time.sleep(0.05)
            self._overdue()

    def _overdue(self) -> None:
        now = time.monotonic()
        with self.lock:
            late = [(w, t) for w, t in self.pending if now - t > RECOVER_S]
            self.pending = [(w, t) for w, t in self.pending if now - t <= RECOVER_S]
        for what, _ in late:
            self.not_recovered += 1
            self.c.violation(f"predicts did not recover within {RECOVER_S:.0f} s of the {what}")

    # ---- faults ---------------------------------------------------------------------------------
    def kill_platform(self, down_s: float) -> None:
        """kill -9, down ``down_s`` seconds, started again; recovered once a predict sent after the kill is answered."""
        with self.lock:
            self.pending.append(("kill -9 of the platform", time.monotonic()))
        self.p.kill9()
        self.c.stop.wait(down_s)
        self.p.start()

    def kill_replica(self) -> bool:
        """kill -9 of a replica the platform reports (False: none had a process yet)."""
        try:
            listed = self.answered("GET", f"{self.p.url}/modelyard/v1/replicas", deadline_s=30).json()["replicas"]
        except Exception:
            return False
        pids = [r["pid"] for r in listed if r.get("pid") and r["endpointId"] == self.endpoint_id]
        if not pids:
            return False
        try:
            os.kill(self.rng.choice(pids), signal.SIGKILL)
        except ProcessLookupError:
            return False
        with self.lock:
            self.pending.append(("kill -9 of a replica", time.monotonic()))
        return True

    # ---- the final check ------------------------------------------------------------------------
    def settle(self) -> None:
        """A fault struck just before the clients stopped: predicts (as the predict client sent them) until
        one is answered, so its recovery is seen as the client would have seen it, within ``RECOVER_S``."""
        url = self.api(f"endpoints/{self.endpoint_id}:predict")
        session = requests.Session()
        while self.pending and time.monotonic() - min(t for _, t in self.pending) <= RECOVER_S:
            sent = time.monotonic()
            try:
                ok = session.post(url, data=self.predict_body, headers={"Content-Type": "application/json"},
                                  timeout=TIMEOUT_S).status_code == 200
            except requests.RequestException:
                ok, session = False, requests.Session()
            if ok:
                for what, when in self.pending:
                    if sent >= when:
                        self.recoveries.setdefault(what, []).append(time.monotonic() - when)
                self.pending = [(w, t) for w, t in self.pending if sent < t]
            else:
                time.sleep(0.05)
        self._overdue()

    def final_check(self) -> None:
        """After the clients stopped: the last fault's recovery, one more kill -9 and start, then every
        record, job and operation."""
        if not self.p.alive():
            self.p.start()
        self.settle()
        self.p.kill9()
        self.p.start()
        session = requests.Session()
        for kind, names in (("endpoint", sorted(self.endpoints)), ("model", sorted(self.models)),
                            ("custom job", sorted(self.jobs))):
            for name in names:
                r = self.answered("GET", f"{self.p.url}/v1/{name}", session=session)
                if r.status_code != 200:
                    self.lost += 1
                    self.c.violation(f"acknowledged {kind} {name} lost after the platform's kills ({r.status_code})")
        deadline = time.monotonic() + SETTLE_S
        waiting = dict(self.jobs)
        while waiting and time.monotonic() < deadline:
            for name in list(waiting):
                r = self.answered("GET", f"{self.p.url}/v1/{name}", session=session)
                state = r.json().get("state") if r.status_code == 200 else "gone"
                if state in FINAL or state == "gone":
                    if waiting.pop(name) and state == "JOB_STATE_FAILED":
                        self.c.violation(f"{name}: cancelled (acknowledged), ended FAILED: {r.json().get('error')}")
            if waiting:
                time.sleep(1.0)
        for name in waiting:
            self.stuck_jobs += 1
            self.c.violation(f"job {name} not in a final state {SETTLE_S:.0f} s after the run")
        open_ops: list[str] = []
        while True:
            r = self.answered("GET", self.api("operations"), params={"filter": "done=false", "pageSize": 1000},
                              session=session)
            open_ops = [op["name"] for op in r.json().get("operations", [])]
            if not open_ops or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        for name in open_ops:
            self.stuck_operations += 1
            self.c.violation(f"operation {name} not done {SETTLE_S:.0f} s after the run")
        # predicts answer again, on exactly the one replica deployed
        end = time.monotonic() + RECOVER_S
        url = self.api(f"endpoints/{self.endpoint_id}:predict")
        while time.monotonic() < end:
            try:
                if session.post(url, data=self.predict_body, headers={"Content-Type": "application/json"},
                                timeout=TIMEOUT_S).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        else:
            self.not_recovered += 1
            self.c.violation("predicts did not answer after the run")
        self._overdue()
        listed = self.answered("GET", f"{self.p.url}/modelyard/v1/replicas", session=session).json()["replicas"]
        mine = [r for r in listed if r["endpointId"] == self.endpoint_id]
        if len(mine) > 1:
            self.extra_replicas = len(mine) - 1
            self.c.violation(f"{len(mine)} replicas for a deployment of one: {json.dumps(mine)[:300]}")
        self.p.stop_everything()

    def rows(self) -> list[list]:
        kinds = ["endpoint create", "model upload", "custom job", "job cancel"]
        return [[k, sum(self.c.ops[k].values()), self.c.ops[k]["ok"], self.c.ops[k]["refused"],
                 self.c.ops[k][FAILED], self.c.ops[k][NO_ANSWER]] for k in kinds]

    def recovery_rows(self) -> list[list]:
        out = []
        for what, seconds in sorted(self.recoveries.items()):
            s = sorted(seconds)
            out.append([what, len(s), f"{s[len(s) // 2]:.1f}", f"{s[-1]:.1f}"])
        return out
