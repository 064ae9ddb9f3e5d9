"""Where data parallelism saturates the network: a study on this machine with rate-limited links.

    python3 bench/scaling.py             # root needed; prints the table, writes bench/results/scaling.md (+ .png)

Every task of a job (workers, parameter servers, the chief) runs in its own network
namespace, joined to the others by a veth pair into one bridge; each veth end is rate
limited in both directions with a token bucket (``tc qdisc ... tbf``; this kernel has no
``netem`` module, and rate is what the study needs). The script creates them and removes
them, also on Ctrl-C. Each task is ``modelyard launch --cluster-spec ... --task T`` inside its
namespace, so the gradients really cross the limited links.

Measured, for 1..4 workers: samples/s (median over the epochs after the first) of
- a dense model (784 -> 2048 -> 2048 -> 10, 5.8 M parameters) with multi_worker_mirrored,
  float32 and bfloat16 gradients, at 1 Gbit/s and 100 Mbit/s;
- the dense model and a sparse one (an embedding of 200k x 32 rows, 8 ids per example, so a
  step touches ~500 rows) with parameter_server and 1 vs 2 ps tasks, at 100 Mbit/s;
and the bytes each worker sent and received per step (the veth counters). Scaling
efficiency E(N) = thr(N) / (N x thr(1)). The machine has 2 cores, so compute stops
scaling at 2 workers whatever the link: the study shows where the network stops it first.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from harness import machine, median, write_results

ROOT = Path(__file__).resolve().parent
PREFIX = "mys"  # names of the namespaces, veths and bridge this script owns
BRIDGE = f"{PREFIX}-br"
SUBNET = "10.77.0"
PORT = 2222
ENV = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
           PYTHONPATH=str(ROOT.parent / "src"))

MODEL_FILE = '''
"""Models for bench/scaling.py: MODEL=dense or sparse (environment)."""
import os

import numpy as np
import tf_keras as keras


def build_model():
    if os.environ.get("MODEL") == "sparse":
        model = keras.Sequential([keras.Input((8,), dtype="int32"), keras.layers.Embedding(200_000, 32),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(10)])
    else:
        model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(2048, activation="relu"),
                                  keras.layers.Dense(2048, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def make_dataset(input_context, split):
    import tensorflow as tf

    rng = np.random.default_rng(0 if input_context is None else input_context.input_pipeline_id)
    if os.environ.get("MODEL") == "sparse":
        x = rng.integers(0, 200_000, (4096, 8)).astype("int32")
    else:
        x = rng.standard_normal((4096, 784)).astype("float32")
    y = rng.integers(0, 10, 4096)
    batch = int(os.environ["PER_WORKER_BATCH"])
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)
'''


def sh(*args: str, check: bool = True) -> None:
    subprocess.run(args, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def teardown() -> None:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX + "-t"):
            sh("ip", "netns", "del", name, check=False)
    sh("ip", "link", "del", BRIDGE, check=False)


def setup(tasks: int, rate: str) -> list[str]:
    """``tasks`` namespaces on one bridge, each link limited to ``rate``; returns their addresses."""
    teardown()
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "link", "set", BRIDGE, "up")
    addresses = []
    for i in range(tasks):
        ns, host, inner = f"{PREFIX}-t{i}", f"{PREFIX}-h{i}", f"{PREFIX}-n{i}"
        address = f"{SUBNET}.{10 + i}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", inner, "netns", ns)
        sh("ip", "link", "set", host, "master", BRIDGE)
        sh("ip", "link", "set", host, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{address}/24", "dev", inner)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        # Both directions: what leaves the task (inside) and what reaches it (the host end).
        for args in (["ip", "netns", "exec", ns, "tc"], ["tc"]):
            dev = inner if len(args) > 1 else host
            sh(*args, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "256kbit", "latency", "100ms")
        addresses.append(address)
    return addresses


def counters(tasks: int) -> list[int]:
    """Bytes through each task's link so far (both directions)."""
    total = []
    for i in range(tasks):
        stats = Path(f"/sys/class/net/{PREFIX}-h{i}/statistics")
        total.append(int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text()))
    return total


