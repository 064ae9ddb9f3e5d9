"""The Ray engine: replicas are ``modelyard serve`` processes on the nodes of a Ray cluster.

Each replica is a named, detached Ray actor (``ReplicaActor``) in the ``modelyard`` namespace that
starts ``modelyard serve`` as a child process on its node and reports the node's address and the
ports; the gateway then talks HTTP to it exactly as to a local replica. Ray places the actors (one
CPU each by default, SPREAD over the nodes) and keeps them off nodes that died. When a replica's
process exits, the actor's pending ``wait`` call returns (or fails, if the actor or its node is
gone): the replica is dead, and the supervisor starts a replacement, which Ray places on a live
node, as the local engine's replicas are replaced. The serve child dies with its actor
(PR_SET_PDEATHSIG), so killing an actor never leaves a process behind on a node.

Detached actors outlive the platform; the next platform finds each stored replica's actor by name
(``modelyard-replica-<replica id>``) and adopts it if it still serves. Each actor is created with its
platform's identity (``owner``: host, state directory, store, pid), before it starts anything, so a
platform killed between starting an actor and writing its row leaves no untracked replica: the next
platform on that state directory, or a follower of its store on its host taking the lead, lists the
namespace's replica actors and ends those its dead predecessor started that no row lists
(``RayEngine.reap_orphans``; their serve children die with them). An actor Ray had not placed when
the next platform started (no free CPU) cannot say its owner then; it is asked again on the
supervisor's timer and ended once placed.

Readiness is the supervisor's, the same for both engines: it probes the serve child's model status
over HTTP, so a stopped (SIGSTOP) or stuck child is taken out of routing within seconds and, if it
stays so, stopped through its actor (SIGKILL after a short grace) and replaced by a new actor.

No disk is shared with the nodes: before starting a replica the platform publishes the model
version's directory to object storage by content hash (``artifact_cache.publish``: the platform's
own Cloud Storage unless ``$MODELYARD_ARTIFACT_STORE`` names another), and the actor fetches it into
its node's bounded cache (``artifact_cache.fetch``), or uses the platform's path in place on a node
that has it with the same content. The replica's working files (its model link, its log) are on
its node too. The nodes reach the platform's storage at ``STORAGE_EMULATOR_HOST``; a loopback
address there is replaced by this host's address on the cluster's network (``_storage_env``).

A node that dies takes its replicas' actors with it: their pending ``wait`` fails once Ray
declares the node dead, and the replicas are replaced on live nodes (the readiness probe takes
them out of routing first, within about a second, since their serve processes no longer answer).

A serve child whose port another process took before it could bind exits with PORT_TAKEN_EXIT; the
actor starts it again on new ports (``PORT_RETRIES`` times) before it reports where it listens, so
``start`` returns once the child listens on its REST port (or exited for another reason, which the
platform reports with the log's tail).

Each replica trusts only its platform, as a local one does (``replica_secrets``): the platform makes
its secret and hands it to the actor as an argument, the actor writes it to a private token file on
its node for its serve child (``--auth_token_file``), and the child's environment holds none of the
platform's credentials. A platform that adopts an actor, or follows another platform's, asks it for
the secret (``info``).

A deployment resource pool's replica is a ``PoolReplicaActor``, placed and watched the same way; the
platform tells it the pool's models by calling ``set_models`` (``RayEngine.tell_models`` / ``set_models``),
and the actor writes its serve child's private model config on its node (``dataplane/pools.RayPools``).

``ray`` is imported only here and only when this engine is chosen (``--engine ray``).
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from modelyard import read_tokens
from modelyard.platform.dataplane import artifact_cache, replica_secrets
from modelyard.platform.api.errors import ApiError
from modelyard.platform.dataplane.replicas import (MODEL, PORT_RETRIES, START_TIMEOUT_S, Probe, is_platform,
                                                   serve_command, serve_env, tail)
from modelyard.ports import PORT_TAKEN_EXIT

log = logging.getLogger(__name__)

NAMESPACE = "modelyard"
ACTOR_PREFIX = "modelyard-replica-"
CONNECT_TIMEOUT_S = 5.0
OWNER_TIMEOUT_S = 10.0  # an actor asked for its owner: one not placed yet (no free CPU) cannot say


def unused_ports(count: int, low: int = 20_000, high: int = 32_767) -> list[int]:
    """``count`` ports for a serve child, below the kernel's ephemeral range (and above Ray's default worker
    ports), that no socket of this node uses, chosen without binding them: a port a process bound and
    released can stay unavailable to other processes for seconds (seen on gVisor sandboxes), so picking
    by bind-and-release made children fail with "Address already in use". The sockets in use are read
    from /proc/net; a port another process takes meanwhile is still possible: the child then exits
    with PORT_TAKEN_EXIT and is started again on new ports."""
    used: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        used.update(int(row.split()[1].rsplit(":", 1)[1], 16) for row in rows if row.strip())
    picked: list[int] = []
    while len(picked) < count:
        port = random.randrange(low, high + 1)
        if port not in used and port not in picked:
            picked.append(port)
    return picked


class EngineUnavailable(Exception):
    """The Ray engine cannot start: ray is not installed, or the cluster cannot be reached."""


_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
_STORAGE_KEYS = ("STORAGE_EMULATOR_HOST", artifact_cache.STORE_ENV, "AWS_ENDPOINT_URL")
TOKEN_ENV = "MODELYARD_STORAGE_TOKEN"


def replica_token(token: str | None, store: str) -> str | None:
    """The storage token a node's replicas get: read-only, to the artifact store's bucket (``store``,
    ``gs://bucket[/prefix]``), derived from the platform's ``token`` (``modelyard.read_tokens``); never
    the platform's own. None without a token, or for an artifact store that is not the platform's gs://."""
    if not token or not store.startswith("gs://"):
        return None
    return read_tokens.attenuate(token, [store[len("gs://"):].split("/", 1)[0]])


def _storage_env(address: str = "") -> dict[str, str]:
    """The platform's storage settings (``STORAGE_EMULATOR_HOST`` is set by ``modelyard platform`` at
    start), for every node's replicas, and a read-only token for the artifact store (``replica_token``)
    in place of the platform's. A loopback storage host means this host to the platform but the
    node itself to a node: it is replaced by the address this host reaches the cluster's head from
    (a platform whose storage listens on loopback only cannot be reached by other machines at all:
    start it with ``--host 0.0.0.0`` or its own address)."""
    env = {k: os.environ[k] for k in _STORAGE_KEYS if os.environ.get(k)}
    token = replica_token(os.environ.get(TOKEN_ENV), os.environ.get(artifact_cache.STORE_ENV, artifact_cache.DEFAULT_STORE))
    if token:
        env[TOKEN_ENV] = token
    url = env.get("STORAGE_EMULATOR_HOST", "")
    head = address.rpartition(":")[0]
    scheme, sep, rest = url.partition("://")
    host, colon, port = rest.rpartition(":")
    if sep and host in _LOOPBACK and head and head not in _LOOPBACK:
        try:
            with socket.create_connection((head, int(address.rpartition(":")[2])), timeout=CONNECT_TIMEOUT_S) as s:
                env["STORAGE_EMULATOR_HOST"] = f"{scheme}://{s.getsockname()[0]}:{port}"
        except (OSError, ValueError):
            pass  # unreachable: connect() says so
    return env


def connect(address: str, namespace: str = NAMESPACE) -> None:
    """Join the Ray cluster at ``address`` (host:port of its GCS) as a driver, or raise EngineUnavailable.
    The address is checked with a plain TCP connect first: ``ray.init`` retries an unreachable one for minutes."""
    try:
        import ray
    except ImportError as exc:
        raise EngineUnavailable(f"--engine ray needs the ray package ({exc}): pip install 'ray[serve]'") from None
    if ray.is_initialized():
        return
    if not address:
        raise EngineUnavailable("--engine ray needs --ray-address HOST:PORT (the head node's GCS address, "
                                "as `ray start --head` prints it) or $RAY_ADDRESS")
    if address != "auto":  # "auto": the cluster `ray start` recorded on this host, found by Ray itself
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S):
                pass
        except (OSError, ValueError) as exc:
            raise EngineUnavailable(f"cannot reach the Ray cluster at {address!r} ({exc}): start it with "
                                    "`ray start --head` and pass the address it prints") from None
    import modelyard

    # Ray's workers must import this module (the actor class) from the same source tree as the platform.
    src = str(Path(modelyard.__file__).resolve().parents[1])
    pythonpath = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level=logging.WARNING,
                 runtime_env={"env_vars": {"PYTHONPATH": pythonpath, **_storage_env(address)}})
    except Exception as exc:  # ray raises ConnectionError, RuntimeError, ... depending on what failed
        raise EngineUnavailable(f"cannot join the Ray cluster at {address!r}: {exc}") from None


