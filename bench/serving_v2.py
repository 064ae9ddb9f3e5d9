"""The Open Inference Protocol (KServe V2) beside TF Serving's API on one ``modelyard serve``, and
against KServe's own Python model server (issue 30's targets). Run through bench/serving.py:

    python3 bench/serving.py --v2                      # writes bench/results/serving_v2.md
    python3 bench/serving.py --v2 --quick              # smoke run: 3 s per run, one round

Sides, at c=32 (the 224x224x3 pair at c=8), taking turns (harness.take_turns; the order reverses every round, and each
server runs alone: modelyard's sides share one server, KServe runs on its own in its turn):
  - the digits model (uint8 [1,28,28], LiteRT): TF Serving REST ``:predict`` vs V2 REST JSON,
    TF Serving gRPC ``Predict`` vs V2 gRPC ``ModelInfer`` (raw_input_contents);
  - a 224x224x3 float32 input (global pooling + dense, LiteRT): V2 REST binary vs V2 REST JSON;
  - KServe 0.21's Python server (V2 REST JSON, the same digits model as a .tflite on LiteRT).
REST load is wrk (one thread), gRPC load h2load, both reading pre-built bodies. KServe runs from
its own virtualenv (``--kserve-python``; its pins differ from modelyard's).
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from harness import Service, ensure_tool, http_ok, log, machine, markdown_table, take_turns, write_results
from modelyard.ports import free_ports

ROOT = Path(__file__).resolve().parent
MODEL = "my_mnist_model"
IMAGE = "image224"
CONCURRENCY = 32
# The 224x224x3 pair: 2.9 MB JSON bodies; 8 in flight keep both cores busy without a backlog of seconds.
IMAGE_CONCURRENCY = 8
TFS_PREDICT = "/tensorflow.serving.PredictionService/Predict"
V2_INFER = "/inference.GRPCInferenceService/ModelInfer"

WRK_LUA = """
wrk.method = "POST"
local f = io.open("%(body)s", "rb")
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "%(ctype)s"
%(extra)s
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH_JSON {\\"requests\\":%%d,\\"duration_us\\":%%d,\\"errors\\":%%d,\\"status\\":%%d," ..
    "\\"p50_us\\":%%d,\\"p99_us\\":%%d}\\n", summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout, e.status, latency:percentile(50), latency:percentile(99)))
