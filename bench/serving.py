"""Serving benchmark: modelyard against KServe's Python server and a hand-written FastAPI app.

    python3 bench/serving.py                       # full run (~10-15 min), writes bench/results/serving.{md,png}
    python3 bench/serving.py --quick               # smoke run: 2 s per run, fewer concurrencies
    python3 bench/serving.py --modelyard-args "--workers 2 --runtime auto"

Every server runs alone on the machine in turn (same model version, same runtime), driven
by the same load generator: ``wrk`` (default) or ``hey`` for REST, and for gRPC a
multi-process Python client (one grpc.aio channel per process, the in-flight calls split across them)
sending a pre-serialized PredictRequest. One batch-1 digits image per request.

Server CPU per request is the utime+stime of the server process and all its descendants
(from /proc/<pid>/stat) over the measured window, divided by the requests it answered.
The "in-process ceiling" rows time the model call alone, one thread, no server.

Peers live in their own virtualenvs under ~/.cache/modelyard-bench/venvs (KServe pins
protobuf and grpc versions of its own); the first run creates them, which takes minutes.
This script imports only the standard library at the top so it can run inside those
venvs too (its ``_prepare``, ``_ceiling`` and ``_plot`` sub-commands).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from harness import (Service, children_cpu_seconds, ensure_tool, log, machine, model_available, port_open,
                     take_turns, write_results)
from modelyard.ports import free_port

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
PEERS = ROOT / "peers"
RESULTS = ROOT / "results"
CACHE = Path(os.environ.get("MODELYARD_BENCH_CACHE", Path.home() / ".cache" / "modelyard-bench"))

MODEL = "my_mnist_model"
CNN = "digits_cnn"
CNN_DIR = "digits_cnn-dense1024"  # a new directory whenever the CNN's architecture changes
# TF thread settings the CNN runs under, with and without batching: TF's own (as many intra-op
# threads as cores, which spin between ops); one thread per op (the batch threads, or the
# concurrent requests, are the parallelism); and one thread per op with the graph run in the
# calling thread (inter-op -1: no hand-off to TF's inter-op pool, which left the batch thread's
# core idle ~20% of the time). The batching target compares best with best.
CNN_THREADS = {
    "TF default threads": [],
    "1 intra-op, 1 inter-op thread": ["--tensorflow_intra_op_parallelism", "1", "--tensorflow_inter_op_parallelism", "1"],
    "1 intra-op thread, ops in the caller's thread": ["--tensorflow_intra_op_parallelism", "1",
                                                      "--tensorflow_inter_op_parallelism", "-1"],
}
TF_PIN = "tensorflow-cpu==2.21.*"
VENVS = {
    "kserve": ["kserve", TF_PIN, "ai-edge-litert"],
    "fastapi": ["fastapi", "uvicorn[standard]", TF_PIN, "ai-edge-litert"],
    "plot": ["matplotlib"],
    "kserve_v2": ["kserve==0.21.*", "ai-edge-litert"],  # bench/serving_v2.py's peer: a .tflite, no TensorFlow
}
# One batch thread: on two cores the REST event loop (parsing every request) needs the other
# one. Measured on the CNN at c=64: one thread filled batches to ~31 rows and served 10-30%
# more than two, which split the load into ~20-row batches that competed with the loop.
DEFAULT_BATCHING = """max_batch_size { value: 32 }
batch_timeout_micros { value: 2000 }
max_enqueued_batches { value: 1000 }
num_batch_threads { value: 1 }
"""
ENV = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")

# ------------------------------------------------------------------ environment
def ensure_venv(name: str) -> Path:
    """A virtualenv under the cache dir holding VENVS[name]; created (minutes) on first use."""
    venv = CACHE / "venvs" / name
    py = venv / "bin" / "python"
    spec = "\n".join(VENVS[name])
    marker = venv / ".bench-requirements"
    if py.exists() and marker.exists() and marker.read_text() == spec:
        return py
    log(f"creating virtualenv {venv} with {', '.join(VENVS[name])} (one-time, may take a few minutes) ...")
    subprocess.check_call([sys.executable, "-m", "venv", "--clear", str(venv)])
    subprocess.check_call([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *VENVS[name]])
    marker.write_text(spec)
    return py


def slug(text: str) -> str:
    """``text`` as a file-name part: lower-case words joined by '-'."""
    return "-".join("".join(ch if ch.isalnum() else " " for ch in text.lower()).split())


def pkg_version(py: Path | str, module: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({module!r}))"
    try:
        return subprocess.check_output([str(py), "-c", code], text=True, stderr=subprocess.DEVNULL).strip()
    except subprocess.CalledProcessError:
        return "?"


# ------------------------------------------------------------------ servers
class Server(Service):
    """A server under load (modelyard or a peer): ready once ``model`` is AVAILABLE (and its
    gRPC port open), stopped with its whole process group (harness.Service)."""

    def __init__(self, label: str, cmd: list[str], rest_port: int, model: str, logfile: Path,
                 env: dict | None = None, cwd: Path | None = None, grpc_port: int | None = None):
        super().__init__(label, cmd, logfile, ready=model_available(rest_port, model), env=env or ENV, cwd=cwd)
        self.rest_port, self.grpc_port, self.model = rest_port, grpc_port, model

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}/v1/models/{self.model}:predict"

    def start(self, timeout: float = 300) -> "Server":
        self.timeout = timeout
        super().start()
        if self.grpc_port:  # both ports open together in modelyard, but be sure
            self.wait(port_open(self.grpc_port), timeout)
        return self


def modelyard_runtime(server: Server, model: str) -> str:
    """The runtime the server log says the newest loaded version of ``model`` runs on."""
    found = "?"
    for line in server.log_text().splitlines():
        if "Successfully loaded servable version" in line and f"name: {model} " in line and " runtime" in line:
            found = line.rsplit("(", 1)[1].split(" runtime")[0]
    return found


def check_predict(url: str, body: bytes) -> None:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        out = json.loads(r.read())
    preds = out["predictions"]
    if len(preds) != 1 or len(preds[0]) != 10:
        raise RuntimeError(f"unexpected response from {url}: {str(out)[:200]}")


# ------------------------------------------------------------------ REST load (wrk / hey)
WRK_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[%s]==]
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH_JSON {\\"requests\\":%%d,\\"duration_us\\":%%d,\\"connect\\":%%d,\\"read\\":%%d," ..
    "\\"write\\":%%d,\\"status\\":%%d,\\"timeout\\":%%d,\\"p50_us\\":%%d,\\"p99_us\\":%%d}\\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def rest_load(loadgen: str, url: str, body: bytes, concurrency: int, duration: float, workdir: Path,
              headers: tuple[str, ...] = ()) -> dict:
    """``headers``: extra "Name: value" lines (a replica of the platform wants its bearer secret)."""
    extra = [arg for h in headers for arg in ("-H", h)]
    if loadgen == "wrk":
        script = workdir / "post.lua"
        if not script.exists():
            script.write_text(WRK_LUA % body.decode())
        # One wrk thread keeps up with any server here and leaves the second core to the server.
        cmd = ["wrk", "-t1", f"-c{concurrency}", f"-d{duration:g}s", "--timeout", "10s", "-s", str(script), *extra, url]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        line = next(l for l in out.splitlines() if l.startswith("BENCH_JSON "))
        r = json.loads(line[len("BENCH_JSON "):])
        errors = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
        ok = r["requests"] - r["status"]
        secs = r["duration_us"] / 1e6
        return {"requests": ok, "rps": ok / secs, "p50_ms": r["p50_us"] / 1e3, "p99_ms": r["p99_us"] / 1e3,
                "errors": errors}
    bodyfile = workdir / "body.json"
    bodyfile.write_bytes(body)
    cmd = ["hey", "-z", f"{duration:g}s", "-c", str(concurrency), "-m", "POST", "-T", "application/json",
           "-D", str(bodyfile), "-t", "10", *extra, url]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return parse_hey(out, duration)


def parse_hey(out: str, duration: float) -> dict:
    rps = p50 = p99 = float("nan")
    ok = errors = 0
    section = ""
    for line in out.splitlines():
        s = line.strip()
        if s.startswith("Requests/sec:"):
            rps = float(s.split()[1])
        elif s.startswith("50% in"):
            p50 = float(s.split()[2]) * 1e3
        elif s.startswith("99% in"):
            p99 = float(s.split()[2]) * 1e3
        elif s.endswith("distribution:"):
            section = s
        elif s.startswith("[") and section.startswith("Status code"):
            code, n = int(s[1:s.index("]")]), int(s.split()[1])
            if 200 <= code < 300:
                ok += n
            else:
                errors += n
        elif s.startswith("[") and section.startswith("Error"):
            errors += int(s[1:s.index("]")])
    # hey's Requests/sec counts failures too; report successes only.
    total = ok + errors
    if total and rps == rps:
        rps = rps * ok / total
    return {"requests": ok, "rps": rps, "p50_ms": p50, "p99_ms": p99, "errors": errors}


# ------------------------------------------------------------------ gRPC load
PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"
METRICS_PATH = "/monitoring/prometheus/metrics"
REQUEST_COUNT = ":tensorflow:serving:request_count"


def _grpc_worker(target: str, request: bytes, inflight: int, duration: float, ready, start, results) -> None:
    """One client process: ``inflight`` concurrent calls on one grpc.aio channel, raw bytes both ways.

    asyncio tasks cost the client far less CPU per call than a thread each, which matters
    when client and server share two cores.
    """
    import asyncio

    import grpc

    async def run() -> tuple[list[float], int]:
        async with grpc.aio.insecure_channel(target) as channel:
            # Raw bytes in and out: the client costs no protobuf work per call.
            predict = channel.unary_unary(PREDICT_METHOD, request_serializer=None, response_deserializer=None)
            await predict(request, timeout=30)
            ready.put(1)
            await asyncio.get_running_loop().run_in_executor(None, start.wait)
            cpu0 = time.process_time()
            clock = time.perf_counter
            deadline = clock() + duration
            lat: list[float] = []
            errs = 0

            async def loop() -> None:
                nonlocal errs
                while True:
                    t0 = clock()
                    if t0 >= deadline:
                        return
                    try:
                        reply = await predict(request, timeout=10)
                    except grpc.RpcError:
                        errs += 1
                        continue
                    if not reply:
                        errs += 1
                        continue
                    lat.append(clock() - t0)

            await asyncio.gather(*(loop() for _ in range(inflight)))
            return lat, errs, time.process_time() - cpu0

    results.put(asyncio.run(run()))


def grpc_load(port: int, request: bytes, concurrency: int, duration: float, server: Server,
              processes: int) -> tuple[dict, float]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    nproc = max(1, min(processes, concurrency))
    split = [concurrency // nproc + (1 if i < concurrency % nproc else 0) for i in range(nproc)]
    ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_grpc_worker, args=(f"127.0.0.1:{port}", request, n, duration, ready, start, results))
             for n in split]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    cpu0, t0 = server.cpu_seconds(), time.perf_counter()
    start.set()
    gathered = [results.get(timeout=duration + 120) for _ in procs]
    elapsed = time.perf_counter() - t0
    cpu = server.cpu_seconds() - cpu0
    for p in procs:
        p.join()
    lats = sorted(x for l, _, _ in gathered for x in l)
    errors = sum(e for _, e, _ in gathered)
    client_cpu = sum(c for _, _, c in gathered)
    n = len(lats)
    return {"requests": n, "rps": n / min(elapsed, duration + 0.05) if n else 0.0,
            "p50_ms": lats[n // 2] * 1e3 if n else float("nan"),
            "p99_ms": lats[min(n - 1, int(n * 0.99))] * 1e3 if n else float("nan"),
            "errors": errors, "client_us": client_cpu / n * 1e6 if n else None}, cpu


def metric_total(rest_port: int, name: str, labels: str) -> float | None:
    """Sum of a Prometheus counter's samples whose label text contains ``labels``."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{rest_port}{METRICS_PATH}", timeout=10).read().decode()
    except OSError:
        return None
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith(name + "{") and labels in l)


