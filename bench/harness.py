"""What every benchmark does the same way: processes, turns, the machine, percentiles, results.

    from harness import Service, take_turns, percentile, machine, markdown_table, write_results

- ``Service``: a child process (a server, a peer, a platform) in its own process group, its
  output in a log file, started and waited on until a readiness check passes (never a fixed
  sleep), stopped for sure (SIGTERM to the group, then SIGKILL), with the CPU seconds of its
  whole process tree.
- ``take_turns``: the sides of a comparison run one after the other, the order reversed every
  round (A B, B A, ...), so a machine that gets busier or quieter meanwhile favours neither.
- ``machine``: the one line every results file starts with: when, where, the CPU, cores, load,
  Python and the commit measured.
- ``percentile``: one definition (linear between closest ranks, like numpy's default).
- ``markdown_table`` and ``write_results``: the table format and ``bench/results/<name>.md``.

Benchmarks are scripts (``python3 bench/<name>.py``): this module sits beside them and is
imported as ``harness`` (their own folder is first on ``sys.path``), or as ``bench.harness``.
"""
from __future__ import annotations

import math
import os
import platform
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterable, Sequence

from modelyard.ports import free_port, free_ports  # noqa: F401  (one rule for ports, re-exported)

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    """Progress on stderr, timestamped (stdout is for the table)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def env(**extra: str) -> dict[str, str]:
    """The environment for a child: this one, unbuffered, TensorFlow quiet, this tree's ``src``
    first on PYTHONPATH (so a checkout measures itself), plus ``extra``."""
    path = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": path, **extra}


# ------------------------------------------------------------------ the machine
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "src"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        return out.stdout.strip() + (" (src modified)" if dirty else "") if out.returncode == 0 else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def machine() -> str:
    """When and where a benchmark ran, in one line: put it under every results file's title."""
    load = os.getloadavg()[0]
    return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, {_cpu_model()}, "
            f"{os.cpu_count()} cores, 1-minute load {load:.1f} at the start, Python {platform.python_version()}, "
            f"commit {_commit()}")


# ------------------------------------------------------------------ numbers
def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, linear between the closest ranks; NaN if empty."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50 / p90 / p99 / max in milliseconds and the count, of latencies in seconds."""
    ms = [s * 1000 for s in seconds]
    return {"n": len(ms), "p50_ms": percentile(ms, 50), "p90_ms": percentile(ms, 90), "p99_ms": percentile(ms, 99),
            "max_ms": max(ms) if ms else math.nan}


def median(values: Iterable[float]) -> float:
    return percentile(values, 50)


# ------------------------------------------------------------------ taking turns
def take_turns(sides: Sequence[str], rounds: int, run: Callable[[str, int], dict],
               report: Callable[[str, int, dict], None] | None = None) -> dict[str, list[dict]]:
    """``run(side, round)`` for every side, ``rounds`` times, the order reversed every other
    round; each side's results in round order. ``report`` sees each result as it comes."""
    results: dict[str, list[dict]] = {side: [] for side in sides}
    for round_no in range(rounds):
        order = list(sides) if round_no % 2 == 0 else list(reversed(sides))
        for side in order:
            result = run(side, round_no)
            results[side].append(result)
            if report is not None:
                report(side, round_no, result)
            else:
                log(f"round {round_no + 1}/{rounds} {side}: {result}")
    return results


# ------------------------------------------------------------------ processes
def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, user+system clock ticks) of a live process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[11]) + int(fields[12])


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds used so far by ``root`` and every live descendant."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _proc_stat(int(entry))
            if st:
                stats[int(entry)] = st
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total / CLK_TCK


