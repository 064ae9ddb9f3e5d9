"""Ray without a shared disk against Ray on one disk: gateway throughput and batch prediction (issue 31).

    python3 bench/ray_spread.py        # 20 s per load run, 300,000 batch rows, 3 rounds (~9 min on 2 cores)
    python3 bench/ray_spread.py --seconds 10 --rows 100000 --rounds 2   # quicker
    python3 bench/ray_spread.py --batch-only   # only the batch comparison (~5 min less)

Issue 31's two "must reach" figures, each measured as a comparison in one run, the sides taking
turns (``harness.take_turns``: the order reversed every round, so a machine that gets busier or
quieter meanwhile favours neither side):

1. Endpoints. Two Ray clusters run side by side, each with its own ``modelyard platform --engine
   ray`` deploying the digits demo model (version 0001) with 2 replicas (min = max = 2, one CPU each):
   * spread: a head with 0 CPUs (so no replica can land on it) and 2 nodes with 1 CPU each, each in
     its own mount namespace (tests/ray_cluster.py: the head's temp and cache dirs are empty there):
     one replica per node, each fetching the model from the platform's storage into its node's cache;
   * one node: a head with 2 CPUs and no other node: both replicas on the platform's own node.
   Where each replica landed is checked (by asking its actor), not assumed. An aiohttp client
   (bench/faults.py's ``drive``) keeps c=16 batch-1 predicts in flight through one endpoint's
   gateway for ``--seconds``; the other platform idles meanwhile. Reported: requests/s, p50/p99,
   failures, and spread / one node (target >= 0.8).
2. Batch. ``modelyard batch-predict --engine ray --ray-address ... --workers 2`` over the same
   generated JSONL of demo digits (version 0002, batch 256), output on the driver's disk:
   * no shared disk, gs:// input: the namespaced cluster above (its replicas undeployed), the
     input only in a Cloud Storage (``python -m modelyard.platform.storage``, the code the platform
     serves; reached at STORAGE_EMULATOR_HOST): split by the driver's probes (a small ranged read
     at each chunk boundary, ``batch.readers.split``), and each actor reading its own chunk's byte
     range from storage, every read pinned to the object's generation (read once, never through
     the driver's node);
   * no shared disk, local input: the same cluster, a local file (its chunks read by the driver and
     shipped to the actors through Ray's object store); for the breakdown, not a target;
   * shared disk: a cluster of a 0-CPU head and 2 nodes with 1 CPU each started without mount
     namespaces (they see every file of this host), local input. Their TMPDIR (the actors' scratch)
     is on a tmpfs, as an isolated node's /tmp is: this host's /tmp is a disk, and scratch there
     alone made the shared side ~15% slower (20.0-20.4 s against 15.3-19.2 s for the same job).
   Each cluster's first job (its nodes fetch the model and, on a node with an empty cache, convert
   it to LiteRT) is run once before the turns and reported apart. rows/s end to end (the whole
   command's wall time: Ray driver start, planning, model loads) and while predicting (from the
   first loaded model, the job's own ``predict_seconds``); no shared disk (gs://) / shared disk
   end to end (target >= 0.8).

Every process runs on this one machine (2 cores, shared with other work: the 1-minute load is in
the results' first line), so a "node" is a set of processes with its own view of the disk, not
its own CPUs; the comparison is of what the no-shared-disk path costs, not of more hardware.
Every cluster and platform started here is stopped at the end. Writes bench/results/ray_spread.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))
from batch_predict import generate  # noqa: E402
from faults import PARENT, drive, http, wait_op  # noqa: E402
from harness import (Service, command_line, free_port, http_ok, latency_summary, log, machine,  # noqa: E402
                     markdown_table, modelyard_platform, take_turns, write_results)
from ray_node_death import _NODE_OF  # noqa: E402  (asks each replica's actor for its node)

BUCKET = "ray-spread"
BATCH = 256


# ------------------------------------------------------------------ clusters
def start_ray(head_cpus: int, isolated: int = 0, shared: int = 0, shared_scratch: Path | None = None):
    """A local Ray cluster made of tests/ray_cluster.py's parts: a head with ``head_cpus`` CPUs, then
    ``isolated`` nodes in their own mount namespaces (``RayCluster.add_node``) and ``shared`` nodes
    that see this host's disk; every non-head node has 1 CPU. Stopped with ``.stop()``.

    ``shared_scratch``: the shared nodes' TMPDIR (where an actor keeps its chunk copies and parts). An
    isolated node's /tmp is a tmpfs; this host's /tmp is a disk, so without it the shared nodes would
    write their scratch to a disk and the isolated ones to memory, a difference no real pair of
    machines makes on purpose."""
    from tests import ray_cluster as rc

    ray = rc.ray_command()
    temp_dir = Path(tempfile.mkdtemp(prefix="myray-", dir="/tmp"))  # short: Ray's socket paths live under it
    head = [f"--num-cpus={head_cpus}" if a.startswith("--num-cpus=") else a for a in rc.node_args(temp_dir, True)]
    cluster = rc.RayCluster(f"{rc.HOST}:{rc._flag(head, '--port')}", temp_dir,
                            hidden=rc.hidden_dirs([str(temp_dir)]))
    try:
        cluster.procs.append(rc._start_node(ray, head, temp_dir / "head.log", {**rc.node_env(), **rc.HEALTH_CHECK_ENV}))
        cluster.ports[cluster.head.pid] = int(rc._flag(head, "--node-manager-port"))
        rc._wait_alive(cluster, 1, rc.START_TIMEOUT_S)
        for _ in range(isolated):
            cluster.add_node()
        for k in range(shared):
            # One at a time, tried again if it exits while starting: on a busy machine Ray's own 30 s for a
            # raylet to register can pass (as RayCluster.add_node does for the isolated ones).
            for attempt in range(3):
                # Its own temp dir (an isolated node has one in its namespace): two nodes of one host in one
                # temp dir share its socket paths, and the second never starts.
                own = temp_dir / f"s{k}-{attempt}"
                args = [f"--temp-dir={own}" if a.startswith("--temp-dir=") else a
                        for a in rc.node_args(temp_dir, head=False)] + [f"--address={cluster.address}"]
                proc = rc._start_node(ray, args, temp_dir / f"shared{k}-{attempt}.log",
                                      {**rc.node_env(), "TMPDIR": str(shared_scratch)} if shared_scratch else None)
                cluster.procs.append(proc)
                cluster.ports[proc.pid] = int(rc._flag(args, "--node-manager-port"))
                try:
                    rc._wait_alive(cluster, 1 + isolated + k + 1, rc.START_TIMEOUT_S)
                    break
                except rc._NodeExited:
                    if attempt == 2:
                        raise
                    cluster.procs.remove(proc)
                    log(f"shared node {k} exited while starting; again")
        want = 1 + isolated + shared
        alive = rc._wait_alive(cluster, want, rc.START_TIMEOUT_S)
        if len(alive) < want:
            raise RuntimeError(f"Ray cluster at {cluster.address}: {len(alive)} of {want} nodes alive")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def replica_nodes(address: str, replica_ids: list[str]) -> dict[str, str]:
    """Replica id -> the Ray node id its actor runs on (asked by a short-lived driver process)."""
    from tests.ray_cluster import node_env

    found = subprocess.run([sys.executable, "-c", _NODE_OF, address, *replica_ids], env=node_env(),
                           capture_output=True, text=True, timeout=300, check=True)
    return json.loads(found.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ endpoints
class Side:
    """One platform on one cluster with the demo model deployed on 2 replicas."""

    def __init__(self, name: str, cluster, workdir: Path, model_dir: Path, started: list) -> None:
        from tests.ray_cluster import node_env

        self.name, self.cluster = name, cluster
        workdir.mkdir(parents=True)
        self.platform = modelyard_platform(workdir, "--engine", "ray", "--ray-address", cluster.address,
                                           timeout=300, label=f"platform ({name})", child_env=node_env())
        started.append(self.platform)  # stopped by the caller whatever happens next
        self.platform.start()
        base = self.platform.base
        api = f"{base}/v1/{PARENT}"
        model = wait_op(base, http("POST", f"{api}/models:upload", {"model": {
            "displayName": "digits", "artifactUri": str(model_dir)}}))["model"].rsplit("/", 1)[-1]
        self.ep = wait_op(base, http("POST", f"{api}/endpoints", {"displayName": name}))["name"].rsplit("/", 1)[-1]
        t = time.monotonic()
        self.dm = wait_op(base, http("POST", f"{api}/endpoints/{self.ep}:deployModel", {"deployedModel": {
            "model": f"{PARENT}/models/{model}",
            "automaticResources": {"minReplicaCount": 2, "maxReplicaCount": 2}}}))["deployedModel"]["id"]
        self.deploy_s = time.monotonic() - t
        self.url = f"{api}/endpoints/{self.ep}:predict"
        reps = [r for r in http("GET", f"{base}/modelyard/v1/replicas")["replicas"] if r["state"] == "SERVING"]
        self.nodes = replica_nodes(cluster.address, [r["id"] for r in reps])
        self.head_id = cluster.node_id(cluster.head)

    def placement(self) -> str:
        on_head = sum(n == self.head_id for n in self.nodes.values())
        return (f"{len(self.nodes)} replicas on {len(set(self.nodes.values()))} node(s), "
                f"{on_head} on the platform's (head) node")

    def undeploy(self) -> None:
        """Replicas gone: their actors free the cluster's CPUs for the batch jobs."""
        wait_op(self.platform.base, http("POST", f"{self.platform.base}/v1/{PARENT}/endpoints/{self.ep}:undeployModel",
                                         {"deployedModelId": self.dm}))


