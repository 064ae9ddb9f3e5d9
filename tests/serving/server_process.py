"""Start a real ``modelyard serve`` process on free loopback ports and stop it for sure."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
TESTDATA = (REPO.parent / "shared" / "testdata" / "tfserving").resolve()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, *flags: str, log_dir: Path, env: dict | None = None):
        self.grpc_port = free_port()
        self.rest_port = free_port()
        self.log_path = log_dir / f"server-{self.rest_port}.log"
        cmd = [
            sys.executable, "-m", "modelyard", "serve", "--host", "127.0.0.1",
            "--port", str(self.grpc_port), "--rest_api_port", str(self.rest_port), *flags,
        ]
        full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env,
                                     start_new_session=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                requests.get(self.base + "/v1/models/x", timeout=1)
                return self
            except requests.ConnectionError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()

    def __enter__(self) -> "ServerProcess":
        return self.wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
