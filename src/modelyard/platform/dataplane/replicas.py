"""The local engine: replicas are ``modelyard serve`` processes on this host.

The platform talks to them only through their process ids and HTTP: it starts one per replica
on free ports, waits until TF Serving's status API says the model is AVAILABLE, checks it is still
alive, and stops it with SIGTERM (SIGKILL after a grace period). Replicas run in their own session,
so they outlive a platform that is killed, and the next platform adopts them from the store.

Starting a replica is mostly importing TensorFlow (4 s on an idle 2-core machine, 10 s and more
under load), so while anything is deployed the engine keeps one *warm spare*: a ``modelyard serve``
already running, with an empty model directory it polls every second. The replicas that are needed
fast, under load (scale-ups, replacements of dead replicas), claim the spare by linking their model
into that directory (1-2 s until AVAILABLE), and a new spare starts at once. Deploys start their own
processes and leave the spare warm: a deploy is often followed at once by the load it scales for.

Each replica carries the platform's identity from before it starts: its environment names the
state directory (``STATE_ENV``), the store (``STORE_ENV``: its identity, shared by every platform on
it) and the platform's pid (``PLATFORM_PID_ENV``), and its command line holds its directory under
that state directory. So a platform that restarts after any crash, or a follower that takes the lead
from a dead leader of its store (another state directory), finds every process a dead platform
started on this host, listed in the store or not (``reap_orphans``).

Every engine (this one and ``replicas_ray.RayEngine``) offers the same calls to the supervisor:
``open``, ``close``, ``start``, ``healthy``, ``alive``, ``adopt``, ``stop``, ``want_spare`` and
``reap_orphans``.

Each replica trusts only its platform (``replica_secrets``): it is started with a secret of its own in
a private token file, the probe and the gateway send it, and its environment holds none of the
platform's credentials.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp

from modelyard.platform.api import names
from modelyard.platform.api.errors import ApiError
from modelyard.platform.dataplane import replica_secrets
from modelyard.platform.dataplane.routing import MODEL  # the name every replica serves its one model under
from modelyard.ports import PORT_TAKEN_EXIT, free_ports

log = logging.getLogger(__name__)

START_TIMEOUT_S = 180.0
READY_POLL_S = 0.05  # a replica's status API is cheap; polling it fast takes ~0.2 s off every start
SPARE_PREFIX = "spare-"  # replica directories of warm spares
SPARE_LINGER_S = 30.0  # how long a spare outlives the last deployed model
PORT_RETRIES = 2  # new ports for a replica whose port was taken meanwhile (see modelyard.ports)
CLAIMED = "claimed"  # marker file: this spare became a replica (the next platform must not reap it)
STATE_ENV = "MODELYARD_PLATFORM_STATE"  # in a replica's environment: the state directory of its platform
PLATFORM_PID_ENV = "MODELYARD_PLATFORM_PID"  # ... and the pid of the platform process that started it
STORE_ENV = "MODELYARD_PLATFORM_STORE"  # ... and the identity of its platform's store (Store.identity)


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


def child_alive(children: dict[int, subprocess.Popen], row: dict) -> bool:
    """A replica process is running: polled when this platform started it (``children``, which forgets
    it once it exited), else looked up by pid and port (one an earlier platform started)."""
    proc = children.get(row["pid"])
    if proc is not None:
        if proc.poll() is None:
            return True
        children.pop(row["pid"], None)
        return False
    return pid_alive(row["pid"], row["port"])


async def stop_child(children: dict[int, subprocess.Popen], row: dict, grace_s: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; returns once the process is gone (and forgotten)."""
    pid = row["pid"]
    replica_secrets.forget(row["id"])
    try:
        if not child_alive(children, row):
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while child_alive(children, row) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if child_alive(children, row):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            while child_alive(children, row):
                await asyncio.sleep(0.05)
    finally:
        children.pop(pid, None)