# ------------------------------------------------------------------ batch
def storage(workdir: Path) -> Service:
    """modelyard's Cloud Storage (what ``modelyard platform`` serves) on a free port."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    service = Service("cloud storage", [sys.executable, "-m", "modelyard.platform.storage", "--root",
                                        str(workdir / "root"), "--port", str(port)], workdir / "storage.log",
                      ready=http_ok(url + "/storage/v1/b"), timeout=120)
    service.url = url
    return service


def upload(url: str, local: Path, name: str) -> str:
    import google.auth.credentials
    from google.cloud import storage as gcs

    os.environ["STORAGE_EMULATOR_HOST"] = url  # the client library's own switch to an emulator
    client = gcs.Client(project="local", credentials=google.auth.credentials.AnonymousCredentials())
    bucket = client.create_bucket(BUCKET)
    bucket.blob(name).upload_from_filename(str(local), timeout=600)
    return f"gs://{BUCKET}/{name}"


NODES_LINE = re.compile(r"ray: (\d+) workers of \d+ ran on (\d+) nodes")


def batch_job(address: str, model_base: Path, source: str, out: Path, rows: int, storage_url: str) -> dict:
    """One ``modelyard batch-predict --engine ray`` joining ``address``: wall time, the job's own
    predict time, how many nodes ran chunks; checks every row was predicted."""
    from tests.ray_cluster import node_env

    cmd = [sys.executable, "-m", "modelyard", "batch-predict", "--no-progress", "--model", str(model_base),
           "--input", source, "--output", str(out), "--batch-size", str(BATCH), "--workers", "2",
           "--engine", "ray", "--ray-address", address]
    child = {**node_env(), "STORAGE_EMULATOR_HOST": storage_url, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=child, capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"batch-predict failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    (job_dir,) = out.iterdir()
    job = json.loads((job_dir / "job.json").read_text())
    assert job["state"] == "JOB_STATE_SUCCEEDED", job["state"]
    assert job["completion_stats"]["successful_count"] == rows, job["completion_stats"]
    shutil.rmtree(out)
    spread = NODES_LINE.search(proc.stderr)
    return {"seconds": seconds, "rows_s": rows / seconds, "predict_rows_s": rows / job["predict_seconds"],
            "nodes": int(spread.group(2)) if spread else 0,
            # where the wall time went: the command's start (imports, joining Ray) before the job's own
            # clock, the job until its first actor had its model loaded, then predicting
            "start_s": seconds - job["last_run_seconds"], "load_s": job["last_run_seconds"] - job["predict_seconds"],
            "predict_s": job["predict_seconds"]}


def storage_reads(remote: str, workdir: Path) -> dict:
    """What the gs:// side reads from storage, timed from this host: the plan made by probes (what the
    driver does now: time and bytes read), the plan made by reading the object block by block (what
    the driver did before: its first chunk, then the whole plan), for comparison the whole object
    copied to a local file and scanned (how a remote input was planned before 9e46d79), then every
    chunk's range read (what the actors read, here one after the other)."""
    from modelyard import objstore
    from modelyard.batch import remote as batch_remote
    from modelyard.batch.readers import RangedSource, iter_plan, reader
    from modelyard.batch.spec import DEFAULT_CHUNK_ROWS

    size, _mtime, version = objstore.describe(remote)
    fetched: list[int] = []

    def pinned(start: int, end: int) -> bytes:
        fetched.append(end - start)
        return batch_remote.read_range(remote, start, end, version)

    t = time.monotonic()
    probed = [chunk for chunk, _ in iter_plan([remote], "jsonl", DEFAULT_CHUNK_ROWS,
                                             lambda name: RangedSource(name, size, pinned, probe=True))]
    probe_s = time.monotonic() - t
    t = time.monotonic()
    planned = iter_plan([remote], "jsonl", DEFAULT_CHUNK_ROWS, batch_remote.ranged_source)
    next(planned)
    first_chunk = time.monotonic() - t
    chunks = 1 + sum(1 for _ in planned)
    whole_plan = time.monotonic() - t

    fs = objstore.filesystem("gs")
    copy = workdir / "scan-copy.jsonl"
    t = time.monotonic()
    fs.get(remote, str(copy))
    copied = time.monotonic() - t
    ranges, _ = reader("jsonl").scan(str(copy), DEFAULT_CHUNK_ROWS)
    ranges = list(ranges)
    scanned = time.monotonic() - t
    copy.unlink()
    t = time.monotonic()
    for chunk in probed:
        pinned(chunk.start, chunk.end)
    assert len(ranges) == chunks, (len(ranges), chunks)
    assert probed[-1].end == size and sum(c.end - c.start for c in probed) == size
    return {"copy_s": copied, "scan_s": scanned, "ranges_s": time.monotonic() - t, "chunks": len(ranges),
            "first_chunk_s": first_chunk, "plan_s": whole_plan, "probe_s": probe_s,
            "probe_kib": sum(fetched[:-len(probed)]) / 1024, "probed_chunks": len(probed)}


