"""A real local two-node Ray cluster for the tests, started once per session and stopped after it.

Use it by asking for the ``ray_cluster`` fixture (``tests/conftest.py`` imports it, so every
test folder sees it); its value is the cluster's address, ``"127.0.0.1:PORT"``::

    def test_something(ray_cluster):
        subprocess.run([..., "--ray-address", ray_cluster], ...)   # a process of ours joins it
        # or, in this process: ray.init(address=ray_cluster) ... ray.shutdown()

The cluster is a head node and a second node (``ray start``), one CPU each, a 150 MB object
store each, no dashboard, no usage stats, every port chosen free, and its own ``--temp-dir``
(sessions, logs, sockets) under a fresh short directory. The nodes' processes inherit this
process's environment, with ``src/`` on ``PYTHONPATH``, so Ray workers import this checkout's
``modelyard``.

Teardown stops only this cluster: each ``ray start --block`` runs in its own process group
(Ray's own processes and workers stay in it), so the group is sent SIGTERM, then SIGKILL;
then any process whose command line names the cluster's temp dir is killed as well; the
teardown checks that none is left, then removes the temp dir. Never ``ray stop``: it kills
every Ray on the machine.

Without Ray installed the fixture fails saying ``pip install 'modelyard[ray]'`` (never skips).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from modelyard.ports import free_ports

SRC = Path(__file__).resolve().parents[1] / "src"
HOST = "127.0.0.1"
OBJECT_STORE_BYTES = 150 * 1024 * 1024
START_TIMEOUT_S = 180.0  # the shared machine is busy: Ray's first start imports a lot


def ray_command() -> str:
    """The ``ray`` executable next to this Python, or a failure saying how to get it."""
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.fail("Ray is not installed: pip install 'modelyard[ray]' (the tests need a real Ray cluster)")
    exe = Path(sys.executable).with_name("ray")
    found = str(exe) if exe.exists() else shutil.which("ray")
    if not found:
        pytest.fail("Ray is installed but its `ray` command is not on PATH: pip install 'modelyard[ray]'")
    return found


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def worker_port_range(size: int = 40) -> tuple[int, int]:
    """A run of free ports for Ray workers, below the kernel's ephemeral range and above Ray's
    default 10002-19999 (another cluster on this machine uses that by default)."""
    for _ in range(200):
        low = random.randrange(20_000, 32_000 - size)
        if all(_port_free(p) for p in range(low, low + size)):
            return low, low + size - 1
    raise RuntimeError("no free run of ports for Ray workers")


def node_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    parts = [str(SRC)] + [p for p in path.split(os.pathsep) if p and p != str(SRC)]
    # RAY_AUTH_MODE: `ray start` turns token auth on when ~/.ray/auth_token exists (any local ray.init()
    # writes one), and drivers joining by address then fail with InvalidAuthToken: this cluster has none.
    return {**os.environ, "PYTHONPATH": os.pathsep.join(parts), "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "disabled",
            "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


_ALIVE_SCRIPT = """
import json, sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
want, deadline = int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while True:
    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) >= want or time.monotonic() > deadline:
        break
    time.sleep(0.5)
print(json.dumps([{"id": n["NodeID"], "cpus": n["Resources"].get("CPU", 0)} for n in alive]))
"""


def alive_nodes(address: str, want: int = 1, timeout: float = 60.0) -> list[dict]:
    """The cluster's alive nodes (``id``, ``cpus``), asked by a short-lived driver process (so this
    process never becomes a Ray driver); waits up to ``timeout`` for ``want`` of them. A driver that
    cannot start (a node still starting on the busy machine) is retried until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = max(deadline - time.monotonic(), 1.0)
        proc = subprocess.run([sys.executable, "-c", _ALIVE_SCRIPT, address, str(want), str(left)],
                              env=node_env(), capture_output=True, text=True, timeout=left + 120)
        if proc.returncode == 0:
            return json.loads(proc.stdout.strip().splitlines()[-1])
        if time.monotonic() >= deadline:
            raise RuntimeError(f"asking {address} for its nodes failed: {proc.stderr[-2000:]}")
        time.sleep(2.0)