def children_cpu_seconds() -> float:
    """CPU seconds of this process's finished (waited-for) children, e.g. the load generator's runs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def http_ok(url: str, accept: Callable[[bytes], bool] | None = None) -> Callable[[], bool]:
    """A readiness check: ``url`` answers 200 (and ``accept(body)`` when given)."""
    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200 and (accept is None or accept(r.read()))
        except (OSError, urllib.error.URLError):
            return False
    return check


def port_open(port: int, host: str = "127.0.0.1") -> Callable[[], bool]:
    """A readiness check: something accepts connections on ``port``."""
    def check() -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex((host, port)) == 0
    return check


def model_available(rest_port: int, model: str) -> Callable[[], bool]:
    """A readiness check for a TF Serving-style server (modelyard, TF Serving, the FastAPI peer:
    a version AVAILABLE; KServe V1: ``"ready": true``)."""
    def body_ready(data: bytes) -> bool:
        compact = data.replace(b" ", b"")
        return b"AVAILABLE" in compact or b'"ready":true' in compact
    return http_ok(f"http://127.0.0.1:{rest_port}/v1/models/{model}", body_ready)


class Service:
    """A child process for the length of a benchmark: ``with Service(...) as s:`` or start/stop.

    ``ready`` is polled (every 0.2 s) until it returns true; the process exiting first, or
    ``timeout`` passing, stops it and raises with the end of its log.
    """

    def __init__(self, label: str, cmd: Sequence[str], log_path: Path, *, ready: Callable[[], bool] | None = None,
                 env: dict | None = None, cwd: Path | None = None, timeout: float = 300):
        self.label, self.cmd, self.log_path = label, [str(c) for c in cmd], Path(log_path)
        self.ready, self.env, self.cwd, self.timeout = ready, env, cwd, timeout
        self.proc: subprocess.Popen | None = None
        self._out = None

    def start(self) -> "Service":
        log(f"starting {self.label}: {' '.join(shlex.quote(c) for c in self.cmd)}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._out = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=self._out, stderr=subprocess.STDOUT,
                                     env=self.env if self.env is not None else env(), cwd=self.cwd,
                                     start_new_session=True)
        if self.ready is not None:
            self.wait(self.ready, self.timeout)
        log(f"{self.label} ready (pid {self.proc.pid})")
        return self

    def wait(self, check: Callable[[], bool], timeout: float) -> None:
        """Poll ``check`` until true; fail (stopping the process) if it exits or time runs out."""
        deadline = time.monotonic() + timeout
        while not check():
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"{self.label} exited with {self.proc.returncode}; end of {self.log_path}:\n"
                                   + self.log_text()[-3000:])
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.label} not ready after {timeout:.0f} s; end of {self.log_path}:\n"
                                   + self.log_text()[-3000:])
            time.sleep(0.2)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """CPU seconds of the process and its live descendants so far."""
        return tree_cpu_seconds(self.proc.pid)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, grace: float = 15) -> None:
        """SIGTERM to the whole group, SIGKILL after ``grace`` seconds; idempotent."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        if self._out is not None:
            self._out.close()
            self._out = None

    def __enter__(self) -> "Service":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def modelyard_serve(label: str, base_path: Path | str, log_path: Path, *extra: str, model: str = "m",
                    source: Path | None = None, timeout: float = 300) -> Service:
    """A ``modelyard serve`` of one model on free loopback ports, ready once the model is
    AVAILABLE (not started yet: use ``with``). ``source``: another checkout whose ``src`` runs.
    ``.rest_port``, ``.grpc_port`` and ``.predict_url`` say where it listens."""
    rest, grpc = free_ports(2)
    cmd = [sys.executable, "-m", "modelyard", "serve", "--model_name", model, "--model_base_path", str(base_path),
           "--host", "127.0.0.1", "--port", str(grpc), "--rest_api_port", str(rest), *extra]
    child_env = env() if source is None else env(PYTHONPATH=str(Path(source) / "src"))
    service = Service(label, cmd, log_path, ready=model_available(rest, model), env=child_env, timeout=timeout)
    service.rest_port, service.grpc_port = rest, grpc
    service.predict_url = f"http://127.0.0.1:{rest}/v1/models/{model}:predict"
    return service


class PlatformService(Service):
    """``modelyard platform`` on a free port; stopping it also stops the replicas it started
    (found by its state directory in their command lines), should any outlive it."""

    def stop(self, grace: float = 30) -> None:
        super().stop(grace)
        marker = str(self.state_dir).encode()
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGTERM)
            except OSError:
                pass


def modelyard_platform(workdir: Path, *extra: str, label: str = "modelyard platform", timeout: float = 120,
                       child_env: dict | None = None) -> PlatformService:
    """A ``modelyard platform`` with its store and state under ``workdir`` (not started yet: use
    ``with``), ready once ``/healthz`` answers; ``.base`` is its URL, its log ``workdir/platform.log``."""
    port = free_port()
    state = Path(workdir) / "state"
    cmd = [sys.executable, "-m", "modelyard.platform", "--port", str(port), "--store", str(Path(workdir) / "db.sqlite"),
           "--state-dir", str(state), *extra]
    base = f"http://127.0.0.1:{port}"
    service = PlatformService(label, cmd, Path(workdir) / "platform.log", ready=http_ok(base + "/healthz"),
                              env=child_env, timeout=timeout)
    service.base, service.port, service.state_dir = base, port, state
    return service


def ensure_tool(name: str, package: str | None = None) -> None:
    """A command the benchmark drives (wrk, hey, h2load): installed with apt-get when missing."""
    if shutil.which(name):
        return
    package = package or name
    log(f"{name} is not installed: installing Debian's package {package} with apt-get (needs root) ...")
    prefix = [] if os.geteuid() == 0 else ["sudo"]
    if subprocess.call(prefix + ["apt-get", "install", "-y", "-q", package]) != 0:
        subprocess.call(prefix + ["apt-get", "update", "-q"])
        if subprocess.call(prefix + ["apt-get", "install", "-y", "-q", package]) != 0:
            sys.exit(f"could not install {name}; install it by hand: apt-get install -y {package}")


# ------------------------------------------------------------------ results
def markdown_table(headers: Sequence[str], rows: Iterable[Sequence], align: str | None = None) -> str:
    """A Markdown table; ``align`` one letter per column, ``l`` or ``r`` (default: first left, rest right)."""
    align = align or "l" + "r" * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |",
             "| " + " | ".join("---" if a == "l" else "---:" for a in align) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def command_line() -> str:
    """How this benchmark was started, to quote in its results (``python3 bench/x.py --flags``)."""
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(REPO)
    except ValueError:
        pass
    return " ".join(["python3", str(script), *map(shlex.quote, sys.argv[1:])])


def write_results(name: str, text: str, out: Path | str | None = None) -> Path:
    """Print ``text`` and write it to ``out`` (a file, or a folder for ``<name>.md``; default
    ``bench/results/<name>.md``)."""
    path = Path(out) if out is not None else RESULTS
    if path.suffix != ".md":
        path = path / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = text.rstrip("\n") + "\n"
    path.write_text(text)
    print(text)
    log(f"wrote {path}")
    return path
