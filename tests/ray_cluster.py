"""A real local two-node Ray cluster for the tests, started once per session and stopped after it.

Use it by asking for the ``ray_cluster`` fixture (``tests/conftest.py`` imports it, so every
test folder sees it); its value is the cluster's address, ``"127.0.0.1:PORT"``::

    def test_something(ray_cluster):
        subprocess.run([..., "--ray-address", ray_cluster], ...)   # a process of ours joins it
        # or, in this process: ray.init(address=ray_cluster) ... ray.shutdown()

The cluster is a head node and a second node (``ray start``), one CPU each, a 150 MB object
store each, no dashboard, no usage stats, no log monitor nor metrics (``QUIET_ENV``: less CPU while idle), every port chosen among those no socket uses (``unbound_ports``), and its own ``--temp-dir``
(sessions, logs, sockets) under a fresh short directory. The nodes' processes inherit this
process's environment, with ``src/`` on ``PYTHONPATH``, so Ray workers import this checkout's
``modelyard`` (as a machine with ``pip install modelyard`` would).

The cluster is honest about disks: the head runs on this host as the platform does, but every
other node runs in its own mount namespace (``unshare --mount --propagation private``; the tests
run as root) where ``/tmp``, ``/dev/shm``, the pytest base temp dir (every test's models, platform
state dirs, storage roots), the modelyard cache and the directories of ``HIDDEN_ENV`` are empty
tmpfs mounts. What the head wrote there, the other node cannot see: code that assumes a shared
disk fails on it, as it would on a second machine. The checkout and the Python installation stay
visible (they are what ``pip install`` gives every machine). A node's own files can be read from
outside through ``/proc/<pid>/root`` (``RayCluster.node_root``).

No network namespace: every node listens on 127.0.0.1. A node dies by SIGKILL of every process in
its mount namespace (``RayCluster.kill_node``: its raylet, workers and their children), which is
what the tests need; cutting a node's network while its processes live is not simulated here.

The head is started with Ray's node health check tightened (``HEALTH_CHECK_ENV``: a node missing
5 checks 1 s apart is dead) so a killed node is declared dead in seconds, not Ray's default ~30 s.

Teardown stops only this cluster: each ``ray start --block`` runs in its own process group
(Ray's own processes and workers stay in it), so the group is sent SIGTERM, then SIGKILL;
then any process whose command line names the cluster's temp dir is killed as well; the
teardown checks that none is left, then removes the temp dir. Never ``ray stop``: it kills
every Ray on the machine.

Without Ray installed the fixture fails saying ``pip install 'modelyard[ray]'`` (never skips).
"""
from __future__ import annotations

import atexit
import json
import os
import random
import select
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


def _ports_in_use() -> set[int]:
    """Local ports of every TCP socket of this machine (any state, any address), from /proc/net."""
    used = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        used.update(int(line.split()[1].rsplit(":", 1)[1], 16) for line in lines if line.strip())
    return used


_handed: set[int] = set()
# The test cluster's ports come from 5000-9999: below Ray's default worker ports (10002-19999, any other
# Ray on this machine) and apart from modelyard.ports' slices (20000-32767, which the suite's xdist
# workers and everything they start pick from), so neither can take a port the other was told to use.
# Known defaults in that range stay out (PostgreSQL, TF Serving, the platform, Ray's own).
RAY_TEST_PORTS = (5000, 10_000)
_DEFAULTS = {5432, 6379, 8000, 8080, 8265, 8500, 8501, 8600, 8601, 8888}


def unbound_ports(count: int) -> list[int]:
    """``count`` ports no socket uses now, from ``RAY_TEST_PORTS``, chosen without binding
    them: on this sandboxed machine a port a process bound and released stays taken for other processes
    for seconds (a bind-to-0 pick, as modelyard.ports makes, made Ray's GCS fail with EADDRINUSE)."""
    used = _ports_in_use() | _handed | _DEFAULTS
    picked: list[int] = []
    while len(picked) < count:
        port = random.randrange(*RAY_TEST_PORTS)
        if port not in used and port not in picked:
            picked.append(port)
    _handed.update(picked)
    return picked


