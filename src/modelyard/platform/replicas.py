"""The local engine: replicas are ``modelyard serve`` processes on this host.

The platform talks to them only through their process ids and HTTP: it starts one per replica
on free ports, waits until TF Serving's status API says the model is AVAILABLE, checks it is still
alive, and stops it with SIGTERM (SIGKILL after a grace period). Replicas run in their own session,
so they outlive a platform that is killed, and the next platform adopts them from the store.
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from modelyard.platform.errors import ApiError

MODEL = "model"  # the name every replica serves its one model under
START_TIMEOUT_S = 180.0


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def pid_alive(pid: int, port: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, given ``port``, is the replica serving it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        if state in (b"Z", b"X"):
            return False
        if port is not None:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f"--rest_api_port\x00{port}\x00".encode() not in f.read():
                    return False  # the pid was reused by another process
        return True
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class LocalEngine:
    """Starts, checks and stops replica processes on this host."""

    def __init__(self, state_dir: Path, host: str = "127.0.0.1", serve_args: list[str] | None = None) -> None:
        self.state_dir = state_dir
        self.host = host
        self.serve_args = list(serve_args or [])
        self._children: dict[int, subprocess.Popen] = {}
        self.session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def start(self, replica_id: str, dm_id: str, model_path: Path) -> dict:
        """Start a replica serving ``model_path``; returns its row once the model is AVAILABLE."""
        rdir = self.state_dir / "replicas" / replica_id
        base = rdir / MODEL
        base.mkdir(parents=True, exist_ok=True)
        link = base / "1"  # TF Serving wants version directories under a base path
        if not link.exists():
            link.symlink_to(model_path, target_is_directory=True)
        port, grpc_port = _free_port(self.host), _free_port(self.host)
        log_path = rdir / "serve.log"
        cmd = [sys.executable, "-m", "modelyard", "serve", "--model_name", MODEL, "--model_base_path", str(base),
               "--host", self.host, "--rest_api_port", str(port), "--port", str(grpc_port),
               "--file_system_poll_wait_seconds", "0", *self.serve_args]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
        self._children[proc.pid] = proc
        row = {"id": replica_id, "deployed_model_id": dm_id, "host": self.host, "port": port,
               "grpc_port": grpc_port, "pid": proc.pid, "log_path": str(log_path), "created": time.time()}
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._children.pop(proc.pid, None)
                raise ApiError("FAILED_PRECONDITION",
                               f"replica for deployed model {dm_id} exited with code {proc.returncode} while "
                               f"loading {model_path}: {_tail(log_path)}")
            available, error = await self._status(row)
            if available:
                return row
            if error:
                await self.stop(row)
                raise ApiError("FAILED_PRECONDITION", f"replica for deployed model {dm_id} could not load "
                               f"{model_path}: {error}")
            await asyncio.sleep(0.25)
        await self.stop(row)
        raise ApiError("DEADLINE_EXCEEDED", f"replica for deployed model {dm_id} did not become AVAILABLE "
                       f"within {START_TIMEOUT_S:.0f} s: {_tail(log_path)}")

    async def healthy(self, row: dict) -> bool:
        """TF Serving's model status says AVAILABLE."""
        return (await self._status(row))[0]

    async def _status(self, row: dict) -> tuple[bool, str | None]:
        """(AVAILABLE?, the load error TF Serving's status API reports, if the version ended with one)."""
        assert self.session is not None
        try:
            async with self.session.get(f"http://{row['host']}:{row['port']}/v1/models/{MODEL}",
                                        timeout=aiohttp.ClientTimeout(total=2)) as resp:
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return False, None
        versions = body.get("model_version_status", []) if isinstance(body, dict) else []
        if any(v.get("state") == "AVAILABLE" for v in versions):
            return True, None
        for v in versions:
            status = v.get("status") or {}
            if v.get("state") == "END" and status.get("error_code", "OK") != "OK":
                return False, status.get("error_message") or status["error_code"]
        return False, None

    def alive(self, row: dict) -> bool:
        proc = self._children.get(row["pid"])
        if proc is not None:
            if proc.poll() is None:
                return True
            self._children.pop(row["pid"], None)
            return False
        return pid_alive(row["pid"], row["port"])

    async def stop(self, row: dict, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; waits until the process is gone."""
        pid = row["pid"]
        if not self.alive(row):
            self._children.pop(pid, None)
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while self.alive(row) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if self.alive(row):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            while self.alive(row):
                await asyncio.sleep(0.05)
        self._children.pop(pid, None)


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) + f" (log: {path})"