def one_run(work: Path, model: str, strategy: dict, workers: int, ps: int, rate: str, steps: int,
            epochs: int) -> dict:
    roles = ([("chief", 0)] if ps else []) + [("worker", i) for i in range(workers)] + [("ps", i) for i in range(ps)]
    addresses = setup(len(roles), rate)
    spec: dict[str, list[str]] = {}
    for (kind, _), address in zip(roles, addresses):
        spec.setdefault(kind, []).append(f"{address}:{PORT}")
    run_dir = work / f"{model}-{strategy['name']}-{strategy.get('gradient_dtype', 'float32')}-w{workers}-ps{ps}-{rate}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps(spec))
    # 64 examples per worker and step; asynchronous PS (Keras' fit) counts each worker's update as a step.
    asynchronous = ps and "backup_workers" not in strategy
    global_batch = 64 if asynchronous else 64 * workers
    config = {"model": str(work / "scaling_models.py"), "strategy": {k: v for k, v in strategy.items()
                                                                    if k != "gradient_dtype"},
              "global_batch_size": global_batch, "epochs": epochs, "steps_per_epoch": steps,
              "tensorboard": False, "input_report": False, "verbose": False, "job_dir": str(run_dir / "job")}
    if "gradient_dtype" in strategy:
        config["gradient_dtype"] = strategy["gradient_dtype"]
    (run_dir / "job.yaml").write_text(yaml.safe_dump(config))
    env = dict(ENV, MODEL=model, PER_WORKER_BATCH=str(64))
    procs = []
    before = counters(len(roles))
    start = time.monotonic()
    for i, (kind, index) in enumerate(roles):
        cmd = ["ip", "netns", "exec", f"{PREFIX}-t{i}", sys.executable, "-m", "modelyard", "launch",
               "--cluster-spec", str(run_dir / "spec.json"), "--task", f"{kind}:{index}", "--",
               sys.executable, "-m", "modelyard", "train", str(run_dir / "job.yaml")]
        log = open(run_dir / f"{kind}-{index}.log", "w")
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    finisher = procs[0]  # the chief with ps, else worker 0
    try:
        code = finisher.wait(timeout=600)
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    seconds = time.monotonic() - start
    moved = [b - a for a, b in zip(before, counters(len(roles)))]
    if code != 0:
        raise RuntimeError(f"{run_dir.name} failed:\n" + (run_dir / f"{roles[0][0]}-0.log").read_text()[-3000:])
    metrics = json.loads((run_dir / "job" / "metrics.json").read_text())
    rates = [e.get("samples_per_sec") or e["steps_per_sec"] * global_batch for e in metrics["epochs"][1:]]
    worker_bytes = [m for (kind, _), m in zip(roles, moved) if kind == "worker"]
    return {"samples_per_sec": median(rates), "seconds": seconds,
            "bytes_per_step_per_worker": statistics.mean(worker_bytes) / (steps * epochs)}


