"""Experiment tracking benchmark: the platform's Vertex Experiments (the stock google-cloud-aiplatform
SDK) against MLflow's tracking server (MLflow's own client), both started here, on one machine.

    python3 bench/tracking.py [--points 10000] [--per-call 10] [--runs 100] [--rounds 3]
                              [--memory-points 1000000] [--mlflow-python PATH] [--out FILE]

- Logging: one run logs --points metric points, --per-call points per call: the SDK's
  ``log_time_series_metrics`` (one step of --per-call metrics per call, into the run's TensorBoard
  time series) and ``log_metrics`` (summary metrics), against ``MlflowClient.log_batch`` of --per-call
  metrics per call. Points per second, measured inside each client (its start-up not counted).
- Reading: an experiment of --runs runs (5 params, 5 summary metrics, 3 time series of 10 points each),
  ``get_experiment_df`` (with and without time series) against ``mlflow.search_runs`` of the experiment,
  and against ``search_runs`` plus every run's metric history (``get_metric_history`` per run and series:
  what the SDK reads to fill its time-series columns, every point of every series); seconds per call, and
  the CPU seconds each server spent on it. Then each kind of request the SDK sends, alone, one at a time:
  its latency and the platform's CPU per request (the platform's own share of get_experiment_df). And the
  SDK alone: get_experiment_df against a zero-cost server (the platform's answers to it recorded, then
  replayed in the client's process from memory, below requests: no socket, no server), the resource objects
  the SDK builds per run, and its CPU per object, per request and per point of a batchRead answer.
- Memory: the platform's resident memory (the platform process; its storage process apart) after
  --memory-points scalar points were written through the REST API (writeTensorboardRunData, 5,000 per
  request, into 10 series), and after a ``batchRead`` of those 10 series.

The two sides take turns (the order reversed every round). MLflow comes from the interpreter of
--mlflow-python (default: this one): google-cloud-aiplatform's autologging extra pins an MLflow whose
requirements clash with this environment's protobuf and pandas, so MLflow can live in a venv of its own
(``python3 -m venv /tmp/mlflow && /tmp/mlflow/bin/pip install mlflow``). Its server runs with its defaults
(``mlflow server`` with a SQLite backend store); the platform is one ``modelyard platform`` process.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT, LOCATION = "bench", "us-central1"
PARAMS = 5
METRICS = 5
SERIES, SERIES_POINTS = 3, 10


# ---------------------------------------------------------------- the clients (each in its own interpreter)
def _sdk(url: str):
    import google.auth
    import google.auth.credentials
    from google.cloud import aiplatform

    # The SDK asks google.auth.default() when it reuses the global experiment TensorBoard; there are none here.
    google.auth.default = lambda *a, **k: (google.auth.credentials.AnonymousCredentials(), PROJECT)
    aiplatform.init(project=PROJECT, location=LOCATION, api_endpoint=url, api_transport="rest",
                    credentials=google.auth.credentials.AnonymousCredentials())
    return aiplatform


def _platform_tensorboard(aip, url: str):
    found = aip.Tensorboard.list(filter='display_name="bench"')
    return found[0] if found else aip.Tensorboard.create(display_name="bench")


def client_platform(task: str, url: str, arg: dict) -> dict:
    aip = _sdk(url)
    tb = _platform_tensorboard(aip, url)
    if task == "log":
        aip.init(experiment="log-exp", experiment_tensorboard=tb)
        aip.start_run(f"log-{arg['round']}")
        calls, per = arg["points"] // arg["per_call"], arg["per_call"]
        start = time.perf_counter()
        for step in range(calls):
            aip.log_time_series_metrics({f"m{j}": float(step * j) for j in range(per)}, step=step)
        series = time.perf_counter() - start
        start = time.perf_counter()
        for step in range(calls):
            aip.log_metrics({f"m{j}": float(step * j) for j in range(per)})
        summary = time.perf_counter() - start
        aip.end_run()
        return {"series_pps": calls * per / series, "summary_pps": calls * per / summary}
    if task == "setup":
        aip.init(experiment="df-exp", experiment_tensorboard=tb)
        for r in range(arg["runs"]):
            with aip.start_run(f"run-{r}"):
                aip.log_params({f"p{j}": r * j for j in range(PARAMS)})
                aip.log_metrics({f"m{j}": r * j / 10 for j in range(METRICS)})
                for step in range(SERIES_POINTS):
                    aip.log_time_series_metrics({f"ts{j}": float(step + j) for j in range(SERIES)}, step=step)
        return {}
    if task == "kinds":
        return _request_kinds(url, arg["platform_pid"])
    aip.init(experiment="df-exp", experiment_tensorboard=tb)
    calls = _count_requests()
    cpu, platform_cpu = time.process_time(), _cpu_s(arg["platform_pid"])
    start = time.perf_counter()
    df = aip.get_experiment_df()
    with_series = time.perf_counter() - start
    cpu, platform_cpu = time.process_time() - cpu, _cpu_s(arg["platform_pid"]) - platform_cpu
    requests_made = calls[0]
    plain_cpu = _cpu_s(arg["platform_pid"])
    start = time.perf_counter()
    plain = aip.get_experiment_df(include_time_series=False)
    without = time.perf_counter() - start
    plain_cpu = _cpu_s(arg["platform_pid"]) - plain_cpu
    plain_requests = calls[0] - requests_made
    assert len(df) == len(plain) == arg["runs"], (len(df), len(plain))
    # Again, warm (the first call of a process also pays the SDK's lazy imports and first uses): the
    # platform's figure to set beside the servers below, which are all asked warm.
    warm_cpu, warm_platform_cpu, start = time.process_time(), _cpu_s(arg["platform_pid"]), time.perf_counter()
    aip.get_experiment_df()
    warm_s = time.perf_counter() - start
    warm_cpu, warm_platform_cpu = time.process_time() - warm_cpu, _cpu_s(arg["platform_pid"]) - warm_platform_cpu
    # The SDK alone: the same call against a zero-cost server (the platform's answers to it, recorded, then
    # replayed from memory below requests: no socket, no server). No server can answer faster than this.
    replay = _Replay()
    built = _count_clients()
    recorded = aip.get_experiment_df()
    objects = built[0]
    replay.replaying = True
    cpu0, start = time.process_time(), time.perf_counter()
    replayed = aip.get_experiment_df()
    zero_s, zero_cpu = time.perf_counter() - start, time.process_time() - cpu0
    assert replayed.equals(recorded), "the replayed answers give another frame"
    # The same answers from a server that does no work: another process on loopback HTTP, each answer's
    # bytes ready in memory. What is left over the replay is the SDK's own networking (its ~4 new
    # connections per run: each object it builds has its own session), which any server costs it.
    replay.replaying = False
    with _CannedServer(replay.answers) as server:
        aip.init(api_endpoint=server.url)
        cpu0, server_cpu0, start = time.process_time(), _cpu_s(server.proc.pid), time.perf_counter()
        canned = aip.get_experiment_df()
        canned_s, canned_cpu = time.perf_counter() - start, time.process_time() - cpu0
        canned_server_cpu = _cpu_s(server.proc.pid) - server_cpu0
        aip.init(api_endpoint=url)
    assert canned.equals(recorded), "the canned answers give another frame"
    replay.replaying = True
    return {"df_canned_s": canned_s, "df_canned_cpu_s": canned_cpu, "df_canned_server_cpu_s": canned_server_cpu,
            "df_warm_s": warm_s, "df_warm_cpu_s": warm_cpu,
            "df_warm_server_cpu_s": warm_platform_cpu, "df_s": with_series, "df_plain_s": without, "df_requests": requests_made, "df_client_cpu_s": cpu,
            "df_server_cpu_s": platform_cpu, "df_plain_server_cpu_s": plain_cpu, "df_plain_requests": plain_requests,
            "df_zero_s": zero_s, "df_zero_cpu_s": zero_cpu, "df_objects": objects, **_sdk_unit_costs(aip, replay)}


class _Replay:
    """Records every HTTP answer this process gets (below requests' Session, at the adapter); once
    ``replaying``, answers the same requests from memory without a socket: a server that costs nothing."""

    def __init__(self) -> None:
        import threading

        import requests.adapters

        self.answers: dict = {}
        self.replaying = False
        lock, original, replay = threading.Lock(), requests.adapters.HTTPAdapter.send, self

        def send(adapter, request, **kwargs):
            key = (request.method, request.url, request.body)
            if not replay.replaying:
                got = original(adapter, request, **kwargs)
                with lock:
                    replay.answers[key] = (got.status_code, dict(got.headers), got.content)
                return got
            return replay.answer(request, *replay.answers[key])

        requests.adapters.HTTPAdapter.send = send

    @staticmethod
    def answer(request, status: int, headers: dict, content: bytes):
        from requests.models import Response
        from requests.structures import CaseInsensitiveDict

        out = Response()
        out.status_code, out.headers, out._content = status, CaseInsensitiveDict(headers), content
        out.url, out.request, out.encoding, out.reason = request.url, request, "utf-8", "OK"
        return out


class _CannedServer:
    """``with _CannedServer(answers) as server`` (``server.url``, ``server.proc``): a process answering HTTP/1.1 (keep-alive) on loopback with
    the recorded answers, by method and path, from memory: a server whose only cost is the socket."""

    def __init__(self, answers: dict) -> None:
        from urllib.parse import urlsplit

        self.table = {}
        for (method, url, _body), (status, _headers, content) in answers.items():
            parts = urlsplit(url)
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            self.table[f"{method} {target}"] = [status, content.decode("latin-1")]

    def __enter__(self) -> "_CannedServer":
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(self.table, f)
        self.file = f.name
        self.proc = subprocess.Popen([sys.executable, __file__, "--canned", self.file], stdout=subprocess.PIPE,
                                     text=True)
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait()
        Path(self.file).unlink()


def serve_canned(table_file: str) -> None:
    """The canned server's process: prints its port, then answers until terminated."""
    import asyncio

    table = {k: (v[0], v[1].encode("latin-1")) for k, v in json.loads(Path(table_file).read_text()).items()}
    missing = (404, b'{"error": {"code": 404, "message": "not recorded", "status": "NOT_FOUND"}}')

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                length = next((int(h.split(":", 1)[1]) for h in lines[1:] if h.lower().startswith("content-length:")), 0)
                if length:
                    await reader.readexactly(length)
                status, body = table.get(f"{method} {target}", missing)
                writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                             % (status, len(body)) + body)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    asyncio.run(main())