def worker_port_range(size: int = 40) -> tuple[int, int]:
    """A run of free ports for Ray workers, from ``RAY_TEST_PORTS``."""
    for _ in range(200):
        low = random.randrange(RAY_TEST_PORTS[0], RAY_TEST_PORTS[1] - size)
        run = set(range(low, low + size))
        if not run & (_ports_in_use() | _handed | _DEFAULTS):
            _handed.update(run)
            return low, low + size - 1
    raise RuntimeError("no free run of ports for Ray workers")


# Ray's own settings for the head (read from RAY_<name> at start): how soon a silent node is declared dead.
# Not tighter: on the busy machine a live node's check can take seconds, and a node declared dead by
# mistake loses its raylet (with a 1 s timeout and 3 misses the head failed to start 3 times in a row at load 20).
HEALTH_CHECK_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "3000",
                    "RAY_health_check_failure_threshold": "5"}
# What the cluster's own processes do while idle, which no test reads, made rarer or switched off (an
# idle two-node cluster used 3.2 CPU-s a minute with Ray's defaults, 1.6 with these and without the log
# monitor, ``node_args``), for the most part of a test run that it stays up: the metrics every process
# exports to its node's agent, the event loops' stats, the agent's psutil report of the node (every 5 s).
QUIET_ENV = {"RAY_enable_metrics_collection": "0", "RAY_event_stats": "0", "REPORTER_UPDATE_INTERVAL_MS": "60000"}
# Extra directories (os.pathsep-separated) the non-head nodes must not see, e.g. a --basetemp elsewhere.
HIDDEN_ENV = "MODELYARD_TEST_RAY_HIDE"
NODE_TMPFS_SIZE = "1g"


def node_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    parts = [str(SRC)] + [p for p in path.split(os.pathsep) if p and p != str(SRC)]
    # RAY_AUTH_MODE: `ray start` turns token auth on when ~/.ray/auth_token exists (any local ray.init()
    # writes one), and drivers joining by address then fail with InvalidAuthToken: this cluster has none.
    return {**os.environ, "PYTHONPATH": os.pathsep.join(parts), "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "disabled",
            # The busy shared machine: a node's agents can take more than Ray's default to start.
            "RAY_raylet_start_wait_time_s": "120", "RAY_agent_register_timeout_ms": "120000",
            "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", **QUIET_ENV}


# A long-lived driver answering questions about one cluster, one JSON line each ({"op": "nodes", "want",
# "timeout"}, {"op": "held", "timeout"} or {"op": "run", "script", "args", "timeout"}), each answer on a
# RESULT line. It joins the namespace the platform's replica actors live in ("modelyard"), so a "run"
# script (``ask_driver``) finds them by name as its own ``ray.init(..., namespace="modelyard")`` would.
_ASK_SERVER = r"""
import contextlib, io, json, sys, time, traceback, ray
ray.init(address=sys.argv[1], namespace="modelyard", logging_level="ERROR", log_to_driver=False)
def _init(*args, namespace=None, **kwargs):  # a "run" script's own ray.init: this driver is connected already
    assert namespace in (None, "modelyard"), f"ask_driver's driver is in namespace 'modelyard', not {namespace!r}"
ray.init = _init
print("READY", flush=True)
for line in sys.stdin:
    ask = json.loads(line)
    deadline = time.monotonic() + ask["timeout"]
    if ask["op"] == "run":  # a driver script, run here: what it printed, or how it failed
        printed, error = io.StringIO(), None
        sys.argv = ["-c", *ask["args"]]
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(ask["script"], "<ask_driver>", "exec"), {"__name__": "__main__", "RESULT": "RESULT "})
        except BaseException:
            error = traceback.format_exc()[-3000:]
        answer = {"printed": printed.getvalue()[-20000:], "error": error}
    elif ask["op"] == "nodes":  # the alive nodes, once `want` of them are (or the time is up)
        while True:
            alive = [n for n in ray.nodes() if n["Alive"]]
            if len(alive) >= ask["want"] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        answer = [{"id": n["NodeID"], "cpus": n["Resources"].get("CPU", 0), "port": n["NodeManagerPort"]}
                  for n in alive]
    else:  # "held": [] once every CPU is free; else, when the time is up, the alive actors
        answer = []
        while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
            if time.monotonic() > deadline:
                from ray.util.state import list_actors
                answer = [(a.class_name, a.name, a.node_id[:12])
                          for a in list_actors(filters=[("state", "=", "ALIVE")])] or ["(tasks, no actor)"]
                break
            time.sleep(0.2)
    print("RESULT " + json.dumps(answer), flush=True)
"""


