"""Many models on one machine: a deployment resource pool that loads models on demand, against one
replica per model.

    python3 bench/many_models.py                          # 100 models, writes bench/results/many_models.md
    python3 bench/many_models.py --models 1000 --separate 8 --concurrency 24
    python3 bench/many_models.py --models 20 --separate 2 --hot-requests 300 --out /tmp/mm.md   # a quick check

One `modelyard platform` (temporary store, SQLite). The digits demo model's version is copied
``--models`` times, each copy uploaded as a model of its own (``models:upload``), each deployed on an
endpoint of its own into one deployment resource pool (``--pool-replicas`` replicas, a model memory
budget of ``--budget-mb`` MiB). Uploads, endpoint creations and deploys run ``--concurrency`` at a
time; "deploy time" is from the first upload to the last deploy's end, and the deploy rate is also
given for the first and the last tenth of the deploys (a pool change that costs O(models) shows as a
slower last tenth). Then every model is asked once (a cold model, unless it still fits the budget: the
first request loads it), its answer checked against the first model's (the copies are the same model),
and a second round the same. Then ``--separate`` more copies are deployed the usual way (one endpoint,
one replica each: a ``modelyard serve`` process per model) and asked once.

Hot latency, the point of the comparison: one loaded model of the pool and one separate deployment,
measured in turns (``harness.take_turns``: pool, separate, then separate, pool, ... for ``--rounds``
rounds) at each client count of ``--hot-clients`` (default 1, 4 and ``--concurrency``: one client shows
our own cost, more show the queueing the two cores add). Each measurement is ``--warmup`` predicts per
client not counted, then ``--hot-requests`` predicts in all, the clients sending back to back; the
1-minute load average is printed beside each figure. Resident memory (VmRSS) is summed over the
platform, its storage process and every replica. Timings are through the platform's gateway (REST, one
keep-alive connection per client thread, one digits image per request).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import math
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
                     take_turns, write_results)

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


def deploy_many(base: str, artifacts: list[Path], prefix: str, pool: str | None,
                concurrency: int) -> tuple[list[str], float, list[float]]:
    """Deploys ``artifacts`` ``concurrency`` at a time: (endpoint ids, seconds in all, each deploy's end
    in seconds since the start, sorted)."""
    started = time.perf_counter()
    ends: list[float] = []

    def one(ia: tuple[int, Path]) -> str:
        endpoint = deploy_one(base, ia[1], f"{prefix}-{ia[0]}", pool)
        ends.append(time.perf_counter() - started)  # list.append is atomic under the GIL
        return endpoint

    with concurrent.futures.ThreadPoolExecutor(concurrency) as threads:
        endpoints = list(threads.map(one, enumerate(artifacts)))
    return endpoints, time.perf_counter() - started, sorted(ends)


def tenth_rates(ends: list[float]) -> tuple[float, float]:
    """Deploys per second over the first and over the last tenth of the deploys (at least 2 each)."""
    k = max(2, len(ends) // 10)
    if len(ends) < 2 * k:
        return math.nan, math.nan
    first = k / ends[k - 1]
    last = k / max(ends[-1] - ends[-k - 1], 1e-9)
    return first, last


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


def ask_each(base: str, endpoints: list[str], body: bytes, expected: list | None = None) -> tuple[dict, list]:
    """Every endpoint once, in order, each answer checked against the first's (or ``expected``)."""
    first, seconds = expected, []
    for endpoint in endpoints:
        took, answer = predict(base, endpoint, body)
        seconds.append(took)
        first = first or answer
        if answer != first:
            raise RuntimeError(f"endpoint {endpoint} answered {answer}, not {first}")
    return latency_summary(seconds), first


