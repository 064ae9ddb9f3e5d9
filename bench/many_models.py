"""Many models on one machine: a deployment resource pool that loads models on demand, against one
replica per model.

    python3 bench/many_models.py                          # 100 models, writes bench/results/many_models.md
    python3 bench/many_models.py --models 1000 --budget-mb 4 --separate 8
    python3 bench/many_models.py --models 20 --separate 2 --out /tmp/mm.md      # a quick check

One `modelyard platform` (temporary store, SQLite). The digits demo model's version is copied
``--models`` times, each copy uploaded as a model of its own (``models:upload``), each deployed on an
endpoint of its own into one deployment resource pool (``--pool-replicas`` replicas, a model memory
budget of ``--budget-mb`` MiB of model files, i.e. ``--budget-mb`` * 1 MiB / the model's bytes models
loaded at once). Uploads, endpoint creations and deploys run ``--concurrency`` at a time; "deploy time"
is from the first upload to the last deploy's end. Then every model is asked once (each a cold model
unless it still fits the budget: the first request loads it), its answer checked against the first
model's (the copies are the same model); then ``--hot-requests`` predicts to one loaded model, back to
back. Resident memory (VmRSS) is summed over the platform, its storage process and every replica.

The comparison: ``--separate`` more copies deployed the usual way (one endpoint, one replica each: a
``modelyard serve`` process per model), the same measures, and what 1,000 of them would take at the
measured memory per replica. Timings are through the platform's gateway (REST, one keep-alive
connection per client thread, one digits image per request).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent
PARENT = "projects/local/locations/us-central1"

sys.path.insert(0, str(ROOT))
from harness import (command_line, latency_summary, log, machine, markdown_table, modelyard_platform,  # noqa: E402
                     write_results)

_local = threading.local()


def conn(base: str) -> http.client.HTTPConnection:
    """This thread's keep-alive connection to the platform."""
    c = getattr(_local, "conn", None)
    if c is None:
        u = urlparse(base)
        c = _local.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    return c


