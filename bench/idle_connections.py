"""Idle neighbours against an active client on the platform's two HTTP ports (issue 43, finding 11).

    python3 bench/idle_connections.py                  # 10,000 idle connections, 300 requests per phase
    python3 bench/idle_connections.py --idle 2000 --requests 100 --out /tmp/idle.md

For the storage port (``python -m modelyard.platform.storage``) and the API port of a ``modelyard
platform`` (default flags: ``--max_connections 4096``, ``--client_timeout_seconds 60``), an active
client makes ``--requests`` calls, each on a new connection (the case a full server refuses), first
with nothing else connected, then while ``--idle`` other connections are held open by clients that
stay silent after connecting, and by clients that made one request and keep the connection idle. Reported per phase: the active client's failures and latency, and how many of the idle
connections the server closed to make room. The issue's target: idle clients cost an active client
no request.
"""
from __future__ import annotations

import argparse
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from harness import (Service, command_line, free_port, http_ok, latency_summary, log, machine,  # noqa: E402
                     markdown_table, modelyard_platform, write_results)


def active(url: str, n: int) -> tuple[int, dict]:
    """``n`` calls, each on its own connection: (failures, latency summary of the successes)."""
    failures, took = 0, []
    for _ in range(n):
        start = time.perf_counter()
        try:
            r = requests.get(url, timeout=10, headers={"Connection": "close"})
            if r.status_code == 200:
                took.append(time.perf_counter() - start)
                continue
        except requests.RequestException:
            pass
        failures += 1
    return failures, latency_summary(took)


def hold(port: int, n: int, first_request: bytes | None) -> list[socket.socket]:
    """``n`` connections, silent after connecting or after one request whose answer they read."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        if first_request is not None:
            s.sendall(first_request)
            s.settimeout(10)
            try:
                s.recv(65536)
            except OSError:
                pass
        socks.append(s)
    return socks


def still_open(socks: list[socket.socket]) -> int:
    """How many the server has not closed (a closed one reads EOF or a reset at once)."""
    count = 0
    for s in socks:
        s.setblocking(False)
        try:
            if s.recv(1, socket.MSG_PEEK):
                count += 1
        except BlockingIOError:
            count += 1
        except OSError:
            pass
    return count


def measure(label: str, url: str, port: int, args, kinds) -> list[list]:
    rows = []
    failures, lat = active(url, args.requests)
    rows.append([label, 0, "-", args.requests, failures, f"{lat['p50_ms']:.1f}", f"{lat['p99_ms']:.1f}", "-"])
    for kind, first in kinds:
        log(f"{label}: holding {args.idle} connections ({kind})")
        socks = hold(port, args.idle, first)
        failures, lat = active(url, args.requests)
        closed = args.idle - still_open(socks)
        rows.append([label, args.idle, kind, args.requests, failures, f"{lat['p50_ms']:.1f}", f"{lat['p99_ms']:.1f}",
                     closed])
        for s in socks:
            s.close()
        time.sleep(1)  # the server sees them go before the next phase
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=10_000, help="idle connections held (default 10000)")
    parser.add_argument("--requests", type=int, default=300, help="active calls per phase (default 300)")
    parser.add_argument("--out", default=None, help="results file (default bench/results/idle_connections.md)")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process holds the idle connections
    if hard < args.idle + 256:
        parser.error(f"the descriptor limit ({hard}) is too low for --idle {args.idle}")
    silent = ("silent after connecting", None)
    keep_alive = ("idle after one request", b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    rows = []
    with tempfile.TemporaryDirectory(prefix="idle-") as tmp:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with Service("storage", [sys.executable, "-m", "modelyard.platform.storage", "--root", f"{tmp}/root",
                                 "--port", str(port)], Path(tmp) / "storage.log", ready=http_ok(url + "/healthz")):
            rows += measure("storage", url + "/healthz", port, args, [silent, keep_alive])
        with modelyard_platform(Path(tmp) / "platform", "--no-warm-spare") as p:
            rows += measure("platform API", p.base + "/v1/projects/local/locations/us-central1/models", p.port, args,
                            [silent, keep_alive])
    text = "\n\n".join([
        "# Idle connections against an active client (platform ports' connection limits)",
        machine(),
        f"`{command_line()}`: default limits (`--max_connections 4096`, `--client_timeout_seconds 60`); the "
        "active client opens a new connection per call.",
        markdown_table(["port", "idle connections", "idle clients", "active calls", "failed", "p50 ms", "p99 ms",
                        "idle closed by the server"], rows),
    ])
    write_results("idle_connections", text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
