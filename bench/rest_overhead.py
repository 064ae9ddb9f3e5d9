"""What a REST predict costs modelyard itself: the serving path with the model call taken out.

    python3 bench/rest_overhead.py       # prints the table, writes bench/results/rest_overhead.md

The demo digits model is served in-process (``ModelServer``, ``--runtime tensorflow``) with
its session call replaced by one that returns zeros at once, and a closed loop of fake
connections is driven through the real ``HttpProtocol`` on uvloop: HTTP parsing, routing,
JSON, batching queue, encoding and the response, without sockets or the model. CPU is
``time.process_time`` (all threads) and ``time.thread_time`` of the event loop, per request.
Every configuration runs in a fresh process; the table shows each one's best of ``--repeats``
runs (the machine is shared and noisy). Use it to see where the per-request cost goes when
changing the server; `bench/serving.py` measures the whole thing over real sockets.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from serving import DEFAULT_BATCHING  # noqa: E402  (the serving benchmark's parameters)

from harness import env, log, machine, markdown_table, take_turns, write_results  # noqa: E402

from modelyard.ports import free_port  # noqa: E402
CONFIGS = [  # (label, batching)
    ("batching (predicts wait in the queue, parsed on the event loop)", True),
    ("no batching (predicts run on the REST thread pool)", False),
]


def one_run(batching: bool, requests: int, connections: int) -> dict:
    """(child process) Serve the demo model with a no-op session and drive it; returns the figures."""
    import asyncio

    import numpy as np
    import uvloop

    from modelyard import demo
    from modelyard.model.runtime import tf_session
    from modelyard.serving.transport.http_server import HttpProtocol
    from modelyard.serving.options import add_flags, resolve
    from modelyard.serving.server import ModelServer, settle_heap_for_serving

    def instant_run(self, signature, inputs, output_aliases):
        rows = next(iter(inputs.values())).shape[0]
        return {alias: np.zeros((rows, 10), np.float32) for alias in output_aliases}

    tf_session.SessionServable.run = instant_run  # the model call is what this benchmark leaves out

    base = demo.ensure_demo_model(log=lambda m: log(m))
    flags = ["--model_name", demo.MODEL_NAME, "--model_base_path", str(base), "--host", "127.0.0.1",
             "--port", str(free_port()), "--rest_api_port", str(free_port()), "--runtime", "tensorflow",
             "--tensorflow_intra_op_parallelism", "1", "--tensorflow_inter_op_parallelism", "-1"]
    parser = argparse.ArgumentParser()
    add_flags(parser)
    with tempfile.TemporaryDirectory() as tmp:
        if batching:
            params = Path(tmp) / "batching.config"
            params.write_text(DEFAULT_BATCHING)
            flags += ["--enable_batching", "--batching_parameters_file", str(params)]
        server = ModelServer(resolve(parser.parse_args(flags)))
        server.start()  # loads the model; its sockets stay idle (requests come through fake transports)
    app = server.rest_app
    body = demo.demo_predict_body(1).encode()
    request = (b"POST /v1/models/%s:predict HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % (demo.MODEL_NAME.encode(), len(body))) + body
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    state = {"done": 0, "target": 0, "error": None}

    class Transport:  # what HttpProtocol writes to: counts answers and sends the next request at once
        def __init__(self):
            self.protocol = None

        def write(self, data: bytes) -> None:
            if not data.startswith(b"HTTP/1.1 200"):
                state["error"] = data[:300]
                loop.stop()
                return
            state["done"] += 1
            if state["done"] == state["target"]:
                loop.stop()
            if state["done"] < state["target"]:
                loop.call_soon(self.protocol.data_received, request)

        def close(self) -> None:
            pass

        def is_closing(self) -> bool:
            return False

        def get_extra_info(self, *args, **kwargs):
            return None

    def start() -> None:
        for _ in range(connections):
            transport = Transport()
            transport.protocol = HttpProtocol(app)
            transport.protocol.connection_made(transport)
            transport.protocol.data_received(request)

    def drive(n: int) -> tuple[float, float, float]:
        state.update(done=0, target=n)
        loop.call_soon(start)
        cpu, loop_cpu, wall = time.process_time(), time.thread_time(), time.perf_counter()
        loop.run_forever()
        if state["error"] is not None:
            raise RuntimeError(f"the server answered {state['error']!r}")
        return time.process_time() - cpu, time.thread_time() - loop_cpu, time.perf_counter() - wall

    settle_heap_for_serving()  # as `serve` does before its first request
    drive(max(1000, requests // 10))  # warm-up
    cpu, loop_cpu, wall = drive(requests)
    done = state["done"]
    server.stop()
    return {"requests": done, "rps": done / wall, "cpu_us": 1e6 * cpu / done, "loop_us": 1e6 * loop_cpu / done,
            "body_bytes": len(body)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=20000, help="requests per run (default 20000)")
    p.add_argument("--connections", type=int, default=64, help="concurrent fake connections (default 64)")
    p.add_argument("--repeats", type=int, default=3, help="runs per configuration; the best is reported (default 3)")
    p.add_argument("--out", default=str(ROOT / "results"), help="directory for rest_overhead.md")
    p.add_argument("--_child", choices=("0", "1"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child:
        result = one_run(args._child == "1", args.requests, args.connections)
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    started_on = machine()
    labels = dict(CONFIGS)

    def fresh_process_run(label: str, round_no: int) -> dict:  # each run in a fresh process
        cmd = [sys.executable, __file__, "--requests", str(args.requests), "--connections", str(args.connections),
               "--_child", "1" if labels[label] else "0"]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=300)
        line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
        if out.returncode != 0 or line is None:
            raise SystemExit(f"{label}: failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
        return json.loads(line[len("RESULT "):])

    def show(label: str, round_no: int, result: dict) -> None:
        log(f"run {round_no + 1}/{args.repeats} {label}: {result['rps']:,.0f} req/s, "
            f"{result['cpu_us']:.0f} µs CPU/req, event loop {result['loop_us']:.0f} µs/req")

    # The configurations take turns, so a slow spell of the machine hits all of them.
    runs = take_turns(list(labels), args.repeats, fresh_process_run, show)
    best = {label: min(results, key=lambda r: r["cpu_us"]) for label, results in runs.items()}
    table = markdown_table(
        ["configuration", "body bytes", "req/s", "CPU µs/req (all threads)", "event loop µs/req"],
        [[label, f"{r['body_bytes']:,}", f"{r['rps']:,.0f}", f"{r['cpu_us']:.0f}", f"{r['loop_us']:.0f}"]
         for label, r in best.items()])
    lines = [
        "# REST serving overhead (model call taken out)",
        "",
        f"`python3 bench/rest_overhead.py` on {started_on}: "
        f"the demo digits model's path with a session call that returns at once, {args.connections} fake "
        f"connections in a closed loop through `HttpProtocol`, {args.requests:,} requests per run, best of "
        f"{args.repeats} runs by CPU. One 28×28 uint8 image per request (JSON integers).",
        "",
        table,
    ]
    write_results("rest_overhead", "\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