def endpoints(args, spread_cluster, clusters: list, services: list, tmp: Path, demo_base: Path, body: bytes):
    """Part 1: the demo model on 2 replicas, spread over 2 nodes against both on the platform's node;
    returns each side's load runs, placements and deploy times."""
    log("starting the one-node cluster: a head with 2 CPUs")
    one_cluster = start_ray(2)
    clusters.append(one_cluster)
    sides = {}
    for name, cluster in (("2 nodes", spread_cluster), ("platform's node", one_cluster)):
        log(f"{name}: platform, upload, deploy 2 replicas")
        side = Side(name, cluster, tmp / name.replace(" ", "-").replace("'", ""), demo_base / "0001",
                    services)
        sides[name] = side
        log(f"{name}: deployed in {side.deploy_s:.1f} s, {side.placement()}")
    spread_ids = set(sides["2 nodes"].nodes.values())
    if len(spread_ids) != 2 or sides["2 nodes"].head_id in spread_ids:
        raise RuntimeError(f"the spread side's replicas are not on the 2 non-head nodes: {sides['2 nodes'].nodes}")
    for side in sides.values():
        log(f"{side.name}: warm-up (5 s)")
        asyncio.run(drive(side.url, body, args.concurrency, 5))

    def load(name: str, _round: int) -> dict:
        lat, fail = asyncio.run(drive(sides[name].url, body, args.concurrency, args.seconds))
        return {**latency_summary(lat), "failed": len(fail), "rps": len(lat) / args.seconds,
                "first_failures": fail[:3]}

    def show_load(name: str, k: int, r: dict) -> None:
        log(f"round {k + 1}/{args.rounds} endpoints, {name}: {r['rps']:,.0f} req/s, p50 {r['p50_ms']:.1f} ms, "
            f"p99 {r['p99_ms']:.1f} ms, {r['failed']} failed")

    served = take_turns(list(sides), args.rounds, load, show_load)
    placements = {name: side.placement() for name, side in sides.items()}
    deploys = {name: side.deploy_s for name, side in sides.items()}
    for side in sides.values():
        side.undeploy()
        side.platform.stop()
    one_cluster.stop()
    clusters.remove(one_cluster)
    return served, placements, deploys