def _this_node() -> tuple[str, str]:
    """In an actor: its node's id and the address the node was started with (`ray start --node-ip-address`),
    as the cluster knows it."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    host = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id),
                None) or ray.util.get_node_ip_address()
    return node_id, host


def _die_with_parent() -> None:
    """In the serve child, before exec: SIGKILL when the actor's thread that started it ends."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


class ReplicaActor:
    """Runs on a Ray node (as a threaded actor): one ``modelyard serve`` child and its lifetime."""

    def __init__(self, replica_id: str, source: dict, serve_args: list[str], owner: dict | None = None,
                 secret: str | None = None) -> None:
        self.replica_id = replica_id
        self.secret = secret  # the serve child's bearer secret (replica_secrets), never in its environment
        self.owner = owner or {}  # the platform that created it: {"host", "state_dir", "store", "pid"}
        self.source = source  # artifact_cache.Source.as_dict(): the model's digest, storage prefix, platform path
        # This node's own disk (the platform's state dir may not exist here).
        self.rdir = artifact_cache.cache_root().parent / "ray-replicas" / replica_id
        self.serve_args = serve_args
        self.lease: artifact_cache.Lease | None = None
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None
        self._started = threading.Event()
        self._exited = threading.Event()

    def start(self) -> dict:
        """Start the serve child on a free port of this node; returns where it listens, and how long
        the node took to fetch the model and the child to listen (``fetch_s``, ``listen_s``: measured
        here, so the platform can tell them from Ray's placement without comparing two machines' clocks)."""
        import ray

        began = time.monotonic()
        node_id, host = _this_node()
        located = time.monotonic()  # ray.nodes() asks the cluster's GCS: timed apart from the fetch
        self.lease = artifact_cache.fetch(self.source)  # ArtifactError: the start fails saying why
        fetched = time.monotonic()
        base = self.rdir / MODEL
        base.mkdir(parents=True, exist_ok=True)
        link = base / "1"
        if not link.exists():
            link.symlink_to(self.lease.path, target_is_directory=True)
        log_path = self.rdir / "serve.log"
        guard = replica_secrets.serve_flags(replica_secrets.write_token_file(self.rdir, self.secret),
                                            [self.rdir, self.lease.path]) if self.secret else []
        ports = self._launch(host, lambda ports: serve_command(base, host, ports[0], ports[1], 0, self.serve_args)
                             + guard, log_path)
        return {"host": host, "port": ports[0], "grpc_port": ports[1], "pid": self.proc.pid,
                "log_path": str(log_path), "node_id": node_id, "model_dir": str(self.lease.path),
                "cached": self.lease.cached, "address_s": located - began, "fetch_s": fetched - located,
                "listen_s": time.monotonic() - fetched}

    def _launch(self, host: str, command, log_path: Path) -> list[int]:
        """Start the serve child (``command(ports)``: its command line on those ports), again on new ports
        while a port was taken before it could listen; returns the ports it listens on."""
        for attempt in range(PORT_RETRIES + 1):
            ports = unused_ports(2)
            cmd = command(ports)
            self._started, self._exited, self.error = threading.Event(), threading.Event(), None
            # The child is started from a thread that lives exactly as long as the child: PDEATHSIG fires when
            # the *thread* that forked it ends, and this one ends only after the child did (or with the actor).
            threading.Thread(target=self._run, args=(cmd, log_path), daemon=True).start()
            self._started.wait()
            if self.error:
                raise RuntimeError(self.error)
            if not self._port_taken(host, ports[0]):
                break
            log.warning("replica %s: port %d or %d was taken before it could listen; starting it again on new "
                        "ports", self.replica_id, ports[0], ports[1])
        return ports

    def _port_taken(self, host: str, port: int) -> bool:
        """Wait until the child listens on its REST port (False) or exits: True when it exited because a
        port it was told to use was taken (its exit status says so); any other exit is the platform's to report."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._exited.wait(0.2):
                return self.proc.returncode == PORT_TAKEN_EXIT
            try:
                with socket.create_connection((host, port), timeout=0.5):
                    return False
            except OSError:
                continue
        return False

    def _run(self, cmd: list[str], log_path: Path) -> None:
        try:
            with open(log_path, "ab") as out:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                             env=serve_env(), preexec_fn=_die_with_parent)
        except OSError as exc:
            self.error = f"cannot start modelyard serve on this node: {exc}"
            self._started.set()
            self._exited.set()
            return
        self._started.set()
        self.proc.wait()
        self._release()
        self._exited.set()

    def _release(self) -> None:
        if self.lease is not None:
            self.lease.release()  # its cache entry may be evicted now

    def wait(self) -> int | None:
        """Returns (the exit code) when the serve child has exited."""
        self._exited.wait()
        return self.proc.returncode if self.proc is not None else None

    def info(self) -> dict:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": self.proc.pid if self.proc else None,
                "running": self.proc is not None and self.proc.poll() is None,
                "model_dir": str(self.lease.path) if self.lease else None,
                "cached": bool(self.lease and self.lease.cached), "owner": self.owner, "secret": self.secret}

    def log_tail(self) -> str:
        return tail(self.rdir / "serve.log")

    def stop(self, grace_s: float) -> None:
        """SIGTERM (serve drains), SIGKILL after ``grace_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        if not self._exited.wait(grace_s):
            self.proc.kill()
            self._exited.wait()