SERIES = [
    # (label, model, strategy, ps tasks, link)
    ("dense, all-reduce, float32, 1 Gbit/s", "dense", {"name": "multi_worker_mirrored"}, 0, "1gbit"),
    ("dense, all-reduce, bfloat16, 1 Gbit/s", "dense", {"name": "multi_worker_mirrored", "gradient_dtype": "bfloat16"},
     0, "1gbit"),
    ("dense, all-reduce, float32, 100 Mbit/s", "dense", {"name": "multi_worker_mirrored"}, 0, "100mbit"),
    ("dense, all-reduce, bfloat16, 100 Mbit/s", "dense",
     {"name": "multi_worker_mirrored", "gradient_dtype": "bfloat16"}, 0, "100mbit"),
    ("dense, parameter server x1, 100 Mbit/s", "dense", {"name": "parameter_server", "backup_workers": 0}, 1, "100mbit"),
    ("dense, parameter servers x2, 100 Mbit/s", "dense",
     {"name": "parameter_server", "backup_workers": 0, "min_shard_bytes": 1 << 20}, 2, "100mbit"),
    ("sparse, parameter server x1, 100 Mbit/s", "sparse", {"name": "parameter_server"}, 1, "100mbit"),
    ("sparse, parameter servers x2, 100 Mbit/s", "sparse",
     {"name": "parameter_server", "min_shard_bytes": 1 << 20}, 2, "100mbit"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--series", type=int, nargs="*", help="indexes into SERIES (default: all)")
    parser.add_argument("--out", default=str(ROOT / "results"))
    parser.add_argument("--reuse", help="a previous run's stderr log: its results for series not chosen now are kept")
    args = parser.parse_args()
    if os.geteuid() != 0 or not shutil.which("tc"):
        sys.exit("bench/scaling.py needs root and iproute2 (ip, tc) to create network namespaces and rate limits")
    atexit.register(teardown)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    chosen = [SERIES[i] for i in args.series] if args.series else SERIES
    results: dict[str, dict[int, dict]] = {}
    if args.reuse:  # lines "LABEL, N worker(s): {...}" of an earlier run, for the series not re-run
        import ast

        chosen_labels = {label for label, *_ in chosen}
        for line in Path(args.reuse).read_text().splitlines():
            head, sep, tail = line.partition(" worker(s): ")
            if sep and "," in head:
                label, n = head.rsplit(", ", 1)
                if label not in chosen_labels and any(label == s[0] for s in SERIES):
                    results.setdefault(label, {})[int(n)] = ast.literal_eval(tail)
    started_on = machine()
    with tempfile.TemporaryDirectory(prefix="modelyard-scaling-") as tmp:
        work = Path(tmp)
        (work / "scaling_models.py").write_text(MODEL_FILE)
        for label, model, strategy, ps, rate in chosen:
            results[label] = {}
            for n in args.workers:
                if strategy.get("gradient_dtype") and n == 1:
                    continue  # one worker has no all-reduce to compress
                result = one_run(work, model, strategy, n, ps, rate, args.steps, args.epochs)
                results[label][n] = result
                print(f"{label}, {n} worker(s): {result}", file=sys.stderr, flush=True)
    teardown()
    results = {label: results[label] for label, *_ in SERIES if label in results}
    lines = [
        "# Data parallelism against the network: samples/s and scaling efficiency by link and method",
        "",
        f"`python3 bench/scaling.py --steps {args.steps} --epochs {args.epochs}`, "
        f"{started_on}. Each task in its own network namespace, links "
        "rate-limited with tc tbf (no netem module in this kernel) in both directions; 64 examples per worker per "
        "step (all-reduce) or per update (parameter server). 2 cores: compute alone stops scaling at 2 workers.",
        "",
        "| series | workers | samples/s | E(N) = thr(N) / (N thr(1)) | MB per step per worker |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for label, by_n in results.items():
        base_label = label.replace("bfloat16", "float32")
        one = results.get(base_label, {}).get(1) or by_n.get(1)
        for n, r in sorted(by_n.items()):
            eff = r["samples_per_sec"] / (n * one["samples_per_sec"]) if one else float("nan")
            lines.append(f"| {label} | {n} | {r['samples_per_sec']:,.0f} | {eff:.2f} | "
                         f"{r['bytes_per_step_per_worker'] / 1e6:.2f} |")
    lines += ["", "Raw: " + json.dumps(results)]
    out = Path(args.out)
    write_results("scaling", "\n".join(lines), out)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 5))
        for label, by_n in results.items():
            ns = sorted(by_n)
            ax.plot(ns, [by_n[n]["samples_per_sec"] for n in ns], marker="o", label=label)
        ax.set_xlabel("workers")
        ax.set_ylabel("samples/s (log scale)")
        ax.set_yscale("log")
        ax.set_xticks(args.workers)
        ax.legend(fontsize=7)
        ax.set_title("Samples/s by workers, link and method (2-core machine)")
        fig.tight_layout()
        fig.savefig(out / "scaling.png", dpi=100)
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)


if __name__ == "__main__":
    main()
