""""Open in TensorBoard" from the console: the open-source TensorBoard, started by the platform on demand,
showing one TensorBoard resource's scalar time series (as Vertex's managed TensorBoard does).

Each open writes the resource's scalars (every point, read through the platform's REST API with
``exportTensorboardTimeSeries``) as TensorBoard event files, one folder per TensorBoard experiment and run,
under the platform's state directory, and starts ``python -m tensorboard.main`` over that folder once per
resource (later opens rewrite the files; TensorBoard reloads them). The processes listen on loopback only and
are stopped with the platform.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

READY_TIMEOUT_S = 90.0


async def _get(session: aiohttp.ClientSession, url: str, headers: dict, method: str = "GET",
               body: dict | None = None) -> dict:
    async with session.request(method, url, headers=headers, json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{method} {url}: {r.status} {await r.text()}")
        return await r.json()


async def export_scalars(session: aiohttp.ClientSession, base: str, headers: dict, tensorboard: str,
                         out: Path) -> int:
    """Every scalar series of ``tensorboard`` (a resource name) as event files under ``out``
    (``{experiment}/{run}/``), replacing what was there; the number of points written."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    fresh = out.with_name(out.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    written = 0
    exps = (await _get(session, f"{base}/v1/{tensorboard}/experiments?pageSize=1000", headers)).get(
        "tensorboardExperiments", [])
    for exp in exps:
        runs = (await _get(session, f"{base}/v1/{exp['name']}/runs?pageSize=1000", headers)).get("tensorboardRuns", [])
        for run in runs:
            listed = (await _get(session, f"{base}/v1/{run['name']}/timeSeries?pageSize=1000", headers)).get(
                "tensorboardTimeSeries", [])
            writer = EventFileWriter(str(fresh / exp["name"].rsplit("/", 1)[1] / run["name"].rsplit("/", 1)[1]))
            for series in (s for s in listed if s.get("valueType") == "SCALAR"):
                token = ""
                while True:
                    page = await _get(session, f"{base}/v1/{series['name']}:exportTensorboardTimeSeries", headers,
                                      "POST", {"pageSize": 10000, **({"pageToken": token} if token else {})})
                    for p in page.get("timeSeriesDataPoints", []):
                        value = summary_pb2.Summary.Value(tag=series["displayName"],
                                                          simple_value=float(p["scalar"]["value"]))
                        writer.add_event(event_pb2.Event(wall_time=_seconds(p.get("wallTime")), step=int(p["step"]),
                                                         summary=summary_pb2.Summary(value=[value])))
                        written += 1
                    token = page.get("nextPageToken", "")
                    if not token:
                        break
            writer.close()
    shutil.rmtree(out, ignore_errors=True)
    fresh.mkdir(parents=True, exist_ok=True)
    fresh.rename(out)
    return written


def _seconds(rfc3339: str | None) -> float:
    if not rfc3339:
        return time.time()
    from datetime import datetime

    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launcher:
    """The TensorBoard processes of one platform, one per TensorBoard resource, under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[str, tuple[subprocess.Popen, int]] = {}
        self._lock = asyncio.Lock()

    async def open(self, session: aiohttp.ClientSession, base: str, headers: dict, tensorboard: str) -> str:
        """The URL of a TensorBoard showing ``tensorboard``'s scalars as they are now."""
        async with self._lock:  # one export and one start at a time per platform
            key = tensorboard.rsplit("/", 1)[1]
            logdir = self.root / key
            await export_scalars(session, base, headers, tensorboard, logdir)
            running = self.procs.get(key)
            if running is None or running[0].poll() is not None:
                port = _free_port()
                log = open(self.root / f"{key}.log", "wb")
                proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
                                         "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "2"],
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)  # its data server too: stopped as a group
                log.close()
                self.procs[key] = running = (proc, port)
            proc, port = running
            url = f"http://127.0.0.1:{port}/"
            deadline = time.monotonic() + READY_TIMEOUT_S
            while True:
                if proc.poll() is not None:
                    tail = (self.root / f"{key}.log").read_text(errors="replace")[-1500:]
                    raise RuntimeError(f"TensorBoard exited with code {proc.returncode}: {tail}")
                try:
                    async with session.get(url + "data/runs") as r:
                        if r.status == 200:
                            return url
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"TensorBoard did not answer within {READY_TIMEOUT_S:.0f} s")
                await asyncio.sleep(0.2)

    def stop(self) -> None:
        """Every TensorBoard and its data server; what they hold is files we wrote, so SIGKILL after a short
        grace is safe (TensorBoard can take seconds to leave after SIGTERM)."""
        for proc, _port in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        for proc, _port in self.procs.values():
            try:
                proc.wait(2)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            _signal_group(proc, signal.SIGKILL)  # a data server left behind by its parent
        self.procs.clear()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