class PoolReplicaActor(ReplicaActor):
    """A deployment resource pool's replica on a Ray node (``dataplane/pools.py``): one ``modelyard serve``
    child serving the pool's models on demand from its private ``--model_config_file`` on this node. The
    platform tells it its models by calling ``set_models`` (an actor call, which only the cluster's driver
    can make: no network peer of the serve child can), and the actor does what a local pool replica's
    platform does: fetches each model version into the node's cache (or uses the platform's path in place,
    ``artifact_cache.fetch``), links it and appends the change to the replica's journal of its config
    (``pools.write_config``), which the child reads every 0.1 s. Its token still holds no ``admin`` scope."""

    def __init__(self, replica_id: str, serve_args: list[str], owner: dict | None = None, secret: str | None = None,
                 roots: list[str] | None = None) -> None:
        super().__init__(replica_id, {}, serve_args, owner, secret)
        self.roots = roots  # the platform's model roots (None: any local directory, as the platform allows)
        self.leases: dict[str, artifact_cache.Lease] = {}  # model digest -> this node's hold on its files
        self.paths: dict[str, Path] = {}  # deployed model id -> its files on this node
        self.seq = -1
        self._models_lock = threading.Lock()

    def set_models(self, seq: int, sources: dict[str, dict]) -> list[str]:
        """Serve exactly ``sources`` (deployed model id -> ``artifact_cache.Source.as_dict()``). Calls may run
        out of order (a threaded actor): one with a ``seq`` older than the last applied is ignored, since each
        call carries the whole set. Returns the model ids now configured."""
        from modelyard.platform.dataplane.pools import write_config

        with self._models_lock:
            self.rdir.mkdir(parents=True, exist_ok=True)
            if seq <= self.seq:
                return sorted(self.paths)
            new = [dm for dm in sources if dm not in self.paths]
            for dm in new:
                digest = sources[dm]["digest"]
                if digest not in self.leases:
                    self.leases[digest] = artifact_cache.fetch(sources[dm])
                self.paths[dm] = self.leases[digest].path
            removed = [dm for dm in self.paths if dm not in sources]
            for dm in removed:
                del self.paths[dm]  # its link stays until the replica stops (a request may still hold it)
            write_config(self.rdir, self.paths, new=new, removed=removed)
            self.seq = seq
            return sorted(self.paths)

    def load_ahead(self, dm_id: str) -> None:
        """The serve child loads ``dm_id`` now, ahead of its requests (the platform found it hot)."""
        from modelyard.platform.dataplane.pools import write_load

        with self._models_lock:
            if dm_id in self.paths:
                write_load(self.rdir, dm_id)

    def start(self) -> dict:
        """Start the serve child (after a first ``set_models``); returns where it listens."""
        import sys

        from modelyard.platform.dataplane.pools import CONFIG_FILE, write_config

        node_id, host = _this_node()
        with self._models_lock:
            self.rdir.mkdir(parents=True, exist_ok=True)
            if not (self.rdir / CONFIG_FILE).exists():
                write_config(self.rdir, {})
        log_path = self.rdir / "serve.log"
        token_file = replica_secrets.write_token_file(self.rdir, self.secret or replica_secrets.new_secret())
        artifact_cache.cache_root().mkdir(parents=True, exist_ok=True)  # a root must exist, though no model came yet
        # The platform's roots this node has (one it lacks cannot hold a model used in place here either).
        roots = [str(self.rdir), str(artifact_cache.cache_root()), *(r for r in self.roots if Path(r).is_dir())] \
            if self.roots else None
        guard = replica_secrets.serve_flags(token_file, roots) if roots else [replica_secrets.FLAG, str(token_file)]
        ports = self._launch(host, lambda ports: [
            sys.executable, "-m", "modelyard", "serve", "--model_config_file", str(self.rdir / CONFIG_FILE),
            "--host", host, "--rest_api_port", str(ports[0]), "--port", str(ports[1]), *self.serve_args, *guard],
            log_path)
        return {"host": host, "port": ports[0], "grpc_port": ports[1], "pid": self.proc.pid, "log_path": str(log_path),
                "node_id": node_id}

    def _release(self) -> None:
        for lease in self.leases.values():
            lease.release()