def h2load_grpc_load(server: Server, request: bytes, concurrency: int, duration: float, workdir: Path) -> dict:
    """Drive gRPC unary Predict with h2load (C, nghttp2): the client costs the shared cores little.

    h2load sees HTTP/2 statuses only; a gRPC error is an HTTP 200 with a non-zero
    grpc-status trailer. Errors are therefore counted from the server's own
    request_count{status="OK"} metric against the responses h2load received.
    """
    body = workdir / "grpc_request.bin"
    body.write_bytes(b"\x00" + len(request).to_bytes(4, "big") + request)  # gRPC message framing
    logfile = workdir / "h2load.log"
    logfile.unlink(missing_ok=True)  # h2load appends to an existing log
    conns = min(concurrency, 8)  # like a few client channels, each multiplexing streams
    streams = max(1, concurrency // conns)
    label = f'model_name="{server.model}",status="OK"'
    ok0 = metric_total(server.rest_port, REQUEST_COUNT, label)
    cmd = ["h2load", "-D", f"{duration:g}", "-t1", "-c", str(conns), "-m", str(streams), "-d", str(body),
           "-H", "content-type: application/grpc", "-H", "te: trailers", "--log-file", str(logfile),
           f"http://127.0.0.1:{server.grpc_port}{PREDICT_METHOD}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    ok1 = metric_total(server.rest_port, REQUEST_COUNT, label)
    settle = time.monotonic() + 5  # worker processes publish their counts about once a second
    while ok0 is not None and ok1 is not None and time.monotonic() < settle:
        time.sleep(1.2)
        again = metric_total(server.rest_port, REQUEST_COUNT, label)
        if again == ok1:
            break
        ok1 = again
    lats, bad_http = [], 0
    for line in logfile.read_text().splitlines():
        _, status, micros = line.split("\t")
        if status == "200":
            lats.append(int(micros) / 1e3)
        else:
            bad_http += 1
    failed = next((int(l.split()[l.split().index("failed,") - 1]) for l in out.splitlines()
                   if l.startswith("requests:")), 0)
    lats.sort()
    n = len(lats)
    grpc_errors = max(0, n - int(ok1 - ok0)) if ok0 is not None and ok1 is not None else 0
    return {"requests": n - grpc_errors, "rps": (n - grpc_errors) / duration,
            "p50_ms": lats[n // 2] if n else float("nan"),
            "p99_ms": lats[min(n - 1, int(n * 0.99))] if n else float("nan"),
            "errors": bad_http + failed + grpc_errors}


# ------------------------------------------------------------------ sub-commands run in other interpreters
def cmd_prepare(args) -> None:
    """(modelyard's env) Demo model, the CNN, request bodies; prints JSON describing them."""
    import modelyard
    from modelyard.demo import demo_instances, demo_predict_body, ensure_demo_model

    out = Path(args.out)
    base = Path(ensure_demo_model(log=lambda m: log(m)))
    latest = max((d for d in base.iterdir() if d.name.isdigit()), key=lambda d: int(d.name))
    cnn_base = out / "models" / CNN_DIR
    if not any(cnn_base.glob("*/saved_model.pb")):
        log("building the CNN SavedModel (two conv blocks and a 1024-unit dense head, 1 epoch on the digits) ...")
        import tensorflow as tf

        from modelyard.datasets import load_digits_28

        keras = tf.keras
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((28, 28), dtype="uint8", name="image"),
            keras.layers.Rescaling(1 / 255.0),
            keras.layers.Reshape((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            # The dense head's 6.5 MB of weights are read once per call: per image at batch 1,
            # once per batch with batching. That, and TF's per-call cost, is what batching saves.
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(10, activation="softmax", name="probabilities"),
        ])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        x, y = load_digits_28("train")
        model.fit(x, y, epochs=1, batch_size=64, verbose=0)
        modelyard.export(model, str(cnn_base))
    cnn_latest = max((d for d in cnn_base.iterdir() if d.name.isdigit()), key=lambda d: int(d.name))

    image = demo_instances(1)
    body = demo_predict_body(1).encode()
    (out / "body.json").write_bytes(body)
    from tensorflow_serving.apis.predict_pb2 import PredictRequest
    import tensorflow as tf

    for name in (MODEL, CNN):
        req = PredictRequest()
        req.model_spec.name = name
        req.model_spec.signature_name = "serving_default"
        req.inputs["image"].CopyFrom(tf.make_tensor_proto(image))
        (out / f"grpc_{name}.bin").write_bytes(req.SerializeToString())
    print("PREPARED " + json.dumps({"base": str(base), "latest": str(latest), "cnn_base": str(cnn_base),
                                     "cnn_latest": str(cnn_latest)}), flush=True)


def cmd_ceiling(args) -> None:
    """(modelyard's env) The model call alone, one thread, batch 1, for ``args.seconds`` per runtime."""
    import numpy as np
    import tensorflow as tf

    from modelyard.demo import demo_instances

    x = np.asarray(demo_instances(1), dtype=np.uint8)
    rows = []

    def measure(runtime: str, call) -> None:
        for _ in range(50):
            call()
        lat = []
        cpu0, end = time.process_time(), time.perf_counter() + args.seconds
        while True:
            t0 = time.perf_counter()
            if t0 >= end:
                break
            call()
            lat.append(time.perf_counter() - t0)
        cpu = time.process_time() - cpu0
        lat.sort()
        n = len(lat)
        rows.append({"runtime": runtime, "requests": n, "rps": n / sum(lat), "p50_ms": lat[n // 2] * 1e3,
                     "p99_ms": lat[int(n * 0.99)] * 1e3, "errors": 0, "cpu_us": cpu / n * 1e6})

    # TF Serving's way: a Session callable through the SignatureDef.
    graph = tf.Graph()
    with graph.as_default():
        sess = tf.compat.v1.Session(graph=graph)
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], args.model_dir)
        sig = meta.signature_def["serving_default"]
        feed = graph.get_tensor_by_name(sig.inputs["image"].name)
        fetch = graph.get_tensor_by_name(sig.outputs["probabilities"].name)
        fn = sess.make_callable(fetch, [feed])
    measure("tensorflow (Session callable)", lambda: fn(x))
    # What the hand-written peers call: the TF2 signature function.
    loaded = tf.saved_model.load(args.model_dir)
    infer = loaded.signatures["serving_default"]
    measure("tensorflow (TF2 signature fn)", lambda: infer(image=tf.constant(x))["probabilities"].numpy())
    # LiteRT: the same SavedModel converted, one interpreter, set/invoke/get.
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=tf.lite.TFLiteConverter.from_saved_model(args.model_dir).convert(),
                         num_threads=1)
    interp.allocate_tensors()
    i_idx = interp.get_input_details()[0]["index"]
    o_idx = interp.get_output_details()[0]["index"]

    def litert_call():
        interp.set_tensor(i_idx, x)
        interp.invoke()
        return interp.get_tensor(o_idx)

    measure("litert (invoke)", litert_call)
    print("CEILING " + json.dumps(rows), flush=True)


def cmd_plot(args) -> None:
    """(plot venv) Two panels, req/s and p99 against concurrency, one line per server/protocol/runtime."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = json.loads(Path(args.data).read_text())
    series: dict[str, list] = {}
    for r in rows:
        if r.get("scenario") != "digits" or r["server"] == "in-process ceiling" or r.get("rps") is None:
            continue
        series.setdefault(f"{r['server']} {r['protocol']} ({r['runtime']})", []).append(r)
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=80)
    for label, rs in series.items():
        rs.sort(key=lambda r: r["concurrency"])
        cs = [r["concurrency"] for r in rs]
        a.plot(cs, [r["rps"] for r in rs], marker="o", label=label)
        b.plot(cs, [r["p99_ms"] for r in rs], marker="o", label=label)
    for ax, title in ((a, "throughput (req/s)"), (b, "p99 latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    b.set_yscale("log")
    a.legend(fontsize=7)
    fig.suptitle("digits model, batch-1 requests, 2-core machine", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=80)


# ------------------------------------------------------------------ the benchmark
def fmt(v, digits=1) -> str:
    if v is None or v != v:
        return "n/a"
    return f"{v:,.{digits}f}"


def run_rest_series(server: Server, body: bytes, concs, duration, loadgen, workdir, base_row) -> list[dict]:
    rows = []
    for c in concs:
        cpu0, gen0 = server.cpu_seconds(), children_cpu_seconds()
        r = rest_load(loadgen, server.url, body, c, duration, workdir)
        cpu = server.cpu_seconds() - cpu0
        r["client_us"] = (children_cpu_seconds() - gen0) / r["requests"] * 1e6 if r["requests"] else None
        row = dict(base_row, concurrency=c, **r, cpu_us=cpu / r["requests"] * 1e6 if r["requests"] else None)
        rows.append(row)
        log(f"  {row['server']} {row['protocol']} c={c}: {row['rps']:,.0f} req/s, p50 {row['p50_ms']:.2f} ms, "
            f"p99 {row['p99_ms']:.2f} ms, {row['errors']} errors, {fmt(row['cpu_us'], 0)} µs CPU/req")
    return rows


def run_grpc_series(server: Server, request: bytes, concs, duration, processes, base_row, loadgen: str,
                    workdir: Path) -> list[dict]:
    rows = []
    for c in concs:
        if loadgen == "h2load":
            cpu0, gen0 = server.cpu_seconds(), children_cpu_seconds()
            r = h2load_grpc_load(server, request, c, duration, workdir)
            cpu = server.cpu_seconds() - cpu0
            r["client_us"] = (children_cpu_seconds() - gen0) / r["requests"] * 1e6 if r["requests"] else None
        else:
            r, cpu = grpc_load(server.grpc_port, request, c, duration, server, processes)
        row = dict(base_row, concurrency=c, **r, cpu_us=cpu / r["requests"] * 1e6 if r["requests"] else None)
        rows.append(row)
        log(f"  {row['server']} gRPC c={c}: {row['rps']:,.0f} req/s, p50 {row['p50_ms']:.2f} ms, "
            f"p99 {row['p99_ms']:.2f} ms, {row['errors']} errors, {fmt(row['cpu_us'], 0)} µs CPU/req")
    return rows


PAIRED = " (REST and gRPC taking turns)"  # the server label's suffix on paired_runs' rows


def paired_runs(server: Server, body: bytes, grpc_request: bytes, args, seconds: float, work: Path,
                base_row: dict) -> list[dict]:
    """REST and gRPC at c=32 taking turns, ``--pair-rounds`` runs each: their median runs.

    This machine's speed drifts by ±15% within minutes, more than REST and gRPC differ, so the
    gRPC ≥ REST target compares medians of interleaved runs rather than two single runs.
    """
    if not args.pair_rounds:
        return []
    def one_run(protocol: str, _round: int) -> dict:
        if protocol == "REST":
            return run_rest_series(server, body, [32], seconds, args.loadgen, work, base_row)[0]
        return run_grpc_series(server, grpc_request, [32], seconds, args.grpc_processes,
                               dict(base_row, protocol="gRPC"), args.grpc_loadgen, work)[0]

    runs = take_turns(["REST", "gRPC"], args.pair_rounds, one_run, report=lambda *_: None)
    return [dict(median_run(runs[protocol]), server=base_row["server"] + PAIRED) for protocol in ("REST", "gRPC")]


def median_run(runs: list[dict]) -> dict:
    """The run with the median req/s (the lower middle one for an even count), its errors summed
    over all runs, and every run's req/s."""
    ordered = sorted(runs, key=lambda r: r["rps"])
    row = dict(ordered[(len(ordered) - 1) // 2])
    row["errors"] = sum(r["errors"] for r in runs)
    row["rounds_rps"] = [round(r["rps"]) for r in runs]
    return row


def warm(server: Server, body: bytes, loadgen: str, workdir: Path, seconds: float) -> None:
    check_predict(server.url, body)
    rest_load(loadgen, server.url, body, 8, seconds, workdir)


def modelyard_cmd(model: str, base: str, grpc_port: int, rest_port: int, extra: list[str]) -> list[str]:
    exe = shutil.which("modelyard")
    head = [exe] if exe else [sys.executable, "-m", "modelyard"]
    # Metrics on (as in production) so the gRPC rows can count errors from request_count.
    monitoring = CACHE / "run" / "monitoring.config"
    monitoring.parent.mkdir(parents=True, exist_ok=True)
    monitoring.write_text(f'prometheus_config {{ enable: true, path: "{METRICS_PATH}" }}\n')
    return head + ["serve", "--model_name", model, "--model_base_path", base, "--port", str(grpc_port),
                   "--rest_api_port", str(rest_port), "--host", "127.0.0.1",
                   "--monitoring_config_file", str(monitoring), *extra]


def serve_help() -> str:
    exe = shutil.which("modelyard")
    head = [exe] if exe else [sys.executable, "-m", "modelyard"]
    return subprocess.run(head + ["serve", "--help"], capture_output=True, text=True, env=ENV).stdout


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: 2 s per run, concurrency 1 and 32 (64 for batching)")
    p.add_argument("--duration", type=float, help="seconds per run (default 10; 2 with --quick)")
    p.add_argument("--concurrency", help="comma-separated concurrencies (default 1,8,32,128)")
    p.add_argument("--modelyard-args", default="", help='extra `modelyard serve` flags, e.g. "--workers 2 --runtime auto"')
    p.add_argument("--workers-variant", type=int, default=os.cpu_count() or 1,
                   help="also run modelyard with --workers N (default: the core count; 0: skip)")
    p.add_argument("--loadgen", choices=("wrk", "hey"), default="wrk", help="REST load generator (default wrk)")
    p.add_argument("--grpc-loadgen", choices=("h2load", "python"), default="h2load",
                   help="gRPC load generator: h2load (C, Debian's nghttp2-client; default) or Python grpc.aio processes")
    p.add_argument("--grpc-processes", type=int, default=2, help="with --grpc-loadgen python: client processes (default 2)")
    p.add_argument("--peer-runtime", choices=("match", "tensorflow", "litert", "both"), default="match",
                   help="runtime of the peers: match modelyard's (default), one, or both")
    p.add_argument("--peer-workers", type=int, default=1, help="server processes for each peer (default 1, their default)")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: kserve,fastapi,grpc,batching,ceiling")
    p.add_argument("--batching-parameters-file", help="BatchingParameters text file (default: a built-in one)")
    p.add_argument("--batching-concurrency", type=int, default=64)
    p.add_argument("--cnn-rounds", type=int, default=5,
                   help="CNN runs per server and protocol, batched and unbatched taking turns; the table "
                   "reports the median run (default 5, each half of --duration: single runs swing by "
                   "±10%% on this shared machine, and the batching target is a ratio of two of them)")
    p.add_argument("--pair-rounds", type=int, default=3,
                   help="digits, c=32: REST and gRPC runs taking turns for the gRPC ≥ REST target, each half of "
                   "--duration (default 3 each; 0: compare the series' single runs)")
    p.add_argument("--cnn-args", default="--runtime tensorflow",
                   help="extra `modelyard serve` flags for both CNN runs, batched and not (default: --runtime "
                   "tensorflow, TF Serving's runtime, whose per-call cost batching amortizes)")
    p.add_argument("--out", default=str(RESULTS), help="directory for serving.md and serving.png")
    p.add_argument("--v2", action="store_true",
                   help="only the Open Inference Protocol run (bench/serving_v2.py): V2 vs TF Serving's API on one "
                        "modelyard serve and vs KServe's V2 server; writes serving_v2.md")
    p.add_argument("--v2-rounds", type=int, default=3, help="with --v2: rounds taking turns (default 3)")
    p.add_argument("--v2-workdir", default=str(CACHE / "v2"), help="with --v2: models, bodies and logs")
    p.add_argument("--kserve-python", help="with --v2: the Python of a venv with kserve 0.21 and ai-edge-litert "
                                           "(default: one made under the cache dir)")
    args = p.parse_args(argv)
    if args.v2:
        import serving_v2

        if not args.kserve_python and "kserve" not in args.skip:
            args.kserve_python = str(ensure_venv("kserve_v2"))
        return serving_v2.run(args, Path(args.out))

    duration = args.duration or (2.0 if args.quick else 10.0)
    half_duration = max(2.0, duration / 2)
    concs = [int(c) for c in args.concurrency.split(",")] if args.concurrency else ([1, 32] if args.quick else [1, 8, 32, 128])
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    my_args = shlex.split(args.modelyard_args)
    warm_s = 1.0 if args.quick else 2.0
    ensure_tool(args.loadgen)
    if args.grpc_loadgen == "h2load" and "grpc" not in skip:
        ensure_tool("h2load", package="nghttp2-client")
    help_text = serve_help()
    for flag in my_args:
        if flag.startswith("--") and flag.split("=")[0] not in help_text:
            sys.exit(f"`modelyard serve` has no flag {flag.split('=')[0]} (see `modelyard serve --help`)")
    has_batching = "--enable_batching" in help_text and "--batching_parameters_file" in help_text

    work = CACHE / "run"
    work.mkdir(parents=True, exist_ok=True)
    for f in work.glob("*.lua"):
        f.unlink()
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    started = time.time()
    machine_line = machine()  # at the start: the load figure is the machine's before the runs

    log("preparing models and requests ...")
    prep = subprocess.run([sys.executable, __file__, "_prepare", "--out", str(work)], env=ENV,
                          capture_output=True, text=True)
    if prep.returncode:
        sys.exit(prep.stdout + prep.stderr)
    info = json.loads(next(l for l in prep.stdout.splitlines() if l.startswith("PREPARED "))[9:])
    body = (work / "body.json").read_bytes()
    grpc_req = {m: (work / f"grpc_{m}.bin").read_bytes() for m in (MODEL, CNN)}
    rows: list[dict] = []
    peer_py = {}
    for name in ("kserve", "fastapi"):
        if name not in skip:
            peer_py[name] = ensure_venv(name)

    # --- modelyard, REST then gRPC: as started by default, then with a worker process per core
    variants = [("modelyard", my_args)]
    if args.workers_variant and not any(a.startswith("--workers") for a in my_args):
        variants.append((f"modelyard, {args.workers_variant} workers", my_args + ["--workers", str(args.workers_variant)]))
    runtime = "?"
    for label, flags in variants:
        grpc_port, rest_port = free_port(), free_port()
        my = Server(label, modelyard_cmd(MODEL, info["base"], grpc_port, rest_port, flags), rest_port, MODEL,
                    logs / f"{label.replace(', ', '-').replace(' ', '-')}.log", cwd=REPO, grpc_port=grpc_port)
        my.start()
        try:
            runtime = modelyard_runtime(my, MODEL)
            warm(my, body, args.loadgen, work, warm_s)
            base_row = {"scenario": "digits", "server": label, "runtime": runtime, "protocol": "REST"}
            rows += run_rest_series(my, body, concs, duration, args.loadgen, work, base_row)
            if "grpc" not in skip:
                rows += run_grpc_series(my, grpc_req[MODEL], concs, duration, args.grpc_processes,
                                        dict(base_row, protocol="gRPC"), args.grpc_loadgen, work)
                rows += paired_runs(my, body, grpc_req[MODEL], args, half_duration, work,
                                    dict(base_row, scenario="digits-pair"))
        finally:
            my.stop()

    # --- peers
    peer_runtimes = {"match": ["litert" if runtime == "litert" else "tensorflow"], "both": ["litert", "tensorflow"]}.get(
        args.peer_runtime, [args.peer_runtime])
    for name, py in peer_py.items():
        for prt in peer_runtimes:
            port = free_port()
            if name == "kserve":
                cmd = [str(py), str(PEERS / "kserve_model.py"), "--model_name", MODEL, "--model_dir", info["latest"],
                       "--runtime", prt, "--http_port", str(port), "--grpc_port", str(free_port()),
                       "--workers", str(args.peer_workers),
                       # KServe logs a latency line per request by default; off, to be fair to it.
                       "--enable_latency_logging", "False"]
                env = ENV
            else:
                cmd = [str(py), "-m", "uvicorn", "fastapi_app:app", "--host", "127.0.0.1", "--port", str(port),
                       "--workers", str(args.peer_workers), "--log-level", "warning", "--no-access-log"]
                env = dict(ENV, MODEL_DIR=info["latest"], RUNTIME=prt)
            srv = Server(name, cmd, port, MODEL, logs / f"{name}-{prt}.log", env=env, cwd=PEERS)
            try:
                srv.start()
                warm(srv, body, args.loadgen, work, warm_s)
                rows += run_rest_series(srv, body, concs, duration, args.loadgen, work,
                                        {"scenario": "digits", "server": "KServe" if name == "kserve" else "FastAPI+TF",
                                         "runtime": prt, "protocol": "REST"})
            except Exception as e:  # a peer failing must not lose modelyard's numbers
                log(f"{name} ({prt}) failed: {e}")
                rows.append({"scenario": "digits", "server": name, "runtime": prt, "protocol": "REST",
                             "concurrency": None, "note": f"failed: {str(e).splitlines()[0][:120]}"})
            finally:
                srv.stop()

    # --- in-process ceiling
    if "ceiling" not in skip:
        log("in-process ceiling (the model call alone) ...")
        out = subprocess.run([sys.executable, __file__, "_ceiling", "--model-dir", info["latest"],
                              "--seconds", str(min(duration, 5.0))], env=ENV, capture_output=True, text=True)
        line = next((l for l in out.stdout.splitlines() if l.startswith("CEILING ")), None)
        if line:
            for r in json.loads(line[8:]):
                rows.append(dict(r, scenario="digits", server="in-process ceiling", protocol="-", concurrency=1))
                log(f"  ceiling {r['runtime']}: {r['rps']:,.0f} calls/s, p50 {r['p50_ms'] * 1e3:.1f} µs")
        else:
            log("ceiling failed:\n" + out.stderr[-2000:])

    # --- batching on the CNN: REST and gRPC, with and without batching, under each of CNN_THREADS
    if "batching" not in skip:
        bc = args.batching_concurrency
        batch_flags = {"no batching": []}
        if has_batching:
            bfile = Path(args.batching_parameters_file) if args.batching_parameters_file else work / "batching.config"
            if not args.batching_parameters_file:
                bfile.write_text(DEFAULT_BATCHING)
            batch_flags["batching"] = ["--enable_batching", "--batching_parameters_file", str(bfile)]
        for threads, thread_flags in CNN_THREADS.items():
            # Both servers of a thread setting run side by side (an idle one costs nothing) and
            # take turns under load, so slow spells of a shared machine hit both alike.
            servers = {}
            try:
                for label, flags in batch_flags.items():
                    gp, rp = free_port(), free_port()
                    cmd = modelyard_cmd(CNN, info["cnn_base"], gp, rp,
                                        my_args + shlex.split(args.cnn_args) + thread_flags + flags)
                    srv = servers[label] = Server(f"modelyard ({label}, {threads})", cmd, rp, CNN,
                                                  logs / f"cnn-{slug(label)}-{slug(threads)}.log", cwd=REPO,
                                                  grpc_port=gp)
                    srv.start()
                    warm(srv, body, args.loadgen, work, warm_s)
                base_rows = {label: {"scenario": "cnn", "server": f"modelyard, {label}", "threads": threads,
                                     "runtime": modelyard_runtime(srv, CNN)} for label, srv in servers.items()}
                protocols = ["REST"] + ([] if "grpc" in skip else ["gRPC"])
                for protocol in protocols:
                    def one_run(label: str, _round: int) -> dict:
                        row = dict(base_rows[label], protocol=protocol)
                        if protocol == "REST":
                            return run_rest_series(servers[label], body, [bc], half_duration, args.loadgen, work,
                                                   row)[0]
                        return run_grpc_series(servers[label], grpc_req[CNN], [bc], half_duration,
                                               args.grpc_processes, row, args.grpc_loadgen, work)[0]

                    runs = take_turns(list(servers), args.cnn_rounds, one_run, report=lambda *_: None)
                    rows += [median_run(r) for r in runs.values()]
            finally:
                for srv in servers.values():
                    srv.stop()
        if not has_batching:
            rows.append({"scenario": "cnn", "server": "modelyard, batching", "runtime": "-", "protocol": "REST",
                         "concurrency": bc, "note": "not available: `modelyard serve` has no --enable_batching yet"})

    versions = {
        "python": platform.python_version(),
        "tensorflow": pkg_version(sys.executable, "tensorflow-cpu") if pkg_version(sys.executable, "tensorflow-cpu") != "?" else pkg_version(sys.executable, "tensorflow"),
        "ai-edge-litert": pkg_version(sys.executable, "ai-edge-litert"),
    }
    if "kserve" in peer_py:
        versions["kserve"] = pkg_version(peer_py["kserve"], "kserve")
    if "fastapi" in peer_py:
        versions["fastapi"] = pkg_version(peer_py["fastapi"], "fastapi")
        versions["uvicorn"] = pkg_version(peer_py["fastapi"], "uvicorn")
    loadgen_version = subprocess.run([args.loadgen, "-v"] if args.loadgen == "wrk" else ["true"], capture_output=True,
                                     text=True).stdout.splitlines()[:1]
    meta = {"machine": machine_line, "duration": duration, "concs": concs, "modelyard_args": args.modelyard_args, "loadgen": args.loadgen,
            "loadgen_version": loadgen_version[0] if loadgen_version else args.loadgen,
            "grpc_processes": args.grpc_processes, "grpc_loadgen": args.grpc_loadgen, "peer_workers": args.peer_workers, "versions": versions,
            "elapsed_min": (time.time() - started) / 60, "quick": args.quick, "has_batching": has_batching,
            "model_version": Path(info["latest"]).name, "cnn_args": args.cnn_args,
            "batching_concurrency": args.batching_concurrency, "cnn_rounds": args.cnn_rounds,
            "cnn_duration": half_duration, "pair_rounds": args.pair_rounds,
            "batching": (Path(args.batching_parameters_file).read_text() if args.batching_parameters_file
                         else DEFAULT_BATCHING)}
    out_dir = Path(args.out)
    md = report(rows, meta)
    write_results("serving", md, out_dir)
    data = work / "rows.json"
    data.write_text(json.dumps(rows))
    try:
        plot_py = ensure_venv("plot")
        subprocess.run([str(plot_py), __file__, "_plot", "--data", str(data), "--out", str(out_dir / "serving.png")],
                       check=True)
        log(f"wrote {out_dir / 'serving.md'} and {out_dir / 'serving.png'}")
    except Exception as e:
        log(f"plot failed ({e}); wrote {out_dir / 'serving.md'}")
    return 0


def find(rows, **kw) -> dict | None:
    for r in rows:
        if all(r.get(k) == v for k, v in kw.items()) and r.get("rps") is not None:
            return r
    return None


def verdict(ok) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def _thread_settings() -> str:
    return "; ".join(f"{name}: `{' '.join(flags)}`" if flags else name for name, flags in CNN_THREADS.items())


def cnn_targets(rows: list[dict], meta: dict) -> list[str]:
    """Batching's two targets, per protocol: the best batched setting against the best unbatched one
    (each row the median of its runs)."""
    lines = []
    for protocol in ("REST", "gRPC"):
        runs = [r for r in rows if r.get("scenario") == "cnn" and r.get("protocol") == protocol and r.get("rps")]
        unbatched = [r for r in runs if r["server"] == "modelyard, no batching"]
        batched = [r for r in runs if r["server"] == "modelyard, batching"]
        if not unbatched or not batched:
            why = "not available (no --enable_batching in `modelyard serve`)" if not meta["has_batching"] else "not measured"
            lines.append(f"| CNN, {protocol}: batching ≥ 2× unbatched req/s, p99 ≤ 2× | {why} | n/a |")
            continue
        nb = max(unbatched, key=lambda r: r["rps"])
        b = max(batched, key=lambda r: r["rps"])
        same = {r["threads"]: r for r in unbatched}
        per_setting = ", ".join(f"{r['threads']}: {r['rps'] / same[r['threads']]['rps']:.2f}×"
                                for r in batched if r["threads"] in same)
        lines.append(f"| CNN, {protocol}, c={nb['concurrency']}: best batched ≥ 2× best unbatched req/s | "
                     f"{b['rps']:,.0f} ({b['threads']}) vs {nb['rps']:,.0f} ({nb['threads']}) = "
                     f"{b['rps'] / nb['rps']:.2f}× (same thread setting: {per_setting}) | "
                     f"{verdict(b['rps'] >= 2 * nb['rps'] and b['errors'] == 0)} |")
        lines.append(f"| CNN, {protocol}, c={nb['concurrency']}: batched p99 ≤ 2× unbatched p99 (same two runs) | "
                     f"{b['p99_ms']:.2f} vs {nb['p99_ms']:.2f} ms = {b['p99_ms'] / nb['p99_ms']:.2f}× | "
                     f"{verdict(b['p99_ms'] <= 2 * nb['p99_ms'])} |")
    return lines


def report(rows: list[dict], meta: dict) -> str:
    v = meta["versions"]
    lines = [
        "# Serving benchmark",
        "",
        f"`python3 bench/serving.py{' --quick' if meta['quick'] else ''}"
        f"{' --modelyard-args ' + shlex.quote(meta['modelyard_args']) if meta['modelyard_args'] else ''}` on "
        f"{meta['machine']}; "
        f"TensorFlow {v['tensorflow']}, ai-edge-litert {v['ai-edge-litert']}"
        + (f", KServe {v['kserve']}" if "kserve" in v else "")
        + (f", FastAPI {v['fastapi']} on uvicorn {v['uvicorn']}" if "fastapi" in v else "") + ".",
        "",
        f"Each run: {meta['duration']:g} s, one batch-1 28×28 uint8 image per request, the demo digits model "
        f"(`{MODEL}` version {meta['model_version']}) unless marked CNN. REST load: `{meta['loadgen_version']}`, "
        f"one thread; gRPC load: " + (
            "`h2load` (nghttp2, C), one thread, min(concurrency, 8) connections with the concurrent streams split "
            "across them, a pre-serialized PredictRequest; gRPC errors counted from the server's request_count "
            "metric" if meta.get("grpc_loadgen") == "h2load" else
            f"{meta['grpc_processes']} Python client processes, one grpc.aio channel each, "
            "concurrent calls split across them, pre-serialized PredictRequest") + ". Servers run one at a time, on the same 2 cores as the "
        f"load generator. Peers run {meta['peer_workers']} process(es) (their default). Server CPU is utime+stime of "
        f"the server and its children over the run, per answered request. The in-process ceiling is the model "
        f"call alone in a loop (one thread, no server): its req/s is calls/s. Load-gen CPU is the load "
        f"generator's CPU per request (wrk's whole run; the gRPC clients' measured window): on 2 shared cores, "
        f"CPU the client takes is CPU the server cannot use. The CNN rows run `modelyard serve "
        f"{meta.get('cnn_args', '')}` with and without `--enable_batching` (parameters below), under each "
        f"thread setting ({_thread_settings()}), over REST and gRPC at concurrency "
        f"{meta.get('batching_concurrency', 64)}. The batched and unbatched servers of a setting run side by "
        f"side and take turns, {meta.get('cnn_rounds', 1)} runs of {meta.get('cnn_duration', meta['duration']):g} s "
        f"each; a CNN row is the median run (its errors summed over all runs), every run's req/s in brackets. "
        f"Likewise the gRPC ≥ REST target compares REST and gRPC at c=32 taking turns, "
        f"{meta.get('pair_rounds', 0)} runs each (the rows marked so), not the single runs of the series.",
        "",
        "| server | protocol | runtime | concurrency | req/s | p50 ms | p99 ms | errors "
        "| server CPU µs/req (= ms per 1000 req) | load-gen CPU µs/req |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        server = r["server"] + (f" (CNN, {r['threads']})" if r.get("scenario") == "cnn" else "")
        if r.get("rounds_rps"):
            server += " [" + ", ".join(f"{v:,}" for v in r["rounds_rps"]) + "]"
        if r.get("rps") is None:
            lines.append(f"| {server} | {r['protocol']} | {r['runtime']} | {r.get('concurrency') or '-'} | "
                         f"{r.get('note', 'n/a')} | | | | | |")
            continue
        p50_digits = 3 if r["p50_ms"] < 1 else 2
        lines.append(f"| {server} | {r['protocol']} | {r['runtime']} | {r['concurrency']} | {r['rps']:,.0f} | "
                     f"{r['p50_ms']:.{p50_digits}f} | {r['p99_ms']:.{3 if r['p99_ms'] < 1 else 2}f} | {r['errors']} | "
                     f"{fmt(r.get('cpu_us'), 0)} | {fmt(r.get('client_us'), 0) if r.get('protocol') != '-' else '-'} |")
    lines += ["", "## Targets (issue 3, \"Serving at speed\")", "",
              "| target | measured | result |", "| --- | --- | --- |"]

    labels = []
    for r in rows:
        if r.get("scenario") == "digits" and r["server"].startswith("modelyard") and r["server"] not in labels:
            labels.append(r["server"])
    for label in labels or ["modelyard"]:
        tag = f" [{label}]"
        my32 = find(rows, scenario="digits", server=label, protocol="REST", concurrency=32)
        ks32 = None
        if my32:
            ks32 = find(rows, scenario="digits", server="KServe", concurrency=32, runtime=my32["runtime"]) or \
                find(rows, scenario="digits", server="KServe", concurrency=32)
        if my32 and ks32:
            ratio = my32["rps"] / ks32["rps"]
            lines.append(f"| REST, digits, c=32: ≥ 3× KServe's req/s, zero errors{tag} | {my32['rps']:,.0f} vs "
                         f"{ks32['rps']:,.0f} ({ks32['runtime']}) = {ratio:.2f}×, {my32['errors']} errors | "
                         f"{verdict(ratio >= 3 and my32['errors'] == 0)} |")
        else:
            lines.append(f"| REST, digits, c=32: ≥ 3× KServe's req/s, zero errors{tag} | not measured | n/a |")
        my8 = find(rows, scenario="digits", server=label, protocol="REST", concurrency=8)
        lines.append(f"| REST p99 at c=8 ≤ 10 ms{tag} | {fmt(my8['p99_ms'], 2) + ' ms' if my8 else 'not measured'} | "
                     f"{verdict(my8['p99_ms'] <= 10 if my8 else None)} |")
        g32 = find(rows, scenario="digits", server=label, protocol="gRPC", concurrency=32)
        paired = label + PAIRED
        pr32 = find(rows, scenario="digits-pair", server=paired, protocol="REST", concurrency=32)
        pg32 = find(rows, scenario="digits-pair", server=paired, protocol="gRPC", concurrency=32)
        if pr32 and pg32:
            lines.append(f"| gRPC req/s ≥ REST req/s (c=32){tag} | medians of {len(pg32['rounds_rps'])} runs "
                         f"each, taking turns: {pg32['rps']:,.0f} vs {pr32['rps']:,.0f} = "
                         f"{pg32['rps'] / pr32['rps']:.2f}× | {verdict(pg32['rps'] >= pr32['rps'])} |")
        elif my32 and g32:
            others = []
            for c in meta["concs"]:
                g = find(rows, scenario="digits", server=label, protocol="gRPC", concurrency=c)
                rr = find(rows, scenario="digits", server=label, protocol="REST", concurrency=c)
                if g and rr and c != 32:
                    others.append(f"c={c}: {g['rps'] / rr['rps']:.2f}×")
            lines.append(f"| gRPC req/s ≥ REST req/s (c=32){tag} | {g32['rps']:,.0f} vs {my32['rps']:,.0f} = "
                         f"{g32['rps'] / my32['rps']:.2f}×{' (' + ', '.join(others) + ')' if others else ''} | "
                         f"{verdict(g32['rps'] >= my32['rps'])} |")
        else:
            lines.append(f"| gRPC req/s ≥ REST req/s (c=32){tag} | not measured | n/a |")
        lines.append(f"| server CPU ≤ 150 µs per REST request at c=32{tag} | "
                     f"{fmt(my32.get('cpu_us'), 0) + ' µs' if my32 else 'not measured'} | "
                     f"{verdict(my32['cpu_us'] <= 150 if my32 and my32.get('cpu_us') else None)} |")
    lines += cnn_targets(rows, meta)
    lines += ["", "Notes:", "",
              "- gRPC: the load comes from h2load (C) unless `--grpc-loadgen python`, so the client takes little "
              "of the two shared cores; the server CPU column is what one gRPC call costs the server.",
              "- Workers: `--workers 2` shares the ports between two processes. With the load generator on the "
              "same two cores, three busy processes contend for two cores, which shows in the p99 column; "
              "`--workers` stays 1 by default.",
              "- Batching parameters: " + meta.get("batching", "").replace("\n", "; ").strip("; ") + ".",
              "", f"Whole run: {meta['elapsed_min']:.1f} min. Plot: `serving.png`.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        sub = argparse.ArgumentParser()
        sub.add_argument("cmd")
        sub.add_argument("--out")
        sub.add_argument("--model-dir")
        sub.add_argument("--seconds", type=float, default=5.0)
        sub.add_argument("--data")
        a = sub.parse_args()
        {"_prepare": cmd_prepare, "_ceiling": cmd_ceiling, "_plot": cmd_plot}[a.cmd](a)
        sys.exit(0)
    sys.exit(main())