def call(base: str, method: str, path: str, body: dict | bytes | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    for attempt in range(2):
        c = conn(base)
        try:
            c.request(method, path, body=data, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r.read()
        except (ConnectionError, http.client.HTTPException):
            # The platform closed this thread's idle keep-alive connection meanwhile: a new one, once.
            c.close()
            _local.conn = None
            if attempt:
                raise
    raise AssertionError("unreachable")


def api(base: str, method: str, path: str, body: dict | None = None) -> dict:
    status, data = call(base, method, path, body)
    if status != 200:
        raise RuntimeError(f"{method} {path}: {status} {data[:300]!r}")
    return json.loads(data)


def wait(base: str, op: dict) -> dict:
    while not op.get("done"):
        time.sleep(0.1)
        op = api(base, "GET", f"/v1/{op['name']}")
    if "error" in op:
        raise RuntimeError(op["error"])
    return op.get("response", {})


def deploy_one(base: str, artifact: Path, name: str, pool: str | None) -> str:
    """Upload ``artifact`` as a model, create its endpoint, deploy it (into ``pool``, or on a replica of
    its own); returns the endpoint id."""
    model = wait(base, api(base, "POST", f"/v1/{PARENT}/models:upload",
                           {"model": {"displayName": name, "artifactUri": str(artifact)}}))["model"]
    endpoint = wait(base, api(base, "POST", f"/v1/{PARENT}/endpoints", {"displayName": name}))["name"]
    deployed = {"model": model, "displayName": name}
    if pool:
        deployed["sharedResources"] = f"{PARENT}/deploymentResourcePools/{pool}"
    else:
        deployed["automaticResources"] = {"minReplicaCount": 1, "maxReplicaCount": 1}
    wait(base, api(base, "POST", f"/v1/{endpoint}:deployModel", {"deployedModel": deployed}))
    return endpoint.rsplit("/", 1)[-1]


def deploy_many(base: str, artifacts: list[Path], prefix: str, pool: str | None, concurrency: int) -> tuple[list[str], float]:
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as threads:
        endpoints = list(threads.map(lambda ia: deploy_one(base, ia[1], f"{prefix}-{ia[0]}", pool),
                                     enumerate(artifacts)))
    return endpoints, time.perf_counter() - started


def predict(base: str, endpoint: str, body: bytes) -> tuple[float, list]:
    t0 = time.perf_counter()
    status, data = call(base, "POST", f"/v1/{PARENT}/endpoints/{endpoint}:predict", body)
    seconds = time.perf_counter() - t0
    if status != 200:
        raise RuntimeError(f"predict on endpoint {endpoint}: {status} {data[:300]!r}")
    return seconds, json.loads(data)["predictions"]


def rss_mb(platform_pid: int, state_dir: Path) -> float:
    """VmRSS of the platform, its children (the storage process) and every replica (found by the state
    directory in their command lines), in MiB."""
    marker = str(state_dir).encode()
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        if pid == platform_pid or ppid == platform_pid or marker in cmdline:
            total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total / 1024


def serving_pids(state_dir: Path) -> int:
    marker = str(state_dir).encode()
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            count += b"serve" in args and any(marker in a for a in args)
    return count


def measure(base: str, endpoints: list[str], body: bytes, hot_requests: int) -> dict:
    """Every endpoint once (its answer checked against the first's), then ``hot_requests`` to the last one."""
    first, cold = None, []
    for endpoint in endpoints:
        seconds, answer = predict(base, endpoint, body)
        cold.append(seconds)
        first = first or answer
        if answer != first:
            raise RuntimeError(f"endpoint {endpoint} answered {answer}, not {first}")
    hot = [predict(base, endpoints[-1], body)[0] for _ in range(hot_requests)]
    return {"first": latency_summary(cold), "hot": latency_summary(hot), "answer": first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=100, help="models deployed into the pool (default 100)")
    ap.add_argument("--budget-mb", type=float, default=4.0,
                    help="the pool's model memory budget, MiB of model files (default 4)")
    ap.add_argument("--pool-replicas", type=int, default=1, help="the pool's replicas (default 1)")
    ap.add_argument("--separate", type=int, default=8,
                    help="models deployed one replica each, for the comparison (default 8; 0: none)")
    ap.add_argument("--concurrency", type=int, default=16, help="uploads/deploys at once (default 16)")
    ap.add_argument("--hot-requests", type=int, default=500, help="predicts to one loaded model (default 500)")
    ap.add_argument("--out", default=None, help="results file (default bench/results/many_models.md)")
    args = ap.parse_args()

    from modelyard import demo
    from modelyard.model.footprint import footprint_bytes

    base_dir = demo.ensure_demo_model(log=lambda m: print(m, file=sys.stderr))
    version = Path(base_dir) / "0001"
    model_bytes = footprint_bytes(version)
    budget = int(args.budget_mb * 2**20)
    body = demo.demo_predict_body(1).encode()
    rows, notes = [], []
    with tempfile.TemporaryDirectory(prefix="many-models-") as tmp:
        copies = Path(tmp) / "models"
        artifacts = []
        for i in range(args.models + args.separate):  # each model a separate upload of its own directory
            target = copies / f"m{i:04d}"
            shutil.copytree(version, target)
            artifacts.append(target)
        with modelyard_platform(Path(tmp), "--artifact-root", str(copies), "--max-replicas", "8") as p:
            rss_empty = rss_mb(p.proc.pid, p.state_dir)
            t0 = time.perf_counter()
            wait(p.base, api(p.base, "POST", f"/v1/{PARENT}/deploymentResourcePools", {
                "deploymentResourcePoolId": "many",
                "deploymentResourcePool": {"dedicatedResources": {"minReplicaCount": args.pool_replicas,
                                                                  "maxReplicaCount": args.pool_replicas},
                                           "modelMemoryBudgetBytes": budget}}))
            pool_create_s = time.perf_counter() - t0
            log(f"pool up in {pool_create_s:.1f} s; deploying {args.models} models into it ...")
            pooled, deploy_s = deploy_many(p.base, artifacts[:args.models], "pooled", "many", args.concurrency)
            log(f"{args.models} deployed in {deploy_s:.1f} s; asking each once ...")
            rss_deployed = rss_mb(p.proc.pid, p.state_dir)
            pool_result = measure(p.base, pooled, body, args.hot_requests)
            rss_pool = rss_mb(p.proc.pid, p.state_dir)
            second = measure(p.base, pooled, body, 0)["first"]  # a second round: cold again past the budget
            processes = serving_pids(p.state_dir)
            rows.append((f"pool: {args.models} models, {args.pool_replicas} replica(s), budget {args.budget_mb:g} MiB "
                         f"(~{budget // model_bytes} models)", args.models, f"{deploy_s:.1f}",
                         f"{pool_result['first']['p50_ms']:.1f} / {pool_result['first']['p99_ms']:.1f}",
                         f"{second['p50_ms']:.1f} / {second['p99_ms']:.1f}",
                         f"{pool_result['hot']['p50_ms']:.2f} / {pool_result['hot']['p99_ms']:.2f}",
                         processes, f"{rss_pool:.0f}", f"{(rss_pool - rss_empty) / args.models:.2f}"))
            notes.append(f"platform alone (before the pool): {rss_empty:.0f} MiB; after the {args.models} deploys: "
                         f"{rss_deployed:.0f} MiB; after every model was asked once: {rss_pool:.0f} MiB. Pool creation "
                         f"(its replica started): {pool_create_s:.1f} s.")
            if args.separate:
                log(f"deploying {args.separate} models one replica each ...")
                before = rss_mb(p.proc.pid, p.state_dir)
                separate, sep_s = deploy_many(p.base, artifacts[args.models:], "separate", None,
                                              min(args.concurrency, args.separate))
                sep_result = measure(p.base, separate, body, args.hot_requests)
                rss_sep = rss_mb(p.proc.pid, p.state_dir)
                per_model = (rss_sep - before) / args.separate
                rows.append((f"separate: one replica per model", args.separate, f"{sep_s:.1f}",
                             f"{sep_result['first']['p50_ms']:.1f} / {sep_result['first']['p99_ms']:.1f}", "",
                             f"{sep_result['hot']['p50_ms']:.2f} / {sep_result['hot']['p99_ms']:.2f}",
                             serving_pids(p.state_dir) - processes, f"{rss_sep - before:.0f}", f"{per_model:.1f}"))
                notes.append(f"one replica per model: {per_model:.0f} MiB each (with the warm spare those deploys "
                             f"keep), so 1,000 models that way would need ~{per_model * 1000 / 1024:.0f} GiB "
                             f"of resident memory; this machine has {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB.")
    title = "# Many models on one machine: a deployment resource pool vs one replica per model\n"
    text = "\n".join([
        title, machine(), "", f"`{command_line()}`", "",
        f"The digits demo model ({model_bytes} bytes of files), each copy uploaded as its own model and deployed "
        "on its own endpoint. First request: each model asked once, in deployment order (a load on demand in "
        "the pool); second round: the same again (past the budget every model was unloaded since). Hot: "
        f"{args.hot_requests} predicts back to back to one loaded model. Latencies through the gateway; memory "
        "is VmRSS summed over the platform, its storage process and the replicas.", "",
        markdown_table(["deployment", "models", "deploy s", "first request p50 / p99 ms", "second round p50 / p99 ms",
                        "hot p50 / p99 ms", "serve processes", "RSS MiB", "MiB per model"], rows), "",
        *[f"- {n}" for n in notes]])
    write_results("many_models", text, args.out)


if __name__ == "__main__":
    main()