@dataclass
class RayCluster:
    """A running local cluster: its address, temp dir and the ``ray start --block`` processes."""

    address: str
    temp_dir: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def stray_pids(self) -> list[int]:
        """Processes still running whose command line names this cluster's temp dir."""
        needle = str(self.temp_dir).encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        found.append(int(entry))
            except OSError:  # exited meanwhile
                continue
        return found

    def group_pids(self) -> list[int]:
        """Processes still in one of this cluster's process groups."""
        groups = {p.pid for p in self.procs}
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.getpgid(int(entry)) in groups:
                    found.append(int(entry))
            except OSError:
                continue
        return found

    def _signal_groups(self, sig: int) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace: float = 5.0) -> None:
        """Stop this cluster's processes and only them; raises if any survives."""
        self._signal_groups(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (self.group_pids() or self.stray_pids()):
            time.sleep(0.2)
        self._signal_groups(signal.SIGKILL)
        for pid in self.stray_pids():  # e.g. a worker that left the group: it still names our temp dir
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (self.group_pids() or self.stray_pids()):
            time.sleep(0.2)
        left = sorted(set(self.group_pids()) | set(self.stray_pids()))
        if left:
            raise RuntimeError(f"Ray processes of {self.temp_dir} still running after stop: {left}")
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _start_node(ray: str, args: list[str], log: Path) -> subprocess.Popen:
    # Its own session (and so process group): teardown signals the group, nothing else.
    with open(log, "ab") as out:
        return subprocess.Popen([ray, "start", "--block", *args], env=node_env(), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def node_args(temp_dir: Path, head: bool) -> list[str]:
    """``ray start`` flags for one node of the test cluster: one CPU, small store, free ports."""
    names = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port"]
    if head:
        names += ["--port", "--ray-client-server-port"]
    ports = free_ports(len(names), HOST)
    low, high = worker_port_range()
    args = [f"{name}={port}" for name, port in zip(names, ports)]
    args += [f"--min-worker-port={low}", f"--max-worker-port={high}", "--num-cpus=1",
             f"--object-store-memory={OBJECT_STORE_BYTES}", f"--node-ip-address={HOST}",
             f"--temp-dir={temp_dir}", "--disable-usage-stats", "--log-style=record"]
    if head:
        args += ["--head", "--include-dashboard=false"]
    return args


def start_cluster(nodes: int = 2) -> RayCluster:
    """Start a head node and ``nodes - 1`` more, wait until all are alive; stop them on failure."""
    ray = ray_command()
    # Short: Ray's Unix socket paths live under it and must stay under 108 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="myray-", dir="/tmp"))
    head = node_args(temp_dir, head=True)
    port = next(a.split("=")[1] for a in head if a.startswith("--port="))
    cluster = RayCluster(f"{HOST}:{port}", temp_dir)
    try:
        cluster.procs.append(_start_node(ray, head, temp_dir / "head.log"))
        alive_nodes(cluster.address, 1, START_TIMEOUT_S)  # the head must answer before others join
        for k in range(1, nodes):
            worker = node_args(temp_dir, head=False) + [f"--address={cluster.address}"]
            cluster.procs.append(_start_node(ray, worker, temp_dir / f"node{k}.log"))
        alive = alive_nodes(cluster.address, nodes, START_TIMEOUT_S)
        dead = [p.args for p in cluster.procs if p.poll() is not None]
        if len(alive) < nodes or dead:
            logs = "\n".join(p.read_text()[-1500:] for p in sorted(temp_dir.glob("*.log")))
            raise RuntimeError(f"Ray cluster at {cluster.address}: {len(alive)} of {nodes} nodes alive; "
                               f"exited: {dead}\n{logs}")
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="session")
def ray_cluster():
    """The address (``HOST:PORT``) of a real local two-node Ray cluster, one CPU per node."""
    cluster = start_cluster(2)
    try:
        yield cluster.address
    finally:
        cluster.stop()