class _Asker:
    """One Ray driver process per cluster, kept for the session and asked over a pipe (this process
    never becomes a driver). A driver's start costs about a CPU-second and 1-3 s of wall time, and the
    tests ask before every test that uses the cluster (``before_test``) and in their wait loops."""

    def __init__(self, address: str, timeout: float):
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-c", _ASK_SERVER, address], env=node_env(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err)
        self._buffer = b""
        self._line_starting(b"READY", timeout)

    def ask(self, op: str, timeout: float, **kwargs) -> object:
        self.proc.stdin.write((json.dumps({"op": op, "timeout": timeout, **kwargs}) + "\n").encode())
        self.proc.stdin.flush()
        return json.loads(self._line_starting(RESULT.encode(), timeout + 120)[len(RESULT):])

    def _line_starting(self, prefix: bytes, within: float) -> bytes:
        """The next stdout line starting with ``prefix`` (Ray may print its own warnings there too)."""
        deadline = time.monotonic() + within
        fd = self.proc.stdout.fileno()
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line, self._buffer = self._buffer[:end], self._buffer[end + 1:]
                if line.startswith(prefix):
                    return line
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the Ray driver gave no {prefix.decode().strip()} line in {within:.0f} s")
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    self._err.seek(0)
                    raise EOFError(f"the Ray driver exited: {self._err.read()[-2000:].decode(errors='replace')}")
                self._buffer += chunk

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self._err):
            stream.close()


_ASKERS: dict[str, _Asker] = {}


def ask_cluster(address: str, op: str, timeout: float, **kwargs) -> object:
    """``op`` answered by the session's driver for ``address``, started on first use; one that fails
    (a cluster still starting, a driver that died) is dropped, and the next call starts another."""
    asker = _ASKERS.get(address)
    try:
        if asker is None:
            asker = _ASKERS[address] = _Asker(address, 120.0)
        return asker.ask(op, timeout, **kwargs)
    except (OSError, EOFError, TimeoutError, ValueError):
        forget_cluster(address)
        raise


def forget_cluster(address: str) -> None:
    """Stop the driver asking ``address``, if any (its cluster stops, or it failed)."""
    asker = _ASKERS.pop(address, None)
    if asker is not None:
        asker.close()


atexit.register(lambda: [forget_cluster(address) for address in list(_ASKERS)])


