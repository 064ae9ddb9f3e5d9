"""A stuck replica under load: the platform's readiness probes and per-request deadlines (issue 35).

    python3 bench/faults.py                # 30 s healthy, then 30 s with one of 2 replicas SIGSTOPped
    python3 bench/faults.py --seconds 10   # shorter windows

One `modelyard platform` (temporary store, default flags) deploys the digits demo model with 2
replicas (min = max = 2, so the autoscaler stays out of it). An aiohttp client keeps c=16 predicts
(batch 1) in flight through the endpoint, first for a healthy window, then for a window that starts
with SIGSTOP of one replica and ends with its SIGCONT. The platform's replica list
(`/modelyard/v1/replicas`) is polled every 50 ms to time when the stopped replica leaves routing
and when a replacement serves. Reported per window: requests, failures, p50 / p99 / max latency;
and the two times. Targets (issue 35): fault-window p99 <= 2x healthy p99, 0 failures, out of
routing <= 3 s.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PARENT = "projects/local/locations/us-central1"

sys.path.insert(0, str(ROOT))
from harness import (REPO, command_line, latency_summary, log, machine, markdown_table,  # noqa: E402
                     modelyard_platform, write_results)


def http(method: str, url: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                 method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def wait_op(base: str, op: dict) -> dict:
    while not op.get("done"):
        time.sleep(0.2)
        op = http("GET", f"{base}/v1/{op['name']}")
    if "error" in op:
        raise RuntimeError(op["error"])
    return op["response"]


async def drive(url: str, body: bytes, concurrency: int, seconds: float) -> tuple[list[float], list[str]]:
    """``concurrency`` clients sending predicts back to back for ``seconds``: latencies (s), failures."""
    import aiohttp

    latencies: list[float] = []
    failures: list[str] = []
    end = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                     timeout=aiohttp.ClientTimeout(total=150)) as s:
        async def client() -> None:
            while time.monotonic() < end:
                t0 = time.monotonic()
                try:
                    async with s.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                        await r.read()
                        ok = r.status == 200
                        if not ok:
                            failures.append(f"{r.status}")
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    ok = False
                    failures.append(repr(exc))
                if ok:
                    latencies.append(time.monotonic() - t0)

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies, failures


class Watch(threading.Thread):
    """Polls the platform's replica list: when ``victim`` leaves SERVING, when another replica replaces it."""

    def __init__(self, base: str, victim: str, others: set[str], started: float) -> None:
        super().__init__(daemon=True)
        self.base, self.victim, self.others, self.started = base, victim, others, started
        self.out_s = self.replaced_s = float("nan")
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                reps = http("GET", f"{self.base}/modelyard/v1/replicas")["replicas"]
            except OSError:
                continue
            now = time.monotonic() - self.started
            states = {r["id"]: r["state"] for r in reps}
            if self.out_s != self.out_s and states.get(self.victim) != "SERVING":
                self.out_s = now
            new = [i for i, st in states.items() if st == "SERVING" and i != self.victim and i not in self.others]
            if self.replaced_s != self.replaced_s and new:
                self.replaced_s = now
            time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each window (default 30)")
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()

    from modelyard import demo

    model_dir = demo.ensure_demo_model(log=lambda m: print(m, file=sys.stderr)) / "0001"
    body = demo.demo_predict_body(1).encode()
    started_on = machine()
    with tempfile.TemporaryDirectory() as tmp, modelyard_platform(Path(tmp)) as p:
        base = p.base
        api = f"{base}/v1/{PARENT}"
        model = wait_op(base, http("POST", f"{api}/models:upload", {"model": {"displayName": "digits",
                                                                              "artifactUri": str(model_dir)}}))
        model_id = model["model"].rsplit("/", 1)[-1]
        ep = wait_op(base, http("POST", f"{api}/endpoints", {"displayName": "faults"}))["name"].rsplit("/", 1)[-1]
        wait_op(base, http("POST", f"{api}/endpoints/{ep}:deployModel", {"deployedModel": {
            "model": f"{PARENT}/models/{model_id}", "automaticResources": {"minReplicaCount": 2,
                                                                          "maxReplicaCount": 2}}}))
        url = f"{api}/endpoints/{ep}:predict"
        log("warm-up (5 s)")
        asyncio.run(drive(url, body, args.concurrency, 5))
        log(f"healthy window ({args.seconds:g} s)")
        healthy, healthy_fail = asyncio.run(drive(url, body, args.concurrency, args.seconds))
        reps = http("GET", f"{base}/modelyard/v1/replicas")["replicas"]
        victim = reps[0]
        log(f"fault window ({args.seconds:g} s): SIGSTOP of replica {victim['id']} (pid {victim['pid']})")
        t0 = time.monotonic()
        watch = Watch(base, victim["id"], {r["id"] for r in reps}, t0)
        watch.start()
        os.kill(victim["pid"], signal.SIGSTOP)
        try:
            faulted, faulted_fail = asyncio.run(drive(url, body, args.concurrency, args.seconds))
        finally:
            try:
                os.kill(victim["pid"], signal.SIGCONT)
            except ProcessLookupError:
                pass  # stopped by the platform already
        watch.done.set()
        watch.join(5)
    h, f = latency_summary(healthy), latency_summary(faulted)
    rows = [["healthy", h["n"], len(healthy_fail), f"{h['p50_ms']:.1f}", f"{h['p99_ms']:.1f}", f"{h['max_ms']:.0f}"],
            ["1 of 2 replicas SIGSTOPped", f["n"], len(faulted_fail), f"{f['p50_ms']:.1f}", f"{f['p99_ms']:.1f}",
             f"{f['max_ms']:.0f}"]]
    text = "\n".join([
        "# A stuck replica under load (issue 35)", "", started_on, "", f"`{command_line()}`", "",
        f"The digits demo model, 2 replicas, c={args.concurrency} predicts through the endpoint, "
        f"{args.seconds:g} s per window; the second window starts with SIGSTOP of one replica "
        "and ends with its SIGCONT. Default platform flags (readiness deadline 1 s, replaced after 5 s "
        "unready, first-attempt deadline max(1 s, 10x the slowest recent answer)).", "",
        markdown_table(["window", "requests", "failed", "p50 ms", "p99 ms", "max ms"], rows), "",
        markdown_table(["after SIGSTOP", "seconds"],
                       [["out of routing", f"{watch.out_s:.2f}"], ["a replacement serving", f"{watch.replaced_s:.2f}"]]),
        "", f"p99 ratio (stopped / healthy): {f['p99_ms'] / h['p99_ms']:.2f} (target <= 2); "
        f"failures {len(faulted_fail)} (target 0); out of routing {watch.out_s:.2f} s (target <= 3).",
    ])
    if faulted_fail:
        text += "\n\nFirst failures: " + "; ".join(faulted_fail[:3])
    write_results("faults", text)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