def _count_clients() -> list[int]:
    """Counts the SDK's resource objects built from now on: each builds its own API clients (its v1 and
    v1beta1 service clients, each with a session and every method wrapped)."""
    from google.cloud.aiplatform import initializer

    count, config = [0], type(initializer.global_config)
    original = config.create_client

    def counted(self, *a, **k):
        count[0] += 1
        return original(self, *a, **k)

    config.create_client = counted
    return count


def _sdk_unit_costs(aip, replay: _Replay, n: int = 200) -> dict:
    """The SDK's CPU per resource object it builds, per request (an answer replayed from memory), and per
    point of a batchRead answer (a run's 3 series of 10 points against 3 of 1,000: Vertex's cap per series)."""
    import json

    replay.replaying = False  # the lookups below are new requests: recorded first
    run = aip.ExperimentRun("run-0", experiment="df-exp")._backing_tensorboard_run.resource
    series = aip.TensorboardTimeSeries._empty_constructor  # as the SDK builds one per time series listed

    def per_call(fn, count: int) -> float:
        fn()
        start = time.process_time()
        for _ in range(count):
            fn()
        return (time.process_time() - start) / count

    run.read_time_series_data()
    replay.replaying = True
    object_s = per_call(lambda: series(), n)
    request_s = per_call(lambda: run.api_client.get_tensorboard_run(name=run.resource_name), n)
    small_s = per_call(run.read_time_series_data, n // 4)
    key = next(k for k in replay.answers if ":batchRead" in k[1] and run.resource_name.split("/experiments/")[0] in k[1]
               and all(ts in k[1] for ts in run._time_series_display_name_to_id_mapping.values()))
    status, headers, body = replay.answers[key]
    data = json.loads(body)
    points = 0
    for one in data["timeSeriesData"]:
        one["values"] = [dict(one["values"][-1], step=str(i)) for i in range(1000)]
        points += 1000 - 10
    replay.answers[key] = (status, headers, json.dumps(data).encode())
    large_s = per_call(run.read_time_series_data, n // 20)
    replay.answers[key] = (status, headers, body)
    return {"sdk_object_ms": object_s * 1000, "sdk_request_ms": request_s * 1000,
            "sdk_point_us": (large_s - small_s) / points * 1e6}


# The kinds of request get_experiment_df(include_time_series=True) sends per run (besides listing the runs).
KINDS = ("run's TensorBoard-run artifact (GET artifact)", "TensorBoard run (GET)", "its time series (list)",
         "batchRead of its time series", "the runs (list contexts, filtered)")


def _request_kinds(url: str, pid: int, n: int = 200) -> dict:
    """Each kind of request the SDK sends, one at a time, ``n`` times: seconds per request on the client and
    the platform's CPU per request (the platform's own share, without the SDK's threads around it)."""
    import requests

    s = requests.Session()
    store = f"{url}/v1/projects/{PROJECT}/locations/{LOCATION}/metadataStores/default"
    artifact = s.get(f"{store}/artifacts/df-exp-run-0-tb-run").json()
    run = f"{url}/v1/{artifact['metadata']['resourceName']}"
    series = s.get(f"{run}/timeSeries").json()["tensorboardTimeSeries"]
    board = run.split("/experiments/")[0]
    calls = [(f"{store}/artifacts/df-exp-run-0-tb-run", None), (run, None), (f"{run}/timeSeries", None),
             (f"{board}:batchRead", [("timeSeries", t["name"]) for t in series]),
             (f"{store}/contexts", {"filter": f'schema_title="system.ExperimentRun" AND '
                                              f'parent_contexts:"{store.split("/v1/", 1)[1]}/contexts/df-exp"'})]
    out = {}
    for kind, (target, params) in zip(KINDS, calls):
        count = n if "list contexts" not in kind else n // 10
        for _ in range(5):
            s.get(target, params=params).raise_for_status()
        cpu, start = _cpu_s(pid), time.perf_counter()
        for _ in range(count):
            s.get(target, params=params).raise_for_status()
        out[kind] = {"ms": (time.perf_counter() - start) / count * 1000, "server_ms": (_cpu_s(pid) - cpu) / count * 1000}
    return out


def _count_requests() -> list[int]:
    """Counts the HTTP requests this process makes from now on (the SDK's REST transport uses requests)."""
    import threading

    import requests

    count, lock, original = [0], threading.Lock(), requests.Session.request

    def counted(self, *a, **k):
        with lock:
            count[0] += 1
        return original(self, *a, **k)

    requests.Session.request = counted
    return count


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    import os

    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client_mlflow(task: str, url: str, arg: dict) -> dict:
    import mlflow
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(url)
    client = MlflowClient(url)
    if task == "log":
        exp = client.get_experiment_by_name("log-exp")
        exp_id = exp.experiment_id if exp else client.create_experiment("log-exp")
        run_id = client.create_run(exp_id, run_name=f"log-{arg['round']}").info.run_id
        calls, per = arg["points"] // arg["per_call"], arg["per_call"]
        start = time.perf_counter()
        for step in range(calls):
            now = int(time.time() * 1000)
            client.log_batch(run_id, metrics=[Metric(f"m{j}", float(step * j), now, step) for j in range(per)])
        elapsed = time.perf_counter() - start
        client.set_terminated(run_id)
        return {"series_pps": calls * per / elapsed, "summary_pps": calls * per / elapsed}
    if task == "setup":
        exp_id = client.create_experiment("df-exp")
        for r in range(arg["runs"]):
            run_id = client.create_run(exp_id, run_name=f"run-{r}").info.run_id
            now = int(time.time() * 1000)
            client.log_batch(run_id, params=[Param(f"p{j}", str(r * j)) for j in range(PARAMS)],
                             metrics=[Metric(f"m{j}", r * j / 10, now, 0) for j in range(METRICS)])
            for step in range(SERIES_POINTS):
                client.log_batch(run_id, metrics=[Metric(f"ts{j}", float(step + j), now, step) for j in range(SERIES)])
            client.set_terminated(run_id)
        return {}
    exp_id = client.get_experiment_by_name("df-exp").experiment_id
    server_cpu, client_cpu = _tree_cpu_s(arg["server_pid"]), time.process_time()
    start = time.perf_counter()
    df = mlflow.search_runs(experiment_ids=[exp_id])
    elapsed = time.perf_counter() - start
    server_cpu, client_cpu = _tree_cpu_s(arg["server_pid"]) - server_cpu, time.process_time() - client_cpu
    assert len(df) == arg["runs"], len(df)
    warm_server, warm_client, start = _tree_cpu_s(arg["server_pid"]), time.process_time(), time.perf_counter()
    mlflow.search_runs(experiment_ids=[exp_id])
    warm_s = time.perf_counter() - start
    warm_server, warm_client = _tree_cpu_s(arg["server_pid"]) - warm_server, time.process_time() - warm_client
    # What get_experiment_df(include_time_series=True) reads besides: every point of every time series of
    # every run (the SDK's batchRead per run), here MLflow's metric history, one request per run and metric,
    # as MLflow's client offers it.
    history_cpu = _tree_cpu_s(arg["server_pid"])
    start = time.perf_counter()
    df = mlflow.search_runs(experiment_ids=[exp_id])
    points = sum(len(client.get_metric_history(run_id, f"ts{j}")) for run_id in df["run_id"] for j in range(SERIES))
    history = time.perf_counter() - start
    history_cpu = _tree_cpu_s(arg["server_pid"]) - history_cpu
    assert points == arg["runs"] * SERIES * SERIES_POINTS, points
    return {"df_s": elapsed, "df_plain_s": elapsed, "df_server_cpu_s": server_cpu, "df_client_cpu_s": client_cpu,
            "df_warm_s": warm_s, "df_warm_cpu_s": warm_client, "df_warm_server_cpu_s": warm_server,
            "df_history_s": history,
            "df_history_server_cpu_s": history_cpu, "df_history_requests": 1 + arg["runs"] * SERIES}


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants (MLflow's server runs its workers as children)."""
    import os

    def children(p: int) -> list[int]:
        try:
            return [int(c) for t in os.listdir(f"/proc/{p}/task")
                    for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
        except OSError:
            return []

    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += _cpu_s(p)
        except OSError:
            continue
        todo += children(p)
    return total


# ---------------------------------------------------------------- the benchmark
def _client(python: str, side: str, task: str, url: str, arg: dict) -> dict:
    done = subprocess.run([python, __file__, "--client", side, task, url, json.dumps(arg)], capture_output=True,
                          text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{side} {task} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _memory(base: str, pid: int, points: int) -> dict:
    """The platform's RSS before, after writing ``points`` points through REST, and after a batchRead."""
    import requests

    s = requests.Session()
    api = f"{base}/v1/projects/{PROJECT}/locations/{LOCATION}"
    before = _rss_mb(pid)
    op = s.post(f"{api}/tensorboards", json={"displayName": "memory"}).json()
    tb = op["response"]["name"]
    s.post(f"{base}/v1/{tb}/experiments", params={"tensorboardExperimentId": "mem"}, json={}).raise_for_status()
    s.post(f"{base}/v1/{tb}/experiments/mem/runs", params={"tensorboardRunId": "r"}, json={}).raise_for_status()
    run = f"{base}/v1/{tb}/experiments/mem/runs/r"
    ids = [s.post(f"{run}/timeSeries", json={"displayName": f"s{i}", "valueType": "SCALAR"}).json()["name"]
           for i in range(10)]
    per_series, step = 500, 0
    start = time.perf_counter()
    while step * 10 < points:
        data = [{"tensorboardTimeSeriesId": name.rsplit("/", 1)[1], "valueType": "SCALAR",
                 "values": [{"step": str(step + k), "wallTime": "2024-01-01T00:00:00Z", "scalar": {"value": k * 0.5}}
                            for k in range(per_series)]} for name in ids]
        s.post(f"{run}:write", json={"timeSeriesData": data}).raise_for_status()
        step += per_series
    write_s = time.perf_counter() - start
    after_write = _rss_mb(pid)
    start = time.perf_counter()
    read = s.get(f"{base}/v1/{tb}:batchRead", params=[("timeSeries", n.split("/v1/")[-1] if "/v1/" in n else n)
                                                      for n in ids])
    read.raise_for_status()
    read_s = time.perf_counter() - start
    return {"before_mb": before, "after_write_mb": after_write, "after_read_mb": _rss_mb(pid),
            "points": step * 10, "write_pps": step * 10 / write_s, "batch_read_s": read_s}


def main() -> None:
    from harness import Service, free_port, http_ok, log, machine, markdown_table, median, modelyard_platform, \
        take_turns, write_results, command_line

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=10000)
    ap.add_argument("--per-call", type=int, default=10)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory-points", type=int, default=1_000_000)
    ap.add_argument("--mlflow-python", default=sys.executable)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    where = machine()  # the time, load and commit at the start (the results are written at the end)
    mlflow_python = args.mlflow_python
    # mlflow.server: the server's half (the test environment has only MLflow's client, mlflow-skinny, for autolog).
    if subprocess.run([mlflow_python, "-c", "import mlflow.server"], capture_output=True).returncode != 0:
        sys.exit(f"{mlflow_python} cannot import mlflow.server: pass --mlflow-python of an interpreter with the "
                 "whole of MLflow (pip install mlflow)")
    version = subprocess.run([mlflow_python, "-c", "import mlflow; print(mlflow.__version__)"], capture_output=True,
                             text=True).stdout.strip()

    with tempfile.TemporaryDirectory(prefix="bench-tracking-") as tmp:
        tmp = Path(tmp)
        port = free_port()
        mlflow_url = f"http://127.0.0.1:{port}"
        mlflow_server = Service("mlflow server", [mlflow_python, "-m", "mlflow", "server", "--host", "127.0.0.1",
                                                  "--port", str(port), "--backend-store-uri",
                                                  f"sqlite:///{tmp / 'mlflow.db'}", "--default-artifact-root",
                                                  str(tmp / "mlartifacts")],
                                tmp / "mlflow.log", ready=http_ok(mlflow_url + "/health"), cwd=tmp)
        with modelyard_platform(tmp / "platform") as platform, mlflow_server:
            urls = {"platform": platform.base, "mlflow": mlflow_url}
            pythons = {"platform": sys.executable, "mlflow": mlflow_python}

            def log_round(side: str, round_no: int) -> dict:
                return _client(pythons[side], side, "log", urls[side],
                               {"round": round_no, "points": args.points, "per_call": args.per_call})

            for side in ("platform", "mlflow"):  # warm-up, not counted: MLflow's server starts workers after /health
                for attempt in range(3):  # and a busy machine saw its first requests cut off (IncompleteRead)
                    try:
                        _client(pythons[side], side, "log", urls[side], {"round": -1 - attempt,
                                                                         "points": args.per_call * 20,
                                                                         "per_call": args.per_call})
                        break
                    except RuntimeError as exc:
                        if attempt == 2:
                            raise
                        log(f"{side} warm-up failed, again: {str(exc).strip().splitlines()[-1][:200]}")
            logging = take_turns(["platform", "mlflow"], args.rounds, log_round)
            for side in ("platform", "mlflow"):
                log(f"setting up {args.runs} runs on {side}")
                _client(pythons[side], side, "setup", urls[side], {"runs": args.runs})
            reading = take_turns(["platform", "mlflow"], args.rounds,
                                 lambda side, r: _client(pythons[side], side, "df", urls[side],
                                                         {"runs": args.runs, "platform_pid": platform.pid,
                                                          "server_pid": mlflow_server.pid}))
            kinds = _client(sys.executable, "platform", "kinds", platform.base, {"platform_pid": platform.pid})
            memory = _memory(platform.base, platform.pid, args.memory_points)

    def med(results: dict, side: str, key: str) -> float:
        return median(r[key] for r in results[side])

    rows = [
        ["log_time_series_metrics vs log_batch (points/s)", f"{med(logging, 'platform', 'series_pps'):,.0f}",
         f"{med(logging, 'mlflow', 'series_pps'):,.0f}",
         f"{med(logging, 'platform', 'series_pps') / med(logging, 'mlflow', 'series_pps'):.2f}x"],
        ["log_metrics vs log_batch (points/s)", f"{med(logging, 'platform', 'summary_pps'):,.0f}",
         f"{med(logging, 'mlflow', 'series_pps'):,.0f}",
         f"{med(logging, 'platform', 'summary_pps') / med(logging, 'mlflow', 'series_pps'):.2f}x"],
        [f"get_experiment_df vs search_runs, {args.runs} runs (s)", f"{med(reading, 'platform', 'df_s'):.2f}",
         f"{med(reading, 'mlflow', 'df_s'):.2f}", f"{med(reading, 'platform', 'df_s') / med(reading, 'mlflow', 'df_s'):.2f}x"],
        [f"get_experiment_df(include_time_series=False), {args.runs} runs (s)",
         f"{med(reading, 'platform', 'df_plain_s'):.2f}", f"{med(reading, 'mlflow', 'df_s'):.2f}",
         f"{med(reading, 'platform', 'df_plain_s') / med(reading, 'mlflow', 'df_s'):.2f}x"],
        [f"get_experiment_df vs search_runs + every run's metric history, {args.runs} runs (s)",
         f"{med(reading, 'platform', 'df_s'):.2f}", f"{med(reading, 'mlflow', 'df_history_s'):.2f}",
         f"{med(reading, 'platform', 'df_s') / med(reading, 'mlflow', 'df_history_s'):.2f}x"],
    ]

    def floor_row(label: str, key: str, server_cpu: str | None) -> list:
        seconds, sdk_cpu = med(reading, "platform", f"df_{key}_s"), med(reading, "platform", f"df_{key}_cpu_s")
        cpu = sdk_cpu + (med(reading, "platform", server_cpu) if server_cpu else 0.0)
        return [label, f"{seconds:.2f}", f"{sdk_cpu:.2f}", f"{cpu - sdk_cpu:.2f}", f"{seconds / ml_s:.2f}x",
                f"{cpu / ml_cpu:.2f}x"]

    # Warm (each client's second call): the platform beside servers that cost less and less, down to none.
    ml_s = med(reading, "mlflow", "df_warm_s")
    ml_cpu = med(reading, "mlflow", "df_warm_cpu_s") + med(reading, "mlflow", "df_warm_server_cpu_s")
    floors = [
        floor_row("the platform", "warm", "df_warm_server_cpu_s"),
        floor_row("a canned-answer server (the platform's answers from memory, loopback HTTP)", "canned",
                  "df_canned_server_cpu_s"),
        floor_row("a zero-cost server (the answers replayed in the SDK's process, no socket)", "zero", None),
        ["MLflow's search_runs (one request)", f"{ml_s:.2f}", f"{med(reading, 'mlflow', 'df_warm_cpu_s'):.2f}",
         f"{med(reading, 'mlflow', 'df_warm_server_cpu_s'):.2f}", "1.00x", "1.00x"],
    ]
    share = med(reading, "platform", "df_warm_s") / med(reading, "platform", "df_canned_s")
    objects_per_run = med(reading, "platform", "df_objects") / args.runs
    requests_per_run = med(reading, "platform", "df_requests") / args.runs
    floor_ms = (objects_per_run * med(reading, "platform", "sdk_object_ms")
                + requests_per_run * med(reading, "platform", "sdk_request_ms")
                + SERIES * SERIES_POINTS * med(reading, "platform", "sdk_point_us") / 1000)
    server = [
        ["get_experiment_df (with time series) / search_runs", f"{med(reading, 'platform', 'df_requests'):.0f}",
         f"{med(reading, 'platform', 'df_server_cpu_s'):.2f}", "1", f"{med(reading, 'mlflow', 'df_server_cpu_s'):.2f}"],
        ["get_experiment_df(include_time_series=False) / search_runs",
         f"{med(reading, 'platform', 'df_plain_requests'):.0f}", f"{med(reading, 'platform', 'df_plain_server_cpu_s'):.2f}",
         "1", f"{med(reading, 'mlflow', 'df_server_cpu_s'):.2f}"],
        ["get_experiment_df (with time series) / search_runs + metric histories",
         f"{med(reading, 'platform', 'df_requests'):.0f}", f"{med(reading, 'platform', 'df_server_cpu_s'):.2f}",
         f"{med(reading, 'mlflow', 'df_history_requests'):.0f}", f"{med(reading, 'mlflow', 'df_history_server_cpu_s'):.2f}"],
    ]
    per_kind = [[kind, f"{v['ms']:.2f}", f"{v['server_ms']:.2f}"] for kind, v in kinds.items()]
    text = "\n".join([
        "# Experiment tracking: the platform (Vertex SDK) vs MLflow's tracking server", "", where, "",
        f"`{command_line()}`; MLflow {version}; {args.rounds} rounds, sides in turns, medians; "
        f"{args.points} points per logging round, {args.per_call} per call.", "",
        markdown_table(["measure", "platform", "MLflow", "platform / MLflow"], rows), "",
        f"Platform memory (RSS of the platform process): {memory['before_mb']:.0f} MB before, "
        f"{memory['after_write_mb']:.0f} MB holding {memory['points']:,} points (written at "
        f"{memory['write_pps']:,.0f} points/s through writeTensorboardRunData), {memory['after_read_mb']:.0f} MB "
        f"after a batchRead of their 10 series ({memory['batch_read_s']:.2f} s).", "",
        f"Where get_experiment_df's time goes ({args.runs} runs, with time series; medians): the stock SDK makes "
        f"{med(reading, 'platform', 'df_requests'):.0f} requests (2 for the runs, then 5 per run: the run's "
        f"TensorBoard-run artifact, the TensorBoard run, its time series listed twice, a batchRead), on {args.runs} "
        f"threads; the SDK's process spends {med(reading, 'platform', 'df_client_cpu_s'):.2f} s of CPU, the platform "
        f"{med(reading, 'platform', 'df_server_cpu_s'):.2f} s. MLflow's search_runs is one request, and already holds "
        "each metric's latest value (what the SDK reads every point of every series for); the last row of the "
        "table reads what the SDK reads: each run's metric history, one request per run and metric, in turn.", "",
        "The SDK's floor (a zero-cost server: the same call with the platform's answers to it recorded, then replayed "
        "in the SDK's process from memory, below requests, no socket): "
        f"{med(reading, 'platform', 'df_zero_s'):.2f} s, {med(reading, 'platform', 'df_zero_cpu_s'):.2f} s of the SDK's "
        f"CPU (its threads share one interpreter lock: the CPU is a floor of the time). Per run the SDK builds "
        f"{objects_per_run:.0f} resource objects (the run's context, its TensorBoard-run artifact, the TensorBoard "
        f"run, and each of the two times it lists the run's time series one for the list and one per series), each with its own API clients (v1 and v1beta1, every "
        f"method wrapped): {med(reading, 'platform', 'sdk_object_ms'):.2f} ms of CPU per object; "
        f"{med(reading, 'platform', 'sdk_request_ms'):.2f} ms per request answered from memory; "
        f"{med(reading, 'platform', 'sdk_point_us'):.0f} us per point of a batchRead answer (measured with 1,000 "
        f"points per series, Vertex's cap, which the platform applies too). {objects_per_run:.0f} objects, "
        f"{requests_per_run:.2f} requests and {SERIES * SERIES_POINTS} points per run: {floor_ms:.1f} ms per run, "
        f"{floor_ms * args.runs / 1000:.2f} s of the zero-cost server's {med(reading, 'platform', 'df_zero_cpu_s'):.2f} s "
        f"for {args.runs} runs (the rest: the SDK's other work per run, its {args.runs} threads taking turns on the "
        f"lock, the frame), against MLflow's search_runs of {ml_s:.2f} s (warm). "
        "The cost is per object and per request (per series "
        "listed, not per point at this size), none of it changed by what a server answers: the platform already "
        "answers as Vertex does (at most 1,000 points of a scalar series per batchRead; Vertex's fields, with a few empty "
        "ones Vertex would leave out).", "",
        f"get_experiment_df (with time series) of {args.runs} runs, warm (each client's second call), against "
        "the platform and against servers that do less and less, down to nothing; CPU: the client's process "
        "and the server's (the CPU is what the call costs whatever else the shared machine runs; the time is not):",
        "", markdown_table(["server", "seconds", "SDK CPU (s)", "server CPU (s)", "seconds / MLflow's",
                            "CPU / MLflow's"], floors), "",
        f"The platform's own share: {share:.2f}x the canned-answer server's time. No server can bring "
        f"get_experiment_df with time series to MLflow's search_runs time on this machine: against a server that "
        f"costs nothing the stock SDK takes {floors[2][4]} search_runs' time ({floors[2][5]} its CPU, client and "
        f"server), against the same answers over loopback HTTP {floors[1][4]}.", "",
        "Server side (CPU seconds of the server's processes during the call, medians):", "",
        markdown_table(["call", "platform requests", "platform CPU (s)", "MLflow requests", "MLflow CPU (s)"], server),
        "", "Each kind of request the SDK sends, alone (one client, one at a time, 200 of each, the runs' list 20; "
        "the platform's CPU per request):", "",
        markdown_table(["request", "ms per request", "platform CPU (ms)"], per_kind),
    ])
    write_results("tracking", text, args.out)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--canned":
        serve_canned(sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "--client":
        side, task, url, arg = sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
        out = (client_platform if side == "platform" else client_mlflow)(task, url, arg)
        print(json.dumps(out))
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        main()