# ------------------------------------------------------------------ main
def mean(runs: list[dict], key: str) -> float:
    return sum(r[key] for r in runs) / len(runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each load run (default 20)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rows", type=int, default=300_000, help="batch instances (default 300,000)")
    ap.add_argument("--rounds", type=int, default=3, help="turns of each comparison (default 3)")
    ap.add_argument("--batch-only", action="store_true", help="skip the endpoints comparison")
    args = ap.parse_args()

    from modelyard import demo

    demo_base = demo.ensure_demo_model(log=lambda m: print(m, file=sys.stderr))
    body = demo.demo_predict_body(1).encode()
    started_on = machine()
    clusters: list = []
    services: list = []
    scratches: list[Path] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-ray-spread-") as tmp:
            tmp = Path(tmp)
            # ---------------------------------------------------- 1. endpoints
            log("starting the spread cluster: a 0-CPU head and 2 nodes in their own mount namespaces")
            spread_cluster = start_ray(0, isolated=2)
            clusters.append(spread_cluster)
            if args.batch_only:
                served = {}
            else:
                served, placements, deploys = endpoints(args, spread_cluster, clusters, services, tmp, demo_base, body)

            # ---------------------------------------------------- 2. batch
            log(f"generating {args.rows:,} instances")
            data = tmp / "digits.jsonl"
            generate(data, args.rows)
            size_mib = data.stat().st_size / 2**20
            store = storage(tmp / "gcs")
            services.append(store)
            store.start()
            t = time.monotonic()
            remote = upload(store.url, data, "in/digits.jsonl")
            upload_s = time.monotonic() - t
            log(f"uploaded {size_mib:,.0f} MiB to {remote} in {upload_s:.1f} s")
            reads = storage_reads(remote, tmp)
            log(f"from this host: split by probes in {reads['probe_s']:.2f} s ({reads['probed_chunks']} chunks, "
                f"{reads['probe_kib']:,.0f} KiB read); planned by reading it, first chunk in {reads['first_chunk_s']:.2f} s, the "
                f"whole plan in {reads['plan_s']:.1f} s; the object copied in {reads['copy_s']:.1f} s (+ scanned: "
                f"{reads['scan_s']:.1f} s), its {reads['chunks']} chunk ranges read in {reads['ranges_s']:.1f} s")
            log("starting the shared-disk cluster: a 0-CPU head and 2 nodes without mount namespaces")
            scratch = Path(tempfile.mkdtemp(prefix="bench-ray-spread-", dir="/dev/shm"))
            scratches.append(scratch)
            shared_cluster = start_ray(0, shared=2, shared_scratch=scratch)
            clusters.append(shared_cluster)
            jobs = {"no shared disk, gs:// input": (spread_cluster, remote),
                    "no shared disk, local input": (spread_cluster, str(data)),
                    "shared disk, local input": (shared_cluster, str(data))}

            def job(name: str, k: int) -> dict:
                cluster, source = jobs[name]
                return batch_job(cluster.address, demo_base, source, tmp / f"out-{k}", args.rows, store.url)

            def show_job(name: str, k: int, r: dict) -> None:
                log(f"round {k + 1}/{args.rounds} batch, {name}: {r['rows_s']:,.0f} rows/s end to end "
                    f"({r['seconds']:.1f} s = {r['start_s']:.1f} start + {r['load_s']:.1f} to a loaded model + "
                    f"{r['predict_s']:.1f} predicting), {r['predict_rows_s']:,.0f} predicting, on {r['nodes']} nodes")

            first = {}
            for name in ("no shared disk, gs:// input", "shared disk, local input"):
                first[name] = job(name, -1)
                log(f"first job, {name}: {first[name]['seconds']:.1f} s ({first[name]['rows_s']:,.0f} rows/s)")
            batched = take_turns(list(jobs), args.rounds, job, show_job)
            load_end = os.getloadavg()[0]
    finally:
        for service in services:
            service.stop()
        for cluster in clusters:
            cluster.stop()
        for scratch in scratches:
            shutil.rmtree(scratch, ignore_errors=True)

    # ---------------------------------------------------- results
    ep_rows = []
    for name, runs in served.items():
        ep_rows.append([name, placements[name], f"{deploys[name]:.1f}", f"{mean(runs, 'rps'):,.0f}",
                        " / ".join(f"{r['rps']:,.0f}" for r in runs), f"{mean(runs, 'p50_ms'):.1f}",
                        f"{mean(runs, 'p99_ms'):.1f}", sum(r["failed"] for r in runs)])
    ep_ratio = mean(served["2 nodes"], "rps") / mean(served["platform's node"], "rps") if served else 0.0
    b_rows = []
    for name, runs in batched.items():
        cold = first.get(name)
        b_rows.append([name, f"{mean(runs, 'rows_s'):,.0f}", " / ".join(f"{r['rows_s']:,.0f}" for r in runs),
                       f"{mean(runs, 'seconds'):.1f}", f"{mean(runs, 'start_s'):.1f}", f"{mean(runs, 'load_s'):.1f}",
                       f"{mean(runs, 'predict_s'):.1f}", f"{mean(runs, 'predict_rows_s'):,.0f}",
                       "/".join(str(r["nodes"]) for r in runs),
                       f"{cold['seconds']:.1f}" if cold else "(same cluster as above)"])
    shared = mean(batched["shared disk, local input"], "rows_s")
    b_ratio = mean(batched["no shared disk, gs:// input"], "rows_s") / shared
    b_local_ratio = mean(batched["no shared disk, local input"], "rows_s") / shared
    verdict = lambda r: "PASS" if r >= 0.8 else "FAIL"  # noqa: E731
    failures = [f for runs in served.values() for r in runs for f in r["first_failures"]]
    text = "\n".join([
        "# Ray without a shared disk: gateway throughput and batch prediction (issue 31)", "", started_on, "",
        f"`{command_line()}`", "",
        "## Endpoints: 2 replicas on 2 namespaced nodes vs both on the platform's node", "",
        *([f"The digits demo model (0001), c={args.concurrency} batch-1 predicts through the platform's gateway, "
           f"{args.seconds:g} s per run, {args.rounds} rounds taking turns; both clusters and platforms run "
           "throughout, the idle one beside the driven one. Placement checked by asking each replica's actor.", "",
           markdown_table(["side", "placement", "deploy s", "req/s (mean)", "per round", "p50 ms", "p99 ms",
                           "failed"], ep_rows, "llrrrrrr"), "",
           f"2 nodes / platform's node: **{ep_ratio:.2f}x** (target >= 0.8: {verdict(ep_ratio)}).", ""]
          if served else ["Not run (`--batch-only`).", ""]),
        "## Batch: 2 nodes without a shared disk vs 2 nodes on one disk", "",
        f"{args.rows:,} demo-digits instances ({size_mib:,.0f} MiB JSONL), model 0002, batch {BATCH}, "
        f"`--workers 2` (one actor per node, each node 1 CPU, the head 0; every node's scratch on a tmpfs), "
        f"output on the driver's disk; "
        f"{args.rounds} rounds taking turns after each cluster's first job. The gs:// input was uploaded "
        f"to the storage in {upload_s:.1f} s (not counted).", "",
        markdown_table(["side", "rows/s end to end (mean)", "per round", "seconds", "of which: start s",
                        "to a loaded model s", "predicting s", "rows/s predicting", "nodes used",
                        "first job on the cluster, s"], b_rows, "lrrrrrrrrr"), "",
        "Start: the command before the job's clock (imports, joining the cluster); to a loaded model: the job's "
        "clock until its first actor has its model (the plan starts meanwhile); predicting: from there to the "
        "last commit (the job's `predict_seconds`).", "",
        f"Reading the gs:// input from this host, for comparison: the driver's plan, by probes "
        f"(`batch.readers.split`), takes {reads['probe_s']:.2f} s and reads {reads['probe_kib']:,.0f} KiB of the "
        f"object for its {reads['probed_chunks']} chunks; the plan made by reading the object block by block "
        f"(what the driver did before, relaying each chunk's bytes to its actor through Ray's object store; "
        f"`batch.remote.ranged_source`) has its first chunk in {reads['first_chunk_s']:.2f} s and "
        f"all {reads['chunks']} in {reads['plan_s']:.1f} s; the whole object "
        f"copied to a local file takes {reads['copy_s']:.1f} s, {reads['scan_s']:.1f} s with its scan (how a "
        f"remote input was planned before 9e46d79); the {reads['probed_chunks']} chunk "
        f"ranges read one after the other take {reads['ranges_s']:.1f} s (what the actors read, each its own, "
        "in parallel). The local-input sides read the file from the page cache on the driver.", "",
        f"No shared disk (gs:// input) / shared disk, end to end: **{b_ratio:.2f}x** (target >= 0.8: "
        f"{verdict(b_ratio)}); no shared disk with a local input / shared disk: {b_local_ratio:.2f}x.", "",
        f"1-minute load {load_end:.1f} at the end of the batch turns.",
    ])
    if failures:
        text += "\n\nFirst failed requests: " + "; ".join(failures[:3])
    write_results("ray_spread", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
