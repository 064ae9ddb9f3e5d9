"""Endpoint benchmark: the platform's gateway against calling the replica directly, plus traffic-split
accuracy and autoscaling times.

    python3 bench/endpoints.py              # full run (~3 min), writes bench/results/endpoints.md
    python3 bench/endpoints.py --quick      # 3 s per run, 2 rounds, 2,000 split requests

One `modelyard platform` (temporary store) deploys the digits demo model (version 0001) with one
replica; `wrk` (one thread, c=32, one batch-1 digits image per request) then drives, taking turns,
the replica's own TF Serving URL and the endpoint's `:predict` through the gateway, same body, same run.
The split check deploys version 0002 at 10% and counts `deployedModelId` over N requests (aiohttp,
32 in flight). The autoscaling check deploys with min 1 / max 2 replicas, overloads the endpoint with
wrk c=64 and times the second replica's arrival, then the return to one after the cool-down.

The peer: Ray Serve (bench/peers/ray_serve_app.py: the same model, LiteRT like `modelyard serve`,
one replica, max_ongoing_requests 64, a FastAPI ingress behind Serve's HTTP proxy) on a one-node Ray cluster this script
starts (its own temp dir and ports, stopped by its process group). It is driven by the same wrk, in
the same turns as the replica and the gateway; the Ray cluster idles beside the other two runs.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from modelyard.ports import free_port

ROOT = Path(__file__).resolve().parent
PARENT = "projects/local/locations/us-central1"

sys.path.insert(0, str(ROOT))
from harness import (REPO, RESULTS, machine, markdown_table, median, modelyard_platform,  # noqa: E402
                     take_turns, write_results)
from serving import rest_load  # noqa: E402  (the serving benchmark's wrk driver: one load generator)


def http(method: str, url: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                 method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


class Platform:
    """The platform under test (harness.modelyard_platform) and the API calls the benchmark makes."""

    def __init__(self, workdir: Path, cooldown: float) -> None:
        self.service = modelyard_platform(workdir, "--autoscale-cooldown-seconds", str(cooldown)).start()
        self.base = self.service.base
        self.workdir = workdir

    def api(self, path: str) -> str:
        return f"{self.base}/v1/{PARENT}/{path}"

    def wait(self, op: dict) -> dict:
        while not op.get("done"):
            time.sleep(0.2)
            op = http("GET", f"{self.base}/v1/{op['name']}")
        if "error" in op:
            raise RuntimeError(op["error"])
        return op["response"]

    def upload(self, path: Path) -> str:
        return self.wait(http("POST", self.api("models:upload"),
                              {"model": {"displayName": path.name, "artifactUri": str(path)}}))["model"].rsplit("/", 1)[-1]

    def endpoint(self) -> str:
        return self.wait(http("POST", self.api("endpoints"), {"displayName": "bench"}))["name"].rsplit("/", 1)[-1]

    def deploy(self, ep: str, model: str, split: dict | None = None, min_r: int = 1, max_r: int = 1) -> str:
        body = {"deployedModel": {"model": f"{PARENT}/models/{model}",
                                  "automaticResources": {"minReplicaCount": min_r, "maxReplicaCount": max_r}}}
        if split:
            body["trafficSplit"] = split
        return self.wait(http("POST", self.api(f"endpoints/{ep}:deployModel"), body))["deployedModel"]["id"]

    def undeploy(self, ep: str, dm: str, split: dict | None = None) -> None:
        self.wait(http("POST", self.api(f"endpoints/{ep}:undeployModel"),
                       {"deployedModelId": dm, **({"trafficSplit": split} if split else {})}))

    def replicas(self, dm: str) -> list[dict]:
        return [r for r in http("GET", f"{self.base}/modelyard/v1/replicas")["replicas"]
                if r["deployedModelId"] == dm and r["state"] == "SERVING"]

    def logged_at(self, text: str) -> float:
        """The time (epoch seconds) of the platform's first log line containing ``text`` (nan if none)."""
        import datetime

        for line in (self.workdir / "platform.log").read_text(errors="replace").splitlines():
            if text in line:
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                return stamp.timestamp()
        return float("nan")

    def stop(self) -> None:
        self.service.stop()  # and the replicas it started