def alive_nodes(address: str, want: int = 1, timeout: float = 60.0) -> list[dict]:
    """The cluster's alive nodes (``id``, ``cpus``, ``port``: its node manager's), asked by the session's
    driver process for it (``ask_cluster``); waits up to ``timeout`` for ``want`` of them. A driver that
    cannot start or answer (a node still starting on the busy machine) is retried until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ask_cluster(address, "nodes", max(deadline - time.monotonic(), 1.0), want=want)
        except (OSError, EOFError, TimeoutError, ValueError) as exc:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"asking {address} for its nodes failed: {exc}") from None
        time.sleep(2.0)


RESULT = "RESULT "  # a driver script's answer line: Ray may print its own warnings to stdout too


def ask_driver(script: str, address: str, *args: str, timeout: float = 180.0) -> object:
    """Runs ``script`` in the session's driver for the cluster at ``address`` (``ask_cluster``: this process
    never becomes a driver, and no fresh Python starts Ray for each question, which cost about 1.5 CPU-s
    each in the tests' wait loops) and returns the JSON on its ``RESULT`` line (``print(RESULT +
    json.dumps(...))``; the script sees ``RESULT`` defined and ``sys.argv[1:] == [address, *args]``).
    Its own ``ray.init(address=...)`` does nothing there: that driver is in the "modelyard" namespace."""
    done = ask_cluster(address, "run", timeout, script=script, args=[address, *args])
    assert done["error"] is None, done["error"]
    lines = [line for line in done["printed"].splitlines() if line.startswith(RESULT)]
    assert lines, f"the driver script printed no {RESULT.strip()} line: {done['printed'][-1500:]}"
    return json.loads(lines[-1][len(RESULT):])


@dataclass
class RayCluster:
    """A running local cluster: its address, temp dir and the ``ray start --block`` processes."""

    address: str
    temp_dir: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)  # what the non-head nodes see as empty
    ports: dict[int, int] = field(default_factory=dict)  # ray start pid -> its node manager port

    @property
    def head(self) -> subprocess.Popen:
        return self.procs[0]

    def workers(self) -> list[subprocess.Popen]:
        """The non-head nodes still running."""
        return [p for p in self.procs[1:] if p.poll() is None]

    def add_node(self, timeout: float = START_TIMEOUT_S, attempts: int = 3) -> subprocess.Popen:
        """Start one more node in its own mount namespace and wait until the cluster counts it alive
        (a node that exits while starting, its free ports taken meanwhile, is tried again)."""
        want = len(self.running_nodes()) + 1
        for attempt in range(attempts):
            k = len(self.procs)
            args = node_args(self.temp_dir, head=False) + [f"--address={self.address}"]
            proc = _start_isolated_node(ray_command(), args, self.temp_dir, self.hidden,
                                        self.temp_dir / f"node{k}.log")
            self.procs.append(proc)
            self.ports[proc.pid] = int(_flag(args, "--node-manager-port"))
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                if self.ports[proc.pid] in {n["port"] for n in alive_nodes(self.address, want, 20)}:
                    return proc
            if proc.poll() is None or attempt == attempts - 1:
                raise RuntimeError(f"node {k} did not join {self.address}:\n"
                                   f"{(self.temp_dir / f'node{k}.log').read_text()[-2000:]}")
            self.procs.remove(proc)  # exited: its pid is no node of ours any more
        raise AssertionError("unreachable")

    def running_nodes(self) -> list[dict]:
        """Alive nodes whose processes run: a killed node stays alive to Ray until its health checks fail."""
        running = {self.ports.get(p.pid) for p in self.procs if p.poll() is None}
        # Wait (briefly) for every running node to be listed: counting too few would start one more.
        return [n for n in alive_nodes(self.address, len(running), 30.0) if n["port"] in running]

    def node_id(self, proc: subprocess.Popen) -> str:
        """The Ray node id of the node ``proc`` started (found by its node manager port)."""
        port = self.ports[proc.pid]
        return next(n["id"] for n in alive_nodes(self.address) if n["port"] == port)

    def node_of(self, node_id: str) -> subprocess.Popen | None:
        """The running node process with Ray node id ``node_id``."""
        by_port = {n["port"]: n["id"] for n in alive_nodes(self.address)}
        return next((p for p in self.procs if p.poll() is None and by_port.get(self.ports.get(p.pid)) == node_id),
                    None)

    def node_root(self, proc: subprocess.Popen) -> Path:
        """The node's file system as its processes see it (its own tmpfs mounts included)."""
        return Path(f"/proc/{proc.pid}/root")

    def node_pids(self, proc: subprocess.Popen) -> list[int]:
        """Every process of a non-head node: those in its mount namespace."""
        try:
            ns = os.readlink(f"/proc/{proc.pid}/ns/mnt")
        except OSError:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.readlink(f"/proc/{entry}/ns/mnt") == ns:
                        found.append(int(entry))
                except OSError:
                    continue
        return found

    def kill_node(self, proc: subprocess.Popen, timeout: float = 30.0) -> None:
        """The node dies at once: SIGKILL to its raylet, workers and their children (no clean shutdown)."""
        if proc is self.head:
            raise ValueError("killing the head ends the cluster; kill a worker node")
        pids = self.node_pids(proc)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=timeout)
        deadline = time.monotonic() + timeout
        while any(_pid_alive(pid) for pid in pids):
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes of the killed node still run: {[p for p in pids if _pid_alive(p)]}")
            time.sleep(0.1)

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

    def stop(self, grace: float = 1.0) -> None:
        """Stop this cluster's processes and only them; raises if any survives. A short grace: Ray's node
        processes (``ray start --block``, gcs_server, raylet, agents) were all still running 6 s after the
        SIGTERM (load 18), so a longer one only delayed the SIGKILL that ends them."""
        forget_cluster(self.address)
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


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _flag(args: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(name + "="))


