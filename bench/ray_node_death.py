"""A Ray node killed under predict load: failed requests and the time to a replacement (issue 31).

    python3 bench/ray_node_death.py                 # 30 s of load, the node killed 5 s in
    python3 bench/ray_node_death.py --seconds 20

A three-node Ray cluster as the tests start it (tests/ray_cluster.py: the head on this host, two
nodes each in its own mount namespace, seeing none of this host's temp or cache directories; node
health checks 1 s apart, dead after 5 misses) and one `modelyard platform --engine ray` deploying the
digits demo model with 2 replicas (one CPU each, so on 2 of the 3 nodes). An aiohttp client keeps
c=16 predicts in flight through the endpoint; 5 s in, every process of a non-head node holding a
replica is killed with SIGKILL (raylet, workers, its `modelyard serve`). The platform's replica list
is polled every 50 ms for when the dead replica leaves SERVING and when a replacement serves.
Targets (issue 31, must show 4): 0 failed requests, the replica replaced within 15 s.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))
from faults import PARENT, Watch, drive, http, wait_op  # noqa: E402
from harness import command_line, latency_summary, log, machine, markdown_table, modelyard_platform, write_results  # noqa: E402,E501

_NODE_OF = """
import json, sys, ray
ray.init(address=sys.argv[1], namespace="modelyard", logging_level="ERROR", log_to_driver=False)
print(json.dumps({rid: ray.get(ray.get_actor("modelyard-replica-" + rid).info.remote(), timeout=60)["node_id"]
                  for rid in sys.argv[2:]}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the load (default 30)")
    ap.add_argument("--kill-after", type=float, default=5.0, help="seconds of load before the kill (default 5)")
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()

    from modelyard import demo
    from tests.ray_cluster import node_env, start_cluster

    model_dir = demo.ensure_demo_model(log=lambda m: print(m, file=sys.stderr)) / "0001"
    body = demo.demo_predict_body(1).encode()
    started_on = machine()
    log("starting a 3-node Ray cluster (2 nodes in their own mount namespaces)")
    cluster = start_cluster(3)
    try:
        with tempfile.TemporaryDirectory() as tmp, \
                modelyard_platform(Path(tmp), "--engine", "ray", "--ray-address", cluster.address,
                                   timeout=300) as p:
            base = p.base
            api = f"{base}/v1/{PARENT}"
            model = wait_op(base, http("POST", f"{api}/models:upload", {"model": {
                "displayName": "digits", "artifactUri": str(model_dir)}}))["model"].rsplit("/", 1)[-1]
            ep = wait_op(base, http("POST", f"{api}/endpoints", {"displayName": "node-death"}))["name"]
            ep = ep.rsplit("/", 1)[-1]
            t = time.monotonic()
            wait_op(base, http("POST", f"{api}/endpoints/{ep}:deployModel", {"deployedModel": {
                "model": f"{PARENT}/models/{model}", "automaticResources": {"minReplicaCount": 2,
                                                                           "maxReplicaCount": 2}}}))
            deploy_s = time.monotonic() - t
            reps = http("GET", f"{base}/modelyard/v1/replicas")["replicas"]
            found = subprocess.run([sys.executable, "-c", _NODE_OF, cluster.address, *[r["id"] for r in reps]],
                                   env=node_env(), capture_output=True, text=True, timeout=300, check=True)
            nodes = json.loads(found.stdout.strip().splitlines()[-1])
            head_id = cluster.node_id(cluster.head)
            victim = next(r for r in reps if nodes[r["id"]] != head_id)
            victim_node = cluster.node_of(nodes[victim["id"]])
            url = f"{api}/endpoints/{ep}:predict"
            log("warm-up (5 s)")
            asyncio.run(drive(url, body, args.concurrency, 5))
            result: dict = {}
            load = threading.Thread(target=lambda: result.update(zip(("lat", "fail"), asyncio.run(
                drive(url, body, args.concurrency, args.seconds)))))
            load.start()
            time.sleep(args.kill_after)
            log(f"killing the node of replica {victim['id']} ({len(cluster.node_pids(victim_node))} processes)")
            t0 = time.monotonic()
            watch = Watch(base, victim["id"], {r["id"] for r in reps}, t0)
            watch.start()
            cluster.kill_node(victim_node)
            killed_s = time.monotonic() - t0
            load.join()
            deadline = time.monotonic() + 120
            while watch.replaced_s != watch.replaced_s and time.monotonic() < deadline:
                time.sleep(0.2)  # the load ended first: still time the replacement
            watch.done.set()
            watch.join(5)
    finally:
        cluster.stop()
    lat, fail = result["lat"], result["fail"]
    s = latency_summary(lat)
    text = "\n".join([
        "# A Ray node killed under predict load (issue 31)", "", started_on, "", f"`{command_line()}`", "",
        f"The digits demo model, 2 replicas on a 3-node cluster (tests/ray_cluster.py: 2 nodes in their own "
        f"mount namespaces; Ray health checks 1 s apart, a node dead after 5 misses), c={args.concurrency} "
        f"predicts through the endpoint for {args.seconds:g} s; {args.kill_after:g} s in, every process of a "
        f"non-head node holding a replica gets SIGKILL (done in {killed_s:.2f} s). Deploying the 2 replicas "
        f"took {deploy_s:.1f} s (the model published to the platform's storage, fetched by the nodes).", "",
        markdown_table(["requests", "failed", "p50 ms", "p99 ms", "max ms"],
                       [[s["n"], len(fail), f"{s['p50_ms']:.1f}", f"{s['p99_ms']:.1f}", f"{s['max_ms']:.0f}"]]), "",
        markdown_table(["after the kill", "seconds"],
                       [["the dead replica out of SERVING", f"{watch.out_s:.2f}"],
                        ["a replacement serving", f"{watch.replaced_s:.2f}"]]), "",
        f"Failures {len(fail)} (target 0); replaced in {watch.replaced_s:.1f} s (target <= 15: "
        f"{'PASS' if watch.replaced_s <= 15 else 'FAIL'}).",
    ])
    if fail:
        text += "\n\nFirst failures: " + "; ".join(fail[:3])
    write_results("ray_node_death", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