def is_platform(pid: int) -> bool:
    """``pid`` is a live ``modelyard platform`` process (not a recycled pid)."""
    if pid == os.getpid():
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"modelyard.platform" in f.read() and pid_alive(pid)
    except OSError:
        return False


def serve_command(base: Path, host: str, port: int, grpc_port: int, poll_s: int, extra: list[str]) -> list[str]:
    """The ``modelyard serve`` command line of one replica (``poll_s`` 0: load once, never re-scan).

    Replicas take JSON numbers as Vertex AI's prediction service hands them to a container
    (``--json_numbers vertex``: ``0.0`` reaches a uint8 input as 0); ``modelyard serve`` alone keeps
    TF Serving's rule."""
    return [sys.executable, "-m", "modelyard", "serve", "--model_name", MODEL, "--model_base_path", str(base),
            "--host", host, "--rest_api_port", str(port), "--port", str(grpc_port),
            "--file_system_poll_wait_seconds", str(poll_s), "--json_numbers", "vertex", *extra]


def serve_env() -> dict:
    """A replica's environment: the platform's, without its credentials (``replica_secrets.private_env``)."""
    return replica_secrets.private_env(
        {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")})


def tail(path: Path, lines: int = 6) -> str:
    """The last lines of a replica's log, for error messages."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) + f" (log: {path})"


class Probe:
    """Asks replicas over HTTP (TF Serving's model status API) whether their model is AVAILABLE."""

    def __init__(self) -> None:
        self.session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def status(self, row: dict) -> tuple[bool, str | None]:
        """(AVAILABLE?, the load error TF Serving's status API reports, if the version ended with one)."""
        assert self.session is not None
        auth = replica_secrets.authorization(row)
        try:
            async with self.session.get(f"http://{row['host']}:{row['port']}/v1/models/{MODEL}",
                                        headers={"Authorization": auth.decode()} if auth else None,
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

    async def wait_available(self, row: dict, model_path: Path, exited: Callable[[], Awaitable[str | None]],
                             stop: Callable[[dict], Awaitable[None]], timeout_s: float = START_TIMEOUT_S) -> None:
        """Returns once ``row``'s model is AVAILABLE; else stops the replica and raises the ApiError saying why.
        ``exited()`` gives the reason if the replica's process is gone (None while it runs)."""
        dm_id = row["deployed_model_id"]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reason = await exited()
            if reason is not None:
                raise ApiError("FAILED_PRECONDITION", f"replica for deployed model {dm_id} {reason} while "
                               f"loading {model_path}")
            available, error = await self.status(row)
            if available:
                return
            if error:
                await stop(row)
                raise ApiError("FAILED_PRECONDITION", f"replica for deployed model {dm_id} could not load "
                               f"{model_path}: {error}")
            await asyncio.sleep(READY_POLL_S)
        await stop(row)
        raise ApiError("DEADLINE_EXCEEDED", f"replica for deployed model {dm_id} did not become AVAILABLE "
                       f"within {timeout_s:.0f} s (log: {row.get('log_path')})")


class LocalEngine:
    """Starts, checks and stops replica processes on this host."""

    def __init__(self, state_dir: Path, host: str = "127.0.0.1", serve_args: list[str] | None = None,
                 warm_spare: bool = True, store_id: str = "") -> None:
        self.state_dir = state_dir
        self.store_id = store_id  # Store.identity: platforms sharing the store find each other's orphans
        self.warm_spare = warm_spare
        self.host = host
        self.serve_args = list(serve_args or [])
        self._children: dict[int, subprocess.Popen] = {}
        # Exit codes of children reaped by _reap_children: a replica still being started asks for
        # its own (a fast-failing load could otherwise be reaped by a want_spare call first, and its
        # start would wait out START_TIMEOUT_S for a process that is gone).
        self._exit_codes: dict[int, int] = {}
        self.probe = Probe()
        self._spare: dict | None = None  # the warm spare: rdir, base, port, grpc_port, pid, log_path
        self._unwanted_since: float | None = None
        self._spare_failed_at = -1e9

    async def open(self) -> None:
        self._reap_spares()
        await self.probe.open()

    async def close(self) -> None:
        if self._spare is not None:
            self._kill(self._spare["pid"])
            self._spare = None
        await self.probe.close()

    # ---- warm spare -----------------------------------------------------------------------------
    def want_spare(self, wanted: bool) -> None:
        """Keep one warm spare (``wanted``: replicas run or start, more may be needed soon) or none."""
        self._reap_children()
        spare = self._spare
        if spare is not None and not self.alive(spare):
            log.warning("the warm spare replica process exited: %s", tail(Path(spare["log_path"])))
            spare = self._spare = None
            self._spare_failed_at = time.monotonic()
        if wanted and self.warm_spare and spare is None \
                and time.monotonic() - self._spare_failed_at >= SPARE_LINGER_S:  # no relaunch loop
            self._spare = self._launch(self.state_dir / "replicas" / (SPARE_PREFIX + names.new_id()), poll_s=1)
        if wanted:
            self._unwanted_since = None
        elif spare is not None:
            # Kept a while after the last deployment leaves: an undeploy is often followed by a deploy.
            now = time.monotonic()
            self._unwanted_since = self._unwanted_since or now
            if now - self._unwanted_since >= SPARE_LINGER_S or not self.warm_spare:
                self._spare = None
                self._kill(spare["pid"])

    def _claim_spare(self, model_path: Path) -> dict | None:
        """The spare's process for a new replica (its model linked in), or None if there is no live spare."""
        spare, self._spare = self._spare, None
        if spare is None or not self.alive(spare):
            return None
        (Path(spare["rdir"]) / CLAIMED).touch()  # written before the link: a platform restart keeps it
        (Path(spare["base"]) / "1").symlink_to(model_path, target_is_directory=True)
        return spare

    def _reap_spares(self) -> None:
        """Stop unclaimed spares a previous platform left (it was killed before it could stop them)."""
        root = self.state_dir / "replicas"
        dirs = {str(d).encode() for d in root.glob(SPARE_PREFIX + "*") if not (d / CLAIMED).exists()}
        if not dirs:
            return
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        cmdline = f.read()
                except OSError:
                    continue
                if b"serve" in cmdline.split(b"\0") and any(d + b"/" in cmdline for d in dirs):
                    self._kill(int(entry))

    async def reap_orphans(self, keep: list[dict]) -> int:
        """Kill every process a platform on this state directory or store started whose platform is gone, except
        the replicas of ``keep`` (rows: those adopted or listed in the store) and this engine's spare:
        replicas whose row was never written (a kill -9 between start and store), spares, anything.
        Returns how many."""
        keep_pids = {row["pid"] for row in keep}
        mine, my_store = str(self.state_dir).encode(), self.store_id.encode()
        spare = self._spare["pid"] if self._spare else None
        killed = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in keep_pids or int(entry) in (spare, os.getpid()):
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            except OSError:
                continue
            ours = env.get(STATE_ENV.encode()) == mine or (my_store and env.get(STORE_ENV.encode()) == my_store)
            if not ours or int(entry) in self._children:
                continue
            starter = int(env.get(PLATFORM_PID_ENV.encode(), b"0") or 0)
            if starter and is_platform(starter):
                continue  # its platform runs (another one on this state directory): not an orphan
            log.warning("stopping process %s: started by platform pid %d, which is gone, and listed nowhere",
                        entry, starter)
            try:
                os.kill(int(entry), signal.SIGKILL)  # SIGKILL: a stopped (SIGSTOP) orphan ignores SIGTERM
                killed += 1
            except ProcessLookupError:
                pass
        return killed

    def _kill(self, pid: int) -> None:
        """SIGTERM without waiting: the process is reaped by a later ``_reap_children``."""
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def _reap_children(self) -> None:
        """Collect exited children (no zombies); ``alive`` then falls back to /proc, which says gone."""
        for pid, proc in list(self._children.items()):
            if proc.poll() is not None:
                self._children.pop(pid, None)
                self._exit_codes[pid] = proc.returncode
        while len(self._exit_codes) > 1000:  # nobody asked for the oldest ones
            del self._exit_codes[next(iter(self._exit_codes))]

    # ---- replicas -------------------------------------------------------------------------------
    def _launch(self, rdir: Path, poll_s: int, model_path: Path | None = None) -> dict:
        base = rdir / MODEL
        base.mkdir(parents=True, exist_ok=True)
        if model_path is not None:
            link = base / "1"  # TF Serving wants version directories under a base path
            if not link.exists():
                link.symlink_to(model_path, target_is_directory=True)
        port, grpc_port = free_ports(2, self.host)
        log_path = rdir / "serve.log"
        # A spare's model is linked in later (its poll picks it up); a replica's is confined to its model.
        # A start again on new ports (same directory) keeps the secret the platform may have read already.
        secret = replica_secrets.read_secret(rdir / replica_secrets.TOKEN_FILE) or replica_secrets.new_secret()
        token_file = replica_secrets.write_token_file(rdir, secret)
        models = [rdir] + ([model_path] if model_path is not None else [])
        cmd = serve_command(base, self.host, port, grpc_port, poll_s, self.serve_args) + \
            replica_secrets.serve_flags(token_file, models)
        identity = {STATE_ENV: str(self.state_dir), STORE_ENV: self.store_id, PLATFORM_PID_ENV: str(os.getpid())}
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env={**serve_env(), **identity}, start_new_session=True)
        self._children[proc.pid] = proc
        return {"rdir": str(rdir), "base": str(base), "port": port, "grpc_port": grpc_port, "pid": proc.pid,
                "log_path": str(log_path)}

    async def start(self, replica_id: str, dm_id: str, model_path: Path, use_spare: bool = False) -> dict:
        """Start a replica serving ``model_path`` (on the warm spare if ``use_spare`` and there is one);
        returns its row once the model is AVAILABLE. A replica whose port another process took before
        it could bind it is started again on new ports (``PORT_RETRIES`` times)."""
        proc = self._claim_spare(model_path) if use_spare else None
        attempt = 0
        while True:
            proc = proc or self._launch(self.state_dir / "replicas" / replica_id, 0, model_path)
            self.want_spare(True)  # the next spare imports TensorFlow beside this replica's start, not after it
            row = {"id": replica_id, "deployed_model_id": dm_id, "host": self.host, "port": proc["port"],
                   "grpc_port": proc["grpc_port"], "pid": proc["pid"], "log_path": proc["log_path"],
                   "created": time.time()}
            exit_code: int | None = None  # the process's, once it exited

            async def exited() -> str | None:
                nonlocal exit_code
                child = self._children.get(row["pid"])
                if child is not None:
                    if child.poll() is None:
                        return None
                    self._children.pop(row["pid"], None)
                    code: int | None = child.returncode
                else:
                    code = self._exit_codes.pop(row["pid"], None)
                    if code is None:
                        return None
                exit_code = code
                return f"exited with code {code}: {tail(Path(row['log_path']))}"

            try:
                await self.probe.wait_available(row, model_path, exited, self.stop)
                return row
            except ApiError:
                if exit_code != PORT_TAKEN_EXIT or attempt == PORT_RETRIES:
                    raise
            log.warning("replica %s: port %d or %d was taken before it could listen; starting it again on new "
                        "ports", replica_id, row["port"], row["grpc_port"])
            proc, attempt = None, attempt + 1

    async def healthy(self, row: dict) -> bool:
        """TF Serving's model status says AVAILABLE."""
        return (await self.probe.status(row))[0]

    async def adopt(self, row: dict) -> bool:
        """A replica a previous platform started: still running and serving?"""
        return self.alive(row) and await self.healthy(row)

    def alive(self, row: dict) -> bool:
        return child_alive(self._children, row)

    async def stop(self, row: dict, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; waits until the process is gone."""
        await stop_child(self._children, row, grace_s)