async def _result(ref, timeout_s: float | None = None):
    """Await a Ray ObjectRef from asyncio (through its concurrent future: works under uvloop too)."""
    return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout_s)


def _kill_actor(handle) -> None:
    import ray

    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # already gone
        pass


class RayEngine:
    """Starts, checks and stops replica actors on a Ray cluster (same calls as ``LocalEngine``)."""

    def __init__(self, state_dir: Path, address: str, serve_args: list[str] | None = None, num_cpus: float = 1.0,
                 namespace: str = NAMESPACE, store_id: str = "") -> None:
        self.state_dir = state_dir
        self.address = address
        self.serve_args = list(serve_args or [])
        self.num_cpus = num_cpus
        self.namespace = namespace
        self.probe = Probe()
        self._actor_class = None
        self._pool_actor_class = None
        self._seq = 0  # the last set_models call's order (``_next_seq``)
        self._handles: dict[str, object] = {}  # replica id -> actor handle
        self._watches: dict[str, asyncio.Task] = {}
        self._dead: set[str] = set()
        self._stopping: set[str] = set()  # being stopped by us: their exit is no failure
        # Who creates the actors, given to each before it starts (``reap_orphans`` of a later platform reads it).
        self.owner = {"host": socket.gethostname(), "state_dir": str(state_dir), "store": store_id,
                      "pid": os.getpid()}
        # Actor names ``reap_orphans`` need not ask again (it runs on the supervisor's timer): those of other
        # platforms (another host or state directory: an owner never changes). And those it could not ask
        # (not placed yet), logged once.
        self._foreign: set[str] = set()
        self._unanswered: set[str] = set()

    async def open(self) -> None:
        import ray

        if not ray.is_initialized():
            await asyncio.to_thread(connect, self.address, self.namespace)
        self._actor_class = ray.remote(ReplicaActor)
        await self.probe.open()

    async def close(self) -> None:
        for task in self._watches.values():
            task.cancel()
        await self.probe.close()

    def want_spare(self, wanted: bool) -> None:
        """No warm spare on Ray: a spare would hold a CPU of the cluster without knowing its node."""

    # ---- actors ---------------------------------------------------------------------------------
    def _name(self, replica_id: str) -> str:
        return ACTOR_PREFIX + replica_id

    async def _handle(self, replica_id: str):
        handle = self._handles.get(replica_id)
        if handle is None:
            import ray

            try:
                handle = await asyncio.to_thread(ray.get_actor, self._name(replica_id), self.namespace)
            except ValueError:  # no such actor: it was killed, or its node died
                return None
            self._handles[replica_id] = handle
        return handle

    async def _started(self, handle, row: dict, what: str, *first) -> dict:
        """Await ``first`` (calls the actor must take before its serve starts), then its start; a node that
        never takes it or a start that fails ends the actor and answers in Google's format, naming ``what``.
        ``row`` gets the started process's address and files."""
        try:
            for call in first:
                await _result(call, START_TIMEOUT_S)
            info = await _result(handle.start.remote(), START_TIMEOUT_S)
        except asyncio.TimeoutError:
            await self.stop(row)
            raise ApiError("DEADLINE_EXCEEDED", f"no Ray node took {what} within {START_TIMEOUT_S:.0f} s: each "
                           f"needs {self.num_cpus:g} free CPU(s)") from None
        except Exception as exc:
            await self.stop(row)
            raise ApiError("FAILED_PRECONDITION", f"{what} could not start on Ray: {exc}") from None
        row.update(host=info["host"], port=info["port"], grpc_port=info["grpc_port"], pid=info["pid"],
                   log_path=info["log_path"], created=time.time())
        return info

    def _watch(self, replica_id: str, handle) -> None:
        async def watch() -> None:
            try:
                what = f"its modelyard serve process exited with code {await _result(handle.wait.remote())}"
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # RayActorError: the actor (or its node) is gone
                what = f"its Ray actor is gone ({type(exc).__name__})"
            if replica_id in self._stopping:  # our own stop: no failure
                return
            log.warning("replica %s: %s", replica_id, what)
            self._dead.add(replica_id)
            _kill_actor(handle)  # frees its CPU for the replacement the supervisor starts next

        if replica_id not in self._watches:
            self._watches[replica_id] = asyncio.get_running_loop().create_task(watch())

    def _attach(self, row: dict) -> None:
        """Watch a replica this platform did not start (another platform's, before it took the lead)."""
        async def attach() -> None:
            handle = await self._handle(row["id"])
            self._watches.pop(row["id"], None)
            if handle is None:
                self._dead.add(row["id"])
            else:
                self._watch(row["id"], handle)

        self._watches[row["id"]] = asyncio.get_running_loop().create_task(attach())

    # ---- the engine's calls ---------------------------------------------------------------------
    async def start(self, replica_id: str, dm_id: str, model_path: Path, use_spare: bool = False) -> dict:
        """Start a replica actor (placed by Ray) serving ``model_path``, published to object storage for
        its node; returns its row once AVAILABLE. (``use_spare``: ignored, there is no spare on Ray.)"""
        began = time.monotonic()
        try:
            source = await asyncio.to_thread(artifact_cache.publish, model_path)
        except artifact_cache.ArtifactError as exc:
            raise ApiError("FAILED_PRECONDITION", f"replica for deployed model {dm_id}: {exc}") from None
        published = time.monotonic()
        secret = replica_secrets.new_secret()
        replica_secrets.remember(replica_id, secret)
        handle = self._actor_class.options(
            name=self._name(replica_id), namespace=self.namespace, lifetime="detached", num_cpus=self.num_cpus,
            scheduling_strategy="SPREAD", max_restarts=0, max_concurrency=4,
        ).remote(replica_id, source.as_dict(), self.serve_args, self.owner, secret)
        self._handles[replica_id] = handle
        row = {"id": replica_id, "deployed_model_id": dm_id, "pid": 0, "port": 0}
        info = await self._started(handle, row, f"the replica of deployed model {dm_id}")
        log.info("replica %s of deployed model %s on Ray node %s (%s:%d), model %s%s", replica_id, dm_id,
                 info["node_id"][:12], info["host"], info["port"], info["model_dir"],
                 " (fetched into the node's cache)" if info["cached"] else "")
        self._watch(replica_id, handle)

        async def exited() -> str | None:
            if replica_id not in self._dead:
                return None
            try:
                return f"exited: {await _result(handle.log_tail.remote(), 10)}"
            except Exception as exc:
                return f"is gone ({type(exc).__name__})"

        listening = time.monotonic()
        await self.probe.wait_available(row, model_path, exited, self.stop)
        # Where a replica's start time goes (a replacement's included), for the operator: the actor's own
        # figures are durations on its node; the rest of its start call is Ray placing the actor (waiting
        # for a free CPU: a stuck replica's actor must end first) and starting its worker process.
        address_s, fetch_s, listen_s = (info.get(k, 0.0) for k in ("address_s", "fetch_s", "listen_s"))
        log.info("replica %s available %.1f s after its start: published %.1f s, Ray placed its actor and "
                 "started its worker %.1f s, node address %.1f s, model on the node %.1f s, serve listening "
                 "%.1f s, model AVAILABLE %.1f s later", replica_id, time.monotonic() - began, published - began,
                 max(0.0, listening - published - address_s - fetch_s - listen_s), address_s, fetch_s, listen_s,
                 time.monotonic() - listening)
        return row

    # ---- deployment resource pools' replicas (dataplane/pools.py: RayPools) ---------------------------
    async def start_pool_replica(self, replica_id: str, pool_id: str, sources: dict[str, dict], serve_args: list[str],
                                 roots: list[str] | None) -> dict:
        """A pool replica's actor, placed by Ray as any replica (SPREAD over the nodes), told the pool's
        models (``sources``: deployed model id -> its published source) before its serve child starts;
        returns its row (``pool_db``'s) once the child listens."""
        secret = replica_secrets.new_secret()
        replica_secrets.remember(replica_id, secret)
        if self._pool_actor_class is None:
            import ray

            self._pool_actor_class = ray.remote(PoolReplicaActor)
        handle = self._pool_actor_class.options(
            name=self._name(replica_id), namespace=self.namespace, lifetime="detached", num_cpus=self.num_cpus,
            scheduling_strategy="SPREAD", max_restarts=0, max_concurrency=4,
        ).remote(replica_id, serve_args, self.owner, secret, roots)
        self._handles[replica_id] = handle
        row = {"id": replica_id, "pool_id": pool_id, "pid": 0, "port": 0}
        info = await self._started(handle, row, f"a replica of deployment resource pool {pool_id}",
                                   handle.set_models.remote(self._next_seq(), sources))
        log.info("replica %s of deployment resource pool %s on Ray node %s (%s:%d)", replica_id, pool_id,
                 info["node_id"][:12], info["host"], info["port"])
        self._watch(replica_id, handle)
        return row

    def _next_seq(self) -> int:
        # Nanoseconds: a later platform's calls (after a restart) still come after its predecessor's.
        self._seq = max(self._seq + 1, time.time_ns())
        return self._seq

    def tell_models(self, replica_id: str, sources: dict[str, dict]) -> None:
        """The pool replica's actor serves exactly ``sources`` from now on (a call not waited for: the pool
        waits for the replica to list a new model over HTTP, as for a local one). No handle: the actor is
        gone or not adopted yet, and a replacement or adoption tells it the whole set again."""
        handle = self._handles.get(replica_id)
        if handle is not None:
            try:
                handle.set_models.remote(self._next_seq(), sources)
            except Exception:  # the actor is gone: the supervisor replaces the replica
                log.warning("replica %s: could not tell its actor the pool's models", replica_id)

    def tell_load(self, replica_id: str, dm_id: str) -> None:
        """The pool replica's actor has its child load ``dm_id`` ahead of its requests (not waited for)."""
        handle = self._handles.get(replica_id)
        if handle is not None:
            try:
                handle.load_ahead.remote(dm_id)
            except Exception:  # the actor is gone: the supervisor replaces the replica
                log.warning("replica %s: could not tell its actor to load model %s ahead", replica_id, dm_id)

    async def set_models(self, replica_id: str, sources: dict[str, dict], timeout_s: float) -> None:
        """``tell_models``, waited for: raises the actor's error (its node could not fetch a model's files)
        as FAILED_PRECONDITION. An actor that is gone raises nothing: the supervisor replaces it."""
        handle = await self._handle(replica_id)
        if handle is None:
            return
        try:
            await _result(handle.set_models.remote(self._next_seq(), sources), timeout_s)
        except asyncio.TimeoutError:
            raise ApiError("DEADLINE_EXCEEDED", f"replica {replica_id} did not take its models within "
                           f"{timeout_s:.0f} s") from None
        except Exception as exc:
            if type(exc).__name__ in ("RayActorError", "ActorDiedError", "ActorUnavailableError"):
                return
            lines = str(exc).strip().splitlines()
            raise ApiError("FAILED_PRECONDITION", f"replica {replica_id} could not take its models: "
                           f"{lines[-1] if lines else type(exc).__name__}") from None

    async def log_tail(self, row: dict) -> str:
        """The end of the replica's log, which is on its node."""
        handle = await self._handle(row["id"])
        try:
            return await _result(handle.log_tail.remote(), 10) if handle is not None else "(its Ray actor is gone)"
        except Exception as exc:
            return f"(its Ray actor is gone: {type(exc).__name__})"

    async def learn_secret(self, row: dict) -> None:
        """An adopted (or followed) pool replica's secret, from its actor, unless known."""
        if replica_secrets.secret_of(row) is None:
            await self._learn_secret(row)

    async def healthy(self, row: dict) -> bool:
        if replica_secrets.secret_of(row) is None:  # another platform's replica: its actor says its secret
            await self._learn_secret(row)
        return (await self.probe.status(row))[0]

    async def _learn_secret(self, row: dict) -> None:
        handle = await self._handle(row["id"])
        if handle is None:
            return
        try:
            replica_secrets.remember(row["id"], (await _result(handle.info.remote(), 30)).get("secret"))
        except Exception:  # gone or not answering: the probe then fails as for any dead replica
            pass

    def alive(self, row: dict) -> bool:
        if row["id"] in self._dead:
            return False
        if row["id"] not in self._watches:
            self._attach(row)
        return True

    async def adopt(self, row: dict) -> bool:
        """A replica a previous platform started: its actor exists, its serve process runs and serves."""
        handle = await self._handle(row["id"])
        if handle is None:
            return False
        try:
            info = await _result(handle.info.remote(), 30)
        except Exception:
            return False
        replica_secrets.remember(row["id"], info.get("secret"))
        if not info["running"] or info["pid"] != row["pid"] or not await self.healthy(row):
            return False
        self._watch(row["id"], handle)
        return True

    async def stop(self, row: dict, grace_s: float = 10.0) -> None:
        """Drain and stop the serve process (SIGTERM, SIGKILL after ``grace_s``), then end the actor."""
        began = time.monotonic()
        handle = await self._handle(row["id"])
        self._stopping.add(row["id"])
        replica_secrets.forget(row["id"])
        if handle is not None:
            try:
                await _result(handle.stop.remote(grace_s), grace_s + 15)
            except Exception:  # the actor is gone or stuck: killing it below ends its child too
                pass
            _kill_actor(handle)
            log.info("replica %s: serve process stopped and actor killed in %.1f s", row["id"],
                     time.monotonic() - began)
        task = self._watches.pop(row["id"], None)
        if task is not None:
            task.cancel()
        self._handles.pop(row["id"], None)
        self._dead.discard(row["id"])
        self._stopping.discard(row["id"])

    async def reap_orphans(self, keep: list[dict]) -> int:
        """End every replica actor a platform on this host and state directory (or store) created whose
        platform is gone, except those of ``keep`` (rows: adopted or listed in the store) and this engine's own:
        actors whose row was never written (a kill -9 between start and store). Their serve children
        die with them. An actor that cannot say its owner in time (not placed yet: no free CPU) is left
        alone this time; the supervisor calls this on its timer too, so it is ended once Ray places it.
        Returns how many were ended."""
        import ray

        kept = {row["id"] for row in keep} | set(self._handles)
        listed = [n for n in await asyncio.to_thread(ray.util.list_named_actors) if n.startswith(ACTOR_PREFIX)]
        self._foreign &= set(listed)
        self._unanswered &= set(listed)
        names = [n for n in listed if n[len(ACTOR_PREFIX):] not in kept and n not in self._foreign]

        async def orphan(name: str):
            """The actor's handle if a dead platform of this state directory created it, else None."""
            try:
                handle = await asyncio.to_thread(ray.get_actor, name, self.namespace)
                owner = (await _result(handle.info.remote(), OWNER_TIMEOUT_S)).get("owner") or {}
            except Exception as exc:  # gone meanwhile, or not answering (not placed yet): asked again later
                if name not in self._unanswered:
                    self._unanswered.add(name)
                    log.info("replica actor %s: owner unknown (%s); asked again on the supervisor's timer", name,
                             type(exc).__name__)
                return None
            self._unanswered.discard(name)
            ours = owner.get("state_dir") == self.owner["state_dir"] or (
                self.owner["store"] and owner.get("store") == self.owner["store"])
            if owner.get("host") != self.owner["host"] or not ours:
                self._foreign.add(name)
                return None  # another platform's (another state directory and store, or another host)
            if is_platform(int(owner.get("pid") or 0)):
                return None  # its platform runs (another one on this state directory): a deploy in progress
            log.warning("ending replica actor %s: created by platform pid %s, which is gone, and listed nowhere",
                        name, owner.get("pid"))
            return handle

        found = [h for h in await asyncio.gather(*(orphan(n) for n in names)) if h is not None]
        for handle in found:
            _kill_actor(handle)
        return len(found)