async def count_split(url: str, body: bytes, n: int, concurrency: int = 32) -> collections.Counter:
    import aiohttp

    counts: collections.Counter = collections.Counter()
    left = n

    async def worker(session) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                doc = await r.json()
                counts[doc.get("deployedModelId", f"error {r.status}")] += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return counts


# Per replica. Serve's default (5) makes its proxy queue and back off at c=32 (about 50 req/s here, a
# quarter of its c=4 rate); 64 lets all 32 connections reach the replica: the stronger peer is measured.
RAY_MAX_ONGOING = 64


class RayServe:
    """A one-node Ray cluster (tests/ray_cluster.py's starter: free ports, own temp dir, stopped by its
    process group, never `ray stop`) with the digits model deployed by bench/peers/ray_serve_app.py."""

    def __init__(self, model_dir: Path, workdir: Path) -> None:
        sys.path.insert(0, str(REPO))
        from tests.ray_cluster import node_env, start_cluster

        self.cluster = start_cluster(1)
        port = free_port()
        try:
            subprocess.run([sys.executable, str(ROOT / "peers" / "ray_serve_app.py"), "--address",
                            self.cluster.address, "--http-port", str(port), "--model-dir", str(model_dir),
                            "--max-ongoing-requests", str(RAY_MAX_ONGOING)],
                           env=node_env(), check=True, timeout=600, stdout=open(workdir / "ray_serve.log", "wb"),
                           stderr=subprocess.STDOUT)
        except BaseException:
            print((workdir / "ray_serve.log").read_text()[-3000:], file=sys.stderr)
            self.cluster.stop()
            raise
        self.url = f"http://127.0.0.1:{port}/v1/models/model:predict"
        import ray

        self.version = ray.__version__

    def stop(self) -> None:
        self.cluster.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run (default 10)")
    ap.add_argument("--rounds", type=int, default=3, help="turns of direct/gateway (default 3)")
    ap.add_argument("--split-requests", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray Serve peer")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.rounds, args.split_requests = 3.0, 2, 2000

    sys.path.insert(0, str(REPO / "src"))
    from modelyard import demo

    base = demo.ensure_demo_model(log=lambda m: print(m, file=sys.stderr))
    body = demo.demo_predict_body(1).encode()
    cooldown = 10.0
    started_on = machine()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        peer = None if args.no_ray else RayServe(base / "0001", workdir)
        try:
            p = Platform(workdir, cooldown)
        except BaseException:
            if peer is not None:
                peer.stop()
            raise
        try:
            v1, v2 = p.upload(base / "0001"), p.upload(base / "0002")
            ep = p.endpoint()
            dm1 = p.deploy(ep, v1)
            replica = p.replicas(dm1)[0]
            direct = f"http://127.0.0.1:{replica['port']}/v1/models/model:predict"
            gateway = p.api(f"endpoints/{ep}:predict")
            targets = {"direct": direct, "gateway": gateway, **({"ray_serve": peer.url} if peer else {})}
            from modelyard.platform.dataplane import replica_secrets  # a replica answers only its own secret

            secret = replica_secrets.read_secret(replica_secrets.token_file_of(replica["pid"]))
            headers = {"direct": (f"Authorization: Bearer {secret}",)}

            def show(name: str, _round: int, r: dict) -> None:
                print(f"{name:9s} {r['rps']:9.0f} req/s  p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  "
                      f"errors {r['errors']}", file=sys.stderr)

            # Taking turns, so drift on the shared machine hits all alike.
            runs = {"ray_serve": [], **take_turns(list(targets), args.rounds, lambda name, _round: rest_load(
                "wrk", targets[name], body, args.concurrency, args.duration, workdir, headers.get(name, ())), show)}

            dm2 = p.deploy(ep, v2, split={dm1: 90, "0": 10})
            counts = asyncio.run(count_split(gateway, body, args.split_requests))
            share = 100 * counts[dm2] / args.split_requests
            p.undeploy(ep, dm2, {dm1: 100})
            p.undeploy(ep, dm1)

            dm3 = p.deploy(ep, v1, min_r=1, max_r=2)
            t0, wall0 = time.monotonic(), time.time()
            wrk = subprocess.Popen(["wrk", "-t1", "-c64", "-d60s", "-s", str(workdir / "post.lua"), gateway],
                                   stdout=subprocess.DEVNULL)
            while len(p.replicas(dm3)) < 2 and time.monotonic() - t0 < 60:
                time.sleep(0.2)
            up = time.monotonic() - t0 if len(p.replicas(dm3)) >= 2 else float("nan")
            decided = p.logged_at(f"starting 1 replica(s) of deployed model {dm3}") - wall0
            wrk.send_signal(signal.SIGINT)
            wrk.wait()
            t1 = time.monotonic()
            while len(p.replicas(dm3)) > 1 and time.monotonic() - t1 < 120:
                time.sleep(0.2)
            down = time.monotonic() - t1 if len(p.replicas(dm3)) == 1 else float("nan")
        finally:
            p.stop()
            if peer is not None:
                peer.stop()

    def med(name, key):
        return median(r[key] for r in runs[name])

    ratio = med("gateway", "rps") / med("direct", "rps")
    p99_ratio = med("gateway", "p99_ms") / med("direct", "p99_ms")
    rows = [
        ("direct to the replica (`modelyard serve`)", f"{med('direct', 'rps'):,.0f}", f"{med('direct', 'p50_ms'):.2f}",
         f"{med('direct', 'p99_ms'):.2f}", str(sum(r["errors"] for r in runs["direct"]))),
        ("through the platform gateway (`:predict`)", f"{med('gateway', 'rps'):,.0f}", f"{med('gateway', 'p50_ms'):.2f}",
         f"{med('gateway', 'p99_ms'):.2f}", str(sum(r["errors"] for r in runs["gateway"]))),
    ]
    if runs["ray_serve"]:
        rows.append((f"Ray Serve {peer.version} (HTTP proxy, FastAPI ingress, 1 replica, "
                     f"max_ongoing_requests {RAY_MAX_ONGOING})",
                     f"{med('ray_serve', 'rps'):,.0f}", f"{med('ray_serve', 'p50_ms'):.2f}",
                     f"{med('ray_serve', 'p99_ms'):.2f}", str(sum(r["errors"] for r in runs["ray_serve"]))))
        if med("ray_serve", "rps") > 0:
            vs_ray = med("gateway", "rps") / med("ray_serve", "rps")
            ray_check = (f"| gateway req/s / Ray Serve req/s | {vs_ray:.2f}x | target >= 3x | "
                         f"{'PASS' if vs_ray >= 3 else 'FAIL'} |")
        else:
            ray_check = "| gateway req/s / Ray Serve req/s | Ray Serve answered no request | target >= 3x | FAIL |"
    else:
        ray_check = "| gateway req/s / Ray Serve req/s | not run (--no-ray) | target >= 3x | MISSING |"
    table = [markdown_table([f"path (digits, REST, c={args.concurrency}, wrk 1 thread)",
                             f"req/s (median of {args.rounds})", "p50 ms", "p99 ms", "errors"], rows)]
    checks = [
        f"| gateway req/s / direct req/s | {ratio:.2f}x | target >= 0.5x | {'PASS' if ratio >= 0.5 else 'FAIL'} |",
        f"| gateway p99 / direct p99 | {p99_ratio:.2f}x | target <= 2x | {'PASS' if p99_ratio <= 2 else 'FAIL'} |",
        f"| 90/10 split over {args.split_requests:,} requests: share of the 10% model | {share:.2f}% | 10 +- 1.5 | "
        f"{'PASS' if abs(share - 10) <= 1.5 else 'FAIL'} |",
        f"| autoscale 1 -> 2 replicas under wrk c=64 (decided after {decided:.1f} s, the replica AVAILABLE "
        f"{up - decided:.1f} s later) | {up:.1f} s | <= 15 s | {'PASS' if up <= 15 else 'FAIL'} |",
        f"| back to 1 replica after load stops (cool-down {cooldown:g} s) | {down:.1f} s | after the cool-down | "
        f"{'PASS' if down == down else 'FAIL'} |",
        ray_check,
    ]
    text = "\n".join([
        "# Endpoint benchmark (bench/endpoints.py)", "",
        f"`{'python3 bench/endpoints.py' + (' --quick' if args.quick else '')}` on {started_on}; "
        f"{args.rounds} turns of {args.duration:g} s each. Split counts: {dict(counts)}", "",
        *table, "", "| check | measured | target | |", "| --- | ---: | --- | --- |", *checks, "",
        "Per run: " + json.dumps(runs), ""])
    write_results("endpoints", text, RESULTS / ("endpoints-quick.md" if args.quick else "endpoints.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
