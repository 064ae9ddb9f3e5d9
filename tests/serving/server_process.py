"""Start a real ``modelyard serve`` process on free loopback ports and stop it for sure."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from modelyard.ports import PORT_TAKEN_EXIT, free_port
from tests.warm_process import popen_python



class ServerProcess:
    # A port found free can be taken before the server binds it (another process's outgoing
    # connection gets it as its ephemeral port): a server that says so is started again on new ports.
    BIND_RETRIES = 3

    def __init__(self, *flags: str, log_dir: Path, env: dict | None = None, warm: bool = True):
        """``warm``: forked from the worker's warm interpreter (tests/warm_process.py); a test about
        how the server starts (imports, start-up output) passes False."""
        self.flags, self.log_dir, self.warm = flags, log_dir, warm
        self.env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
        self._start()

    def _start(self) -> None:
        self.grpc_port = free_port()
        self.rest_port = free_port()
        self.log_path = self.log_dir / f"server-{self.rest_port}.log"
        cmd = [
            sys.executable, "-m", "modelyard", "serve", "--host", "127.0.0.1",
            "--port", str(self.grpc_port), "--rest_api_port", str(self.rest_port), *self.flags,
        ]
        self._log = open(self.log_path, "wb")  # the process appends to it
        self.proc = popen_python(cmd, self.env, self.log_path, warm=self.warm)

    def _lost_its_port(self) -> bool:
        return self.proc.returncode == PORT_TAKEN_EXIT

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def probe(self) -> None:
        """One readiness check: raises requests.RequestException while the server is not answering."""
        requests.get(self.base + "/v1/models/x", timeout=1)

    def wait_ready(self, timeout: float = 120) -> "ServerProcess":
        """Wait until the REST port answers; on any failure (exit, timeout, error) stop everything first."""
        try:
            deadline = time.monotonic() + timeout
            retries = self.BIND_RETRIES
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    if retries and self._lost_its_port():
                        retries -= 1
                        self._log.close()
                        self._start()
                        continue
                    raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
                try:
                    self.probe()
                    return self
                except requests.RequestException:  # refused, or accepted but not answering yet
                    time.sleep(0.2)
            raise TimeoutError(f"server not ready after {timeout}s:\n{self.log()[-3000:]}")
        except BaseException:
            self.stop()
            raise

    def _group_alive(self) -> bool:
        """Whether any live (not zombie) process is left in the server's process group."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
            if fields[0] != "Z" and int(fields[2]) == self.proc.pid:
                return True
        return False

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self) -> None:
        """Stop the server and every process of its group (worker children too), for sure. Idempotent."""
        try:
            if self.proc.poll() is None:
                self._signal_group(signal.SIGTERM)
                try:
                    self.proc.wait(15)
                except subprocess.TimeoutExpired:
                    self._signal_group(signal.SIGKILL)
                    self.proc.wait(5)
            # Children may outlive the main process (it crashed, or it did not wait for them):
            # a moment to follow it, then whatever is left of the group is killed.
            deadline = time.monotonic() + 5
            while self._group_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._group_alive():
                self._signal_group(signal.SIGKILL)
        finally:
            if not self._log.closed:
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