end
"""


# ------------------------------------------------------------------ models and bodies
def prepare(work: Path) -> dict:
    """The digits model (and its .tflite for KServe), the 224x224x3 model, every request body."""
    import numpy as np

    import modelyard
    from modelyard.demo import demo_instances, demo_predict_body, ensure_demo_model

    import tensorflow as tf
    from tensorflow_serving.apis.predict_pb2 import PredictRequest
    from tritonclient.grpc import service_pb2

    base = Path(ensure_demo_model(log=log))
    latest = max((d for d in base.iterdir() if d.name.isdigit()), key=lambda d: int(d.name))
    tflite = work / "digits.tflite"
    if not tflite.exists():
        tflite.write_bytes(tf.lite.TFLiteConverter.from_saved_model(str(latest)).convert())
    image_base = work / "models" / IMAGE
    if not any(image_base.glob("*/saved_model.pb")):
        keras = tf.keras
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((224, 224, 3), name="pixels"), keras.layers.GlobalAveragePooling2D(),
                                  keras.layers.Dense(10, activation="softmax", name="scores")])
        modelyard.export(model, str(image_base))
    bodies = work / "bodies"
    bodies.mkdir(parents=True, exist_ok=True)
    digit = demo_instances(1)
    (bodies / "tfs.json").write_bytes(demo_predict_body(1).encode())
    v2_digit = {"inputs": [{"name": "image", "shape": [1, 28, 28], "datatype": "UINT8",
                            "data": digit.ravel().tolist()}]}
    (bodies / "v2_digits.json").write_bytes(json.dumps(v2_digit, separators=(",", ":")).encode())
    pixels = np.random.default_rng(0).random((1, 224, 224, 3), dtype=np.float32)
    pixel_json = {"inputs": [{"name": "pixels", "shape": [1, 224, 224, 3], "datatype": "FP32",
                              "data": pixels.ravel().tolist()}]}
    (bodies / "v2_224.json").write_bytes(json.dumps(pixel_json, separators=(",", ":")).encode())
    head = json.dumps({"inputs": [{"name": "pixels", "shape": [1, 224, 224, 3], "datatype": "FP32",
                                   "parameters": {"binary_data_size": pixels.nbytes}}]},
                      separators=(",", ":")).encode()
    (bodies / "v2_224.bin").write_bytes(head + pixels.tobytes())
    req = PredictRequest()
    req.model_spec.name = MODEL
    req.model_spec.signature_name = "serving_default"
    req.inputs["image"].CopyFrom(tf.make_tensor_proto(digit))
    _grpc_frame(bodies / "tfs_grpc.bin", req.SerializeToString())
    infer = service_pb2.ModelInferRequest(model_name=MODEL)
    infer.inputs.add(name="image", datatype="UINT8", shape=[1, 28, 28])
    infer.raw_input_contents.append(digit.tobytes())
    _grpc_frame(bodies / "v2_grpc.bin", infer.SerializeToString())
    return {"base": str(base), "image_base": str(image_base), "tflite": str(tflite), "bodies": bodies,
            "binary_header": len(head)}


def _grpc_frame(path: Path, message: bytes) -> None:
    path.write_bytes(b"\x00" + len(message).to_bytes(4, "big") + message)


# ------------------------------------------------------------------ load
def wrk(url: str, body: Path, seconds: float, work: Path, ctype: str = "application/json",
        header_length: int | None = None, concurrency: int = CONCURRENCY) -> dict:
    extra = f'wrk.headers["Inference-Header-Content-Length"] = "{header_length}"' if header_length else ""
    script = work / f"{body.stem}-{header_length or 0}.lua"
    script.write_text(WRK_LUA % {"body": body, "ctype": ctype, "extra": extra})
    out = subprocess.run(["wrk", "-t1", f"-c{concurrency}", f"-d{seconds:g}s", "--timeout", "10s", "-s", str(script),
                          url], capture_output=True, text=True, check=True).stdout
    r = json.loads(next(l for l in out.splitlines() if l.startswith("BENCH_JSON "))[len("BENCH_JSON "):])
    ok = r["requests"] - r["status"]
    return {"rps": ok / (r["duration_us"] / 1e6), "p50_ms": r["p50_us"] / 1e3, "p99_ms": r["p99_us"] / 1e3,
            "errors": r["errors"] + r["status"]}


def h2load(port: int, method: str, body: Path, seconds: float, work: Path) -> dict:
    """gRPC unary calls by h2load; a gRPC error is an HTTP 200 whose trailer says so, so the answers
    are checked by the servers' own counters (``ok_delta``) where the caller has one."""
    logfile = work / "h2load.log"
    logfile.unlink(missing_ok=True)
    conns = 8
    cmd = ["h2load", "-D", f"{seconds:g}", "-t1", "-c", str(conns), "-m", str(CONCURRENCY // conns), "-d", str(body),
           "-H", "content-type: application/grpc", "-H", "te: trailers", "--log-file", str(logfile),
           f"http://127.0.0.1:{port}{method}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    lats, bad = [], 0
    for line in logfile.read_text().splitlines():
        _, status, micros = line.split("\t")
        if status == "200":
            lats.append(int(micros) / 1e3)
        else:
            bad += 1
    failed = next((int(l.split()[l.split().index("failed,") - 1]) for l in out.splitlines()
                   if l.startswith("requests:")), 0)
    lats.sort()
    n = len(lats)
    return {"rps": n / seconds, "p50_ms": lats[n // 2] if n else float("nan"),
            "p99_ms": lats[min(n - 1, int(n * 0.99))] if n else float("nan"), "errors": bad + failed, "answers": n}


def ok_count(rest_port: int, model: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{rest_port}/monitoring/prometheus/metrics", timeout=10).read()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.decode().splitlines()
               if l.startswith(":tensorflow:serving:request_count{") and f'model_name="{model}"' in l
               and 'status="OK"' in l)


# ------------------------------------------------------------------ servers
def _started(make) -> Service:
    """Start the service ``make(ports)`` builds; on a port another process took meanwhile, new ports."""
    for attempt in range(3):
        service = make(free_ports(2))
        try:
            return service.start()
        except RuntimeError as exc:
            if "in use" not in str(exc) or attempt == 2:
                raise
            log(f"{service.label}: a port was taken, starting again")
    raise AssertionError("unreachable")


@contextlib.contextmanager
def running(service: Service):
    """A started service, stopped at the end of the block."""
    try:
        yield service
    finally:
        service.stop()


def modelyard_server(prepared: dict, work: Path) -> Service:
    config = work / "models.config"
    config.write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{name}" base_path: "{base}" model_platform: "tensorflow" }}\n'
        for name, base in ((MODEL, prepared["base"]), (IMAGE, prepared["image_base"]))) + "}\n")
    monitoring = work / "monitoring.config"
    monitoring.write_text('prometheus_config { enable: true, path: "/monitoring/prometheus/metrics" }\n')

    def make(ports):
        rest, grpc = ports
        service = Service("modelyard serve", [sys.executable, "-m", "modelyard", "serve", "--host", "127.0.0.1",
                                              "--port", str(grpc), "--rest_api_port", str(rest), "--model_config_file",
                                              str(config), "--runtime", "litert", "--monitoring_config_file",
                                              str(monitoring)],
                          work / "modelyard.log", ready=http_ok(f"http://127.0.0.1:{rest}/v2/health/ready"))
        service.rest_port, service.grpc_port = rest, grpc
        return service

    return _started(make)


def kserve_server(prepared: dict, python: str, work: Path) -> Service:
    def make(ports):
        http, grpc = ports
        service = Service("KServe 0.21 (V2, LiteRT)", [python, str(ROOT / "peers" / "kserve_v2_model.py"),
                                                       "--model_name", MODEL, "--tflite", prepared["tflite"],
                                                       "--http_port", str(http), "--grpc_port", str(grpc)],
                          work / "kserve.log", ready=http_ok(f"http://127.0.0.1:{http}/v2/models/{MODEL}/ready"))
        service.rest_port = http
        return service

    return _started(make)


def check_same_answer(urls: list[str], body: bytes) -> None:
    """Every V2 server answers the digits request with the same probabilities (same model)."""
    answers = []
    for url in urls:
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            answers.append(json.loads(r.read())["outputs"][0]["data"])
    for other in answers[1:]:
        if max(abs(a - b) for a, b in zip(answers[0], other)) > 1e-4:
            raise RuntimeError(f"the servers disagree: {answers}")


# ------------------------------------------------------------------ the run
MODELYARD_SIDES = ("TF Serving REST (digits)", "V2 REST JSON (digits)", "V2 REST JSON (224x224x3)",
                   "V2 REST binary (224x224x3)", "TF Serving gRPC (digits)", "V2 gRPC (digits)")
KSERVE = "KServe V2 REST JSON (digits)"


def run(args, out_dir: Path) -> int:
    for tool, package in (("wrk", "wrk"), ("h2load", "nghttp2-client")):
        ensure_tool(tool, package)
    seconds = args.duration or (3.0 if args.quick else 8.0)
    rounds = 1 if args.quick else args.v2_rounds
    work = Path(args.v2_workdir)
    work.mkdir(parents=True, exist_ok=True)
    prepared = prepare(work)
    bodies = prepared["bodies"]

    def modelyard_turn(_side: str, round_no: int) -> dict:
        with running(modelyard_server(prepared, work)) as server:
            base = f"http://127.0.0.1:{server.rest_port}"
            tfs_url, v2_url = f"{base}/v1/models/{MODEL}:predict", f"{base}/v2/models/{MODEL}/infer"
            image_url = f"{base}/v2/models/{IMAGE}/infer"
            loads = {
                MODELYARD_SIDES[0]: lambda: wrk(tfs_url, bodies / "tfs.json", seconds, work),
                MODELYARD_SIDES[1]: lambda: wrk(v2_url, bodies / "v2_digits.json", seconds, work),
                MODELYARD_SIDES[2]: lambda: wrk(image_url, bodies / "v2_224.json", seconds, work,
                                                concurrency=IMAGE_CONCURRENCY),
                MODELYARD_SIDES[3]: lambda: wrk(image_url, bodies / "v2_224.bin", seconds, work,
                                                "application/octet-stream", prepared["binary_header"],
                                                concurrency=IMAGE_CONCURRENCY),
                MODELYARD_SIDES[4]: lambda: _counted(server, lambda: h2load(server.grpc_port, TFS_PREDICT,
                                                                            bodies / "tfs_grpc.bin", seconds, work)),
                MODELYARD_SIDES[5]: lambda: _counted(server, lambda: h2load(server.grpc_port, V2_INFER,
                                                                            bodies / "v2_grpc.bin", seconds, work)),
            }
            for url, body in ((v2_url, "v2_digits.json"), (image_url, "v2_224.json")):
                wrk(url, bodies / body, 1.0, work, concurrency=IMAGE_CONCURRENCY)  # warm-up
                settle(server)
            sides = list(MODELYARD_SIDES) if round_no % 2 == 0 else list(reversed(MODELYARD_SIDES))
            results = {}
            for side in sides:
                results[side] = loads[side]()
                settle(server)
            for side in sides:
                log(f"round {round_no + 1}: {side}: {results[side]}")
            return results

    def kserve_turn(_side: str, round_no: int) -> dict:
        if not args.kserve_python:
            return {}
        with running(kserve_server(prepared, args.kserve_python, work)) as server:
            url = f"http://127.0.0.1:{server.rest_port}/v2/models/{MODEL}/infer"
            wrk(url, bodies / "v2_digits.json", 1.0, work)
            settle(server)
            result = wrk(url, bodies / "v2_digits.json", seconds, work)
            log(f"round {round_no + 1}: {KSERVE}: {result}")
            return {KSERVE: result}

    if args.kserve_python:  # both answer the same request alike before anything is measured
        with running(modelyard_server(prepared, work)) as ours, \
                running(kserve_server(prepared, args.kserve_python, work)) as theirs:
            check_same_answer([f"http://127.0.0.1:{s.rest_port}/v2/models/{MODEL}/infer" for s in (ours, theirs)],
                              (bodies / "v2_digits.json").read_bytes())
    turns = take_turns(["modelyard", "kserve"], rounds,
                       lambda side, r: modelyard_turn(side, r) if side == "modelyard" else kserve_turn(side, r),
                       report=lambda *_: None)
    runs: dict[str, list[dict]] = {}
    for side_results in turns.values():
        for result in side_results:
            for name, value in result.items():
                runs.setdefault(name, []).append(value)
    write_results("serving_v2", report(runs, seconds, rounds, args), out_dir)
    return 0


def settle(server: Service, timeout: float = 60.0) -> None:
    """Wait until the server has worked off what the last run left behind (requests the load generator
    gave up on are still parsed and answered): its CPU use drops below a tenth of a core. Without this
    a run after the 224x224x3 JSON run measured the JSON run's backlog."""
    deadline = time.monotonic() + timeout
    last = server.cpu_seconds()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = server.cpu_seconds()
        if now - last < 0.05:
            return
        last = now
    log(f"{server.label} still busy {timeout:g} s after a run")


def _counted(server: Service, load) -> dict:
    """h2load's figures, its answers checked against the server's OK count (gRPC errors hide in trailers)."""
    before = ok_count(server.rest_port, MODEL)
    result = load()
    time.sleep(0.3)
    ok = ok_count(server.rest_port, MODEL) - before
    result["errors"] += max(0, result.pop("answers") - int(ok))
    return result


def report(runs: dict[str, list[dict]], seconds: float, rounds: int, args) -> str:
    def med(name: str) -> dict | None:
        values = runs.get(name)
        if not values:
            return None
        ordered = sorted(values, key=lambda r: r["rps"])
        row = dict(ordered[(len(ordered) - 1) // 2])
        row["errors"] = sum(r["errors"] for r in values)
        row["all"] = [round(r["rps"]) for r in values]
        return row

    rows = []
    for name in MODELYARD_SIDES + (KSERVE,):
        r = med(name)
        if r is not None:
            rows.append([name, f"{r['rps']:.0f}", ", ".join(map(str, r["all"])), f"{r['p50_ms']:.1f}",
                         f"{r['p99_ms']:.1f}", r["errors"]])

    def ratio(a: str, b: str, target: float) -> list:
        ra, rb = med(a), med(b)
        if ra is None or rb is None or not rb["rps"]:
            return [f"{a} / {b}", "n/a", f"≥ {target}×", "not measured"]
        value = ra["rps"] / rb["rps"]
        return [f"{a} / {b}", f"{value:.2f}×", f"≥ {target}×", "PASS" if value >= target else "FAIL"]

    targets = [ratio(MODELYARD_SIDES[1], MODELYARD_SIDES[0], 0.9), ratio(MODELYARD_SIDES[3], MODELYARD_SIDES[2], 1.2),
               ratio(MODELYARD_SIDES[5], MODELYARD_SIDES[4], 0.9), ratio(MODELYARD_SIDES[1], KSERVE, 5.0)]
    load = open("/proc/loadavg").read().split()[:3]
    return "\n".join([
        "# The Open Inference Protocol (V2) beside TF Serving's API, and against KServe",
        "",
        f"`{' '.join(['python3', 'bench/serving.py', *sys.argv[1:]])}` — {machine()}",
        "",
        f"c={CONCURRENCY} (the 224x224x3 pair c={IMAGE_CONCURRENCY}), {seconds:g} s per run, {rounds} round(s) taking turns (order reversed every round); "
        "req/s is the median run's, every run's listed. modelyard serve `--runtime litert`, both models in one "
        "server; KServe 0.21 (`bench/peers/kserve_v2_model.py`, its own venv) on the same digits model as a "
        f".tflite on LiteRT. Load average at the end: {' '.join(load)} — the 2-core machine was shared with "
        "other engineers' test runs throughout, so figures are noisy.",
        "",
        markdown_table(["side", "req/s", "runs", "p50 ms", "p99 ms", "errors"], rows),
        "",
        "## Targets (issue 30)",
        "",
        markdown_table(["ratio", "measured", "target", "verdict"], targets),
        "",
    ])
