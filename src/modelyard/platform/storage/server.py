"""Run the storage API: in its own process (``python -m modelyard.platform.storage``, which the platform
starts beside itself), and the helpers the platform uses to start it and to find the files it serves.

Its own process because a transfer then never competes with the control plane for the event loop or
the GIL, and the platform's own blocking reads of ``gs://`` (artifact staging) cannot deadlock on it.
"""
from __future__ import annotations

import argparse
import asyncio
import ctypes
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from modelyard.platform.api import http_limits

ENV = "STORAGE_EMULATOR_HOST"
DEFAULT_PORT_OFFSET = 1  # default storage port: the platform's --port + 1 (8601 beside 8600)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8601, help="port (default 8601)")
    parser.add_argument("--root", required=True, help="storage root: gs://BUCKET/NAME is the file ROOT/BUCKET/NAME")
    parser.add_argument("--auth-token", default=os.environ.get("MODELYARD_PLATFORM_TOKEN"),
                        help="require 'Authorization: Bearer TOKEN' (default: $MODELYARD_PLATFORM_TOKEN)")
    parser.add_argument("--tls-cert", default=None, metavar="PEM", help="serve HTTPS with this certificate (chain)")
    parser.add_argument("--tls-key", default=None, metavar="PEM", help="the private key of --tls-cert")
    parser.add_argument("--tls-client-ca", default=None, metavar="PEM", help="mutual TLS: the clients' CA")
    http_limits.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import logging

    from modelyard.platform.storage.objects import Store
    from modelyard.platform.storage.routes import StorageRoutes

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tls = None
    if args.tls_cert or args.tls_key:
        import ssl

        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.minimum_version = ssl.TLSVersion.TLSv1_2
        tls.load_cert_chain(args.tls_cert, args.tls_key)
        if args.tls_client_ca:
            tls.load_verify_locations(args.tls_client_ca)
            tls.verify_mode = ssl.CERT_REQUIRED
    try:
        limits = http_limits.from_args(args)
    except ValueError as exc:
        print(f"modelyard storage: error: {exc}", file=sys.stderr, flush=True)
        return 2
    root = Path(args.root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    routes = StorageRoutes(Store(root), args.auth_token or None)
    # The standard event loop, not uvloop: its sendfile() is the kernel's (zero-copy downloads); uvloop has none.
    scheme = "https" if tls else "http"
    try:
        asyncio.run(_serve(routes, args.host, args.port, tls, f"{scheme}://{args.host}:{args.port}", root, limits))
    except OSError as exc:
        print(f"modelyard storage: error: {exc}", file=sys.stderr, flush=True)
        return 98 if exc.errno == 98 else 1
    return 0


async def _serve(routes, host: str, port: int, tls, url: str, root: Path, limits: http_limits.ConnLimits) -> None:
    from aiohttp import web

    # aiohttp closes a connection idle between requests after keepalive_timeout (the rule's idle part);
    # the guard bounds the rest (heads, paused bodies, silent connections, their number).
    keepalive = limits.client_timeout_s or 75.0
    runner = web.AppRunner(routes.app(), access_log=None, handler_cancellation=True, read_bufsize=READ_BUFSIZE,
                           keepalive_timeout=keepalive)
    await runner.setup()
    loop = asyncio.get_running_loop()
    guard = http_limits.Guard(limits)
    server = await loop.create_server(guard.wrap(runner.server), host, port, ssl=tls, reuse_address=True,
                                      backlog=512, ssl_handshake_timeout=limits.handshake_timeout if tls else None)
    print(f"{READY_LINE.decode()} {url}, objects under {root}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    await runner.cleanup()


# How much of a request body aiohttp buffers before it stops reading the socket. Its default, 64 KiB, is a
# quarter of one socket read (asyncio reads 256 KiB), so an upload paused and resumed reading (two epoll
# changes) after every read; 1 MiB cuts the storage process's CPU per uploaded GB by about a sixth
# (measured with bench/storage.py's layout) and holds at most 2 MiB per connection before the sender waits.
READ_BUFSIZE = 1 << 20
READY_LINE = b"modelyard storage: Cloud Storage JSON API on"  # printed once it listens


def _die_with_parent() -> None:
    """In the child: SIGTERM when the platform dies, even by SIGKILL (Linux PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass


def start_process(root: Path, host: str, port: int, token: str | None, tls_args: list[str],
                  log_path: Path, timeout: float = 30.0) -> subprocess.Popen:
    """Start the storage server as a child of the calling process and wait until it answers; an
    ``OSError`` says why it could not start (the port taken, the root unwritable)."""
    cmd = [sys.executable, "-m", "modelyard.platform.storage", "--host", host, "--port", str(port),
           "--root", str(root), *tls_args]
    env = dict(os.environ)
    env.pop("MODELYARD_PLATFORM_TOKEN", None)
    if token:
        env["MODELYARD_PLATFORM_TOKEN"] = token  # through the environment, not the command line (ps shows that)
    src = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    log = open(log_path, "ab")
    offset = log.tell()  # the log is appended to across restarts: only this start's lines count
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=_die_with_parent)
    log.close()
    deadline = time.monotonic() + timeout
    # Ready when the process itself says it listens (a connect could reach another socket on that port).
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            # Exit 98: its port was taken; said with EADDRINUSE so the caller can pick another port.
            code = errno.EADDRINUSE if proc.returncode == 98 else errno.EIO
            raise OSError(code, f"the storage server exited with {proc.returncode}: {tail.strip()}")
        with open(log_path, "rb") as f:
            f.seek(offset)
            if READY_LINE in f.read():
                return proc
        time.sleep(0.05)
    proc.kill()
    raise OSError(f"the storage server did not listen on {host}:{port} within {timeout:.0f} s (log: {log_path})")


class StorageProcess:
    """The storage server as the platform's child: started at once (``OSError`` if it cannot), started
    again by ``restart`` after a crash, stopped by ``stop``."""

    def __init__(self, root: Path, host: str, port: int, token: str | None, tls_args: list[str],
                 log_path: Path) -> None:
        self._args = (root, host, port, token, tls_args, log_path)
        self.proc = start_process(*self._args)

    def restart(self) -> None:
        self.proc = start_process(*self._args)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