def _start_node(ray: str, args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    # Its own session (and so process group): teardown signals the group, nothing else.
    with open(log, "ab") as out:
        return subprocess.Popen([ray, "start", "--block", *args], env=env or node_env(), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


# Run as the node's first process, inside its new mount namespace: empty tmpfs over every hidden
# directory (deepest first, so a nested one is hidden too), the node's own temp dir, then Ray.
_ISOLATE = """set -e
size="$1"; temp="$2"; shift 2
while [ "$1" != "--" ]; do
  mkdir -p "$1"  # a directory the head has not made yet (the cache) must still be the node's own
  mount -t tmpfs -o "size=$size" modelyard-node "$1"
  shift
done
shift
mkdir -p "$temp"
exec "$@"
"""


def hidden_dirs(extra: list[str]) -> list[str]:
    """What a non-head node sees as empty: temp dirs, shared memory, the modelyard cache, ``extra``."""
    from modelyard.demo import default_cache_dir

    found = ["/tmp", "/dev/shm", tempfile.gettempdir(), str(default_cache_dir())]
    found += [p for p in os.environ.get(HIDDEN_ENV, "").split(os.pathsep) if p] + extra
    unique = {str(Path(p).resolve()) for p in found}
    # What a second machine has installed too: the Python (a CI venv may live under /tmp) and this
    # checkout. A folder holding one of them stays visible; the test dirs inside it are hidden one by
    # one (the base temp, the cache, ``extra``), so what the head's tests write stays out of sight.
    keep = [Path(p).resolve() for p in (sys.prefix, sys.base_prefix, Path(sys.executable).parent,
                                        Path(__file__).resolve().parents[1])]
    unique = {p for p in unique if not any(Path(p) == k or Path(p) in k.parents for k in keep)}
    return sorted(unique, key=lambda p: -p.count("/"))


def _start_isolated_node(ray: str, args: list[str], temp_dir: Path, hidden: list[str], log: Path) -> subprocess.Popen:
    """A node as a second machine sees things: own mount namespace, the head's files out of sight."""
    unshare = shutil.which("unshare")
    if not unshare:
        pytest.fail("the Ray test cluster needs `unshare` (util-linux) and root, to give each node its own disk")
    cmd = [unshare, "--mount", "--propagation", "private", "sh", "-c", _ISOLATE, "isolate", NODE_TMPFS_SIZE,
           str(temp_dir), *hidden, "--", ray, "start", "--block", *args]
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, env=node_env(), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def node_args(temp_dir: Path, head: bool) -> list[str]:
    """``ray start`` flags for one node of the test cluster: one CPU, small store, free ports."""
    names = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port"]
    if head:
        names += ["--port", "--ray-client-server-port"]
    ports = unbound_ports(len(names))
    low, high = worker_port_range()
    args = [f"{name}={port}" for name, port in zip(names, ports)]
    args += [f"--min-worker-port={low}", f"--max-worker-port={high}", "--num-cpus=1",
             f"--object-store-memory={OBJECT_STORE_BYTES}", f"--node-ip-address={HOST}",
             f"--temp-dir={temp_dir}", "--disable-usage-stats", "--log-style=record",
             # Its log monitor (a Python polling the node's log files 10 times a second, the cluster's busiest
             # idle process) only sends workers' prints to drivers started with log_to_driver=True: every driver
             # of modelyard and of these tests passes False (a job's lines travel through its actors instead).
             "--include-log-monitor=false"]
    if head:
        args += ["--head", "--include-dashboard=false"]
    return args


def _wait_alive(cluster: RayCluster, want: int, timeout: float) -> list[dict]:
    """Wait for ``want`` alive nodes, failing at once (not after ``timeout``) when a node process exits."""
    deadline = time.monotonic() + timeout
    while True:
        dead = [p for p in cluster.procs if p.poll() is not None]
        if dead:
            logs = "\n".join(p.read_text()[-1500:] for p in sorted(cluster.temp_dir.glob("*.log")))
            raise _NodeExited(f"a node of {cluster.address} exited while starting ({len(dead)}):\n{logs}")
        alive = []
        if _accepts(cluster.address):  # before that, a driver would wait a minute for the GCS inside ray.init
            try:
                alive = alive_nodes(cluster.address, want, min(20.0, max(deadline - time.monotonic(), 1.0)))
            except RuntimeError:  # the head not answering yet
                pass
        else:
            time.sleep(0.5)
        if len(alive) >= want or time.monotonic() > deadline:
            return alive


def _accepts(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


class _NodeExited(RuntimeError):
    """A node's `ray start` exited (e.g. a port picked free was taken before Ray bound it)."""


def start_cluster(nodes: int = 2, hide: list[str] | None = None, attempts: int = 3) -> RayCluster:
    """Start a head node and ``nodes - 1`` more (each in its own mount namespace, ``hide`` and the
    ``hidden_dirs`` empty there), wait until all are alive; stop them on failure. A node that exits
    while starting (the busy machine gave one of its free ports away meanwhile) means a new try
    with new ports, up to ``attempts`` times."""
    for attempt in range(attempts):
        try:
            return _start_cluster(nodes, hide)
        except _NodeExited:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _start_cluster(nodes: int, hide: list[str] | None) -> RayCluster:
    ray = ray_command()
    # Short: Ray's Unix socket paths live under it and must stay under 108 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="myray-", dir="/tmp"))
    head = node_args(temp_dir, head=True)
    port = _flag(head, "--port")
    # The head's Ray temp dir is hidden by name too: /tmp itself stays visible when it holds the Python.
    cluster = RayCluster(f"{HOST}:{port}", temp_dir, hidden=hidden_dirs([*(hide or []), str(temp_dir)]))
    try:
        cluster.procs.append(_start_node(ray, head, temp_dir / "head.log", {**node_env(), **HEALTH_CHECK_ENV}))
        cluster.ports[cluster.head.pid] = int(_flag(head, "--node-manager-port"))
        _wait_alive(cluster, 1, START_TIMEOUT_S)  # the head must answer before others join
        for _ in range(1, nodes):
            cluster.add_node()  # started again if it exits while starting
        alive = _wait_alive(cluster, nodes, START_TIMEOUT_S)
        if len(alive) < nodes:
            logs = "\n".join(p.read_text()[-1500:] for p in sorted(temp_dir.glob("*.log")))
            raise RuntimeError(f"Ray cluster at {cluster.address}: {len(alive)} of {nodes} nodes alive\n{logs}")
    except BaseException:
        cluster.stop()
        raise
    return cluster


_SESSION: list[RayCluster] = []


def session_cluster() -> RayCluster:
    """The session's cluster (started by the ``ray_cluster`` fixture: ask for it first), to add,
    kill or look into nodes. A test that kills a node leaves two alive ones (``ensure_nodes``)."""
    if not _SESSION:
        raise RuntimeError("no session Ray cluster: ask for the ray_cluster fixture first")
    return _SESSION[0]


def ensure_nodes(cluster: RayCluster, count: int = 2) -> None:
    """Start nodes until ``count`` are alive (after a test killed one)."""
    while len(cluster.running_nodes()) < count:
        cluster.add_node()


def before_test(cluster: RayCluster, nodes: int = 2, idle_timeout: float = 60.0) -> None:
    """Before each test that uses the cluster: ``nodes`` alive (a failed test may have left one killed),
    and every CPU free once what earlier tests started has ended. A CPU still held after
    ``idle_timeout`` is reported (which actors hold it) rather than failed on: the test says the rest."""
    ensure_nodes(cluster, nodes)
    try:
        held = ask_cluster(cluster.address, "held", idle_timeout)
    except (OSError, EOFError, TimeoutError, ValueError) as exc:
        held = str(exc)
    if held:
        print(f"ray test cluster not idle before the test: {held}", file=sys.stderr)


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """The address (``HOST:PORT``) of a real local two-node Ray cluster, one CPU per node; the
    second node sees none of the head's temp, test and cache directories."""
    base = tmp_path_factory.getbasetemp()
    # Under pytest-xdist each worker's base temp sits in the run's, beside what build_once shares
    # (the tiny models): hide the run's whole temp dir, or a node sees those as this host's files.
    cluster = start_cluster(2, hide=[str(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)])
    _SESSION.append(cluster)
    try:
        yield cluster.address
    finally:
        _SESSION.remove(cluster)
        cluster.stop()