def hot(base: str, endpoint: str, body: bytes, clients: int, requests: int, warmup: int, expected: list) -> dict:
    """``clients`` threads predicting to ``endpoint`` back to back: ``warmup`` each first (not counted),
    then ``requests`` in all; the latency summary, the rate and the 1-minute load at the end."""
    started: list[float] = []
    barrier = threading.Barrier(clients, action=lambda: started.append(time.perf_counter()))
    per_client = max(1, requests // clients)

    def client(_: int) -> list[float]:
        for _ in range(warmup):
            predict(base, endpoint, body)
        barrier.wait()
        seconds = []
        for _ in range(per_client):
            took, answer = predict(base, endpoint, body)
            if answer != expected:
                raise RuntimeError(f"endpoint {endpoint} answered {answer}, not {expected}")
            seconds.append(took)
        return seconds

    load_before = os.getloadavg()[0]
    with concurrent.futures.ThreadPoolExecutor(clients) as threads:
        runs = list(threads.map(client, range(clients)))
        wall = time.perf_counter() - started[0]
    seconds = [s for run in runs for s in run]
    return {**latency_summary(seconds), "rps": len(seconds) / wall, "load": (load_before + os.getloadavg()[0]) / 2}


def loaded_on(base: str, dm_id: str) -> int:
    """On how many pool replicas the platform's last probes saw deployed model ``dm_id`` loaded."""
    status, data = call(base, "GET", "/metrics")
    prefix = "modelyard_pool_model_loaded{"
    return sum(1 for line in data.decode().splitlines()
               if line.startswith(prefix) and f'deployed_model="{dm_id}"' in line and line.rsplit(" ", 1)[1] == "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=100, help="models deployed into the pool (default 100)")
    ap.add_argument("--budget-mb", type=float, default=4.0, help="the pool's model memory budget, MiB (default 4)")
    ap.add_argument("--pool-replicas", type=int, default=1, help="the pool's replicas (default 1)")
    ap.add_argument("--separate", type=int, default=8,
                    help="models deployed one replica each, for the comparison (default 8; 0: none)")
    ap.add_argument("--concurrency", type=int, default=16,
                    help="uploads/deploys at once, and the largest hot client count by default (default 16)")
    ap.add_argument("--hot-clients", default=None,
                    help="comma-separated client counts of the hot measurement (default 1,4,CONCURRENCY)")
    ap.add_argument("--hot-requests", type=int, default=2000,
                    help="predicts counted per hot measurement, all clients together (default 2000)")
    ap.add_argument("--warmup", type=int, default=50, help="predicts per client before each hot measurement "
                    "(default 50)")
    ap.add_argument("--rounds", type=int, default=2, help="turns of pool and separate per client count (default 2)")
    ap.add_argument("--out", default=None, help="results file (default bench/results/many_models.md)")
    args = ap.parse_args()
    clients = sorted({int(c) for c in (args.hot_clients or f"1,4,{args.concurrency}").split(",")})

    from modelyard import demo
    from modelyard.model.footprint import footprint_bytes

    base_dir = demo.ensure_demo_model(log=lambda m: print(m, file=sys.stderr))
    version = Path(base_dir) / "0001"
    model_bytes = footprint_bytes(version)
    budget = int(args.budget_mb * 2**20)
    body = demo.demo_predict_body(1).encode()
    rows, hot_rows, notes = [], [], []
    header = machine()
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
            load_deploy = os.getloadavg()[0]
            pooled, deploy_s, ends = deploy_many(p.base, artifacts[:args.models], "pooled", "many", args.concurrency)
            first_rate, last_rate = tenth_rates(ends)
            load_deploy = (load_deploy + os.getloadavg()[0]) / 2
            log(f"{args.models} deployed in {deploy_s:.1f} s; asking each once ...")
            rss_deployed = rss_mb(p.proc.pid, p.state_dir)
            load_first = os.getloadavg()[0]
            first, answer = ask_each(p.base, pooled, body)
            rss_pool = rss_mb(p.proc.pid, p.state_dir)
            second, _ = ask_each(p.base, pooled, body, answer)  # cold again past the budget
            load_first = (load_first + os.getloadavg()[0]) / 2
            processes = serving_pids(p.state_dir)
            rows.append((f"pool: {args.models} models, {args.pool_replicas} replica(s), budget {args.budget_mb:g} MiB",
                         args.models, f"{deploy_s:.1f}", f"{first_rate:.1f} / {last_rate:.1f}",
                         f"{first['p50_ms']:.1f} / {first['p99_ms']:.1f}", f"{second['p50_ms']:.1f} / {second['p99_ms']:.1f}",
                         processes, f"{rss_pool:.0f}", f"{(rss_pool - rss_empty) / args.models:.2f}",
                         f"{load_deploy:.1f} / {load_first:.1f}"))
            notes.append(f"platform alone (before the pool): {rss_empty:.0f} MiB; after the {args.models} deploys: "
                         f"{rss_deployed:.0f} MiB; after every model was asked once: {rss_pool:.0f} MiB. Pool creation "
                         f"(its replica started): {pool_create_s:.1f} s.")
            targets = {"pool": pooled[-1]}  # asked last in the second round: loaded
            if args.separate:
                log(f"deploying {args.separate} models one replica each ...")
                before = rss_mb(p.proc.pid, p.state_dir)
                load_sep = os.getloadavg()[0]
                separate, sep_s, sep_ends = deploy_many(p.base, artifacts[args.models:], "separate", None,
                                                        min(args.concurrency, args.separate))
                sep_first, _ = ask_each(p.base, separate, body, answer)
                load_sep = (load_sep + os.getloadavg()[0]) / 2
                rss_sep = rss_mb(p.proc.pid, p.state_dir)
                per_model = (rss_sep - before) / args.separate
                rows.append(("separate: one replica per model", args.separate, f"{sep_s:.1f}",
                             f"{args.separate / sep_s:.1f}", f"{sep_first['p50_ms']:.1f} / {sep_first['p99_ms']:.1f}",
                             "", serving_pids(p.state_dir) - processes, f"{rss_sep - before:.0f}", f"{per_model:.1f}",
                             f"{load_sep:.1f}"))
                notes.append(f"one replica per model: {per_model:.0f} MiB each (with the warm spare those deploys "
                             f"keep), so 1,000 models that way would need ~{per_model * 1000 / 1024:.0f} GiB "
                             f"of resident memory; this machine has "
                             f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB.")
                targets["separate"] = separate[-1]
            for n in clients:
                log(f"hot: {n} client(s), {args.rounds} round(s) of {' and '.join(targets)} in turns ...")
                results = take_turns(list(targets), args.rounds,
                                     lambda side, _round: hot(p.base, targets[side], body, n, args.hot_requests,
                                                              args.warmup, answer))
                for side, runs in results.items():
                    for i, r in enumerate(runs):
                        hot_rows.append((side, n, i + 1, r["n"], f"{r['p50_ms']:.2f}", f"{r['p90_ms']:.2f}",
                                         f"{r['p99_ms']:.2f}", f"{r['max_ms']:.1f}", f"{r['rps']:.0f}",
                                         f"{r['load']:.1f}"))
            if args.pool_replicas > 1:  # the hot model, loaded ahead on a second replica (load_ahead.py)?
                dm_id = api(p.base, "GET", f"/v1/{PARENT}/endpoints/{pooled[-1]}")["deployedModels"][0]["id"]
                notes.append(f"after the hot measurements the pool's hot model was loaded on "
                             f"{loaded_on(p.base, dm_id)} of the pool's {args.pool_replicas} replicas (a hot model is "
                             "loaded ahead on a second one: docs/pools.md).")
    title = "# Many models on one machine: a deployment resource pool vs one replica per model\n"
    text = "\n".join([
        title, header, "", f"`{command_line()}`", "",
        f"The digits demo model ({model_bytes} bytes of files), each copy uploaded as its own model and deployed "
        "on its own endpoint. Deploy rate: deploys per second over the first / the last tenth of them. First "
        "request: each model asked once, in deployment order (a load on demand in the pool); second round: the "
        "same again (past the budget every model was unloaded since). Latencies through the gateway; memory is "
        "VmRSS summed over the platform, its storage process and the replicas; load: the 1-minute load average "
        "during the deploys / the two rounds.", "",
        markdown_table(["deployment", "models", "deploy s", "deploys/s first / last tenth",
                        "first request p50 / p99 ms", "second round p50 / p99 ms", "serve processes", "RSS MiB",
                        "MiB per model", "load"], rows), "",
        *[f"- {n}" for n in notes], "",
        "Hot: one loaded model of the pool (the last one asked)" +
        (" and one separate deployment, in turns" if args.separate else "") + "; per "
        f"measurement {args.warmup} predicts per client first (not counted), then {args.hot_requests} counted, "
        "the clients sending back to back; load: the 1-minute load average over the measurement.", "",
        markdown_table(["deployment", "clients", "round", "requests", "p50 ms", "p90 ms", "p99 ms", "max ms",
                        "requests/s", "load"], hot_rows)])
    write_results("many_models", text, args.out)


if __name__ == "__main__":
    main()
