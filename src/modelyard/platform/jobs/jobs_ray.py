"""Where a CustomJob's replicas run under ``--engine ray``: one Ray actor per replica, on the cluster's nodes.

Only the *where* lives here; what the two engines share stays in ``custom_jobs.run_pools`` and the
launcher: the replicas' environment, ``TF_CONFIG`` (``cluster.tf_config``) and the job's state
(``launcher.Supervisor.wait``: the chief's exit decides, a failed replica fails the job with its
last lines, cancel stops every replica).

``place`` starts one ``JobReplicaActor`` per task (SPREAD over the nodes, one CPU each by default, the
pool's accelerators as GPUs); each reports its node's id and address (as the cluster knows it) and
reserves a port by holding a socket bound on that node until its process starts. Those addresses
are the cluster spec. ``RaySupervisor`` is the launcher's supervisor with each task's process
started by its actor: the actor's ``RemoteProcess`` stands in for ``subprocess.Popen`` (``pid``,
``poll``, ``wait``, ``stdout.readline``), so the launcher's reading, waiting and stopping are the
local ones. The actors belong to the job's process (not detached): if it dies, Ray ends them, and
each replica process dies with its actor (PR_SET_PDEATHSIG), so no replica outlives its job.

No node shares a disk with the platform (``NodeSetup``: what each replica's node makes for itself, in
a scratch directory of its own):

- the job's Python packages (``python_package_spec``) reach the node through storage (``gs://``,
  ``s3://`` URIs are fetched there) or, for a file of the platform's host, as bytes through Ray's
  object store; the node makes the job's virtual environment (``job_env.PythonEnv``) and installs them;
- ``/gcs/<bucket>/...`` paths in the command, args and env are the node's own mirror
  (``job_env.GcsMount`` without a served root): staged in from storage before the process starts,
  every file it created or changed written back to its bucket when it ends;
- the job's Python (``job_env.PythonEnv``, with or without packages) and its identity: each replica's
  actor starts on its node the job's metadata server and storage gateway (``job_identity.serve``, the
  rule a local job's process follows) from the storage's address, the job's own token and project
  (``PLATFORM_ENV``), so ``google.auth.default()``, ``storage.Client()``, a no-argument
  ``aiplatform.init()`` and TensorFlow's own ``gs://`` work there as in a local job;
- a ``gs://`` ``baseOutputDirectory``: ``AIP_MODEL_DIR``, ``AIP_CHECKPOINT_DIR`` ... are ``gs://``
  URIs the trainer writes itself (``model.save``, checkpoints, summaries: TensorFlow's ``gs://``
  through the node's gateway; google-cloud-storage, gcsfs), as on Vertex;
- a local base output directory (a path of the platform's host): the node writes the same tree
  under its scratch directory, and it is copied back into the host's directory (Ray's object
  store) when the replica's process ends;
- the replica's working directory is its scratch directory; the scratch directory is removed
  once its output is back.

The replicas' output lines travel back to the platform's job log as they are printed (``read``).
A tuning job's trial is a job of its own here (``trial_job``): its replica's metric files
(``live_files``: the ``cloudml-hypertune`` file, ``metrics.json``) are brought back to the trial's
directory on the platform while it runs (``JobReplicaActor.live``), so the tuner reads each
measurement as it is reported; the files its command names by relative paths (``NodeSetup.files``)
are written into its working directory first.
A replica whose node dies ends as killed by SIGKILL; the launcher's supervision then fails the job
naming that node (``[modelyard] started pid ... on Ray node ...`` is in its log).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from modelyard import node_cache, objstore
from modelyard.platform.dataplane.replicas_ray import NAMESPACE, _die_with_parent, connect
from modelyard.training import launcher
from modelyard.training.cluster import EVALUATOR, Task
from modelyard.tuning.metrics import METRICS_JSON

NODE_ID_ENV = "MODELYARD_RAY_NODE_ID"  # tells a replica which Ray node it runs on
ACTOR_PREFIX = "modelyard-job-"
PLACE_TIMEOUT_S = 300.0  # a busy cluster may free CPUs later; longer than that, the job cannot be placed
CALL_TIMEOUT_S = 60.0
READ_WAIT_S = 1.0  # how long one log read waits on the node for new lines
LIVE_S = 0.5  # how often a trial's metric files are brought from its node while it runs


# What a job's replica finds of its platform on any node: the storage (the job's own token for it, never
# the platform's: the job's process holds none, job_identity.without_admin_token) and the API's URL
# (sdk_defaults). The node's metadata server and gateway are made from them (JobReplicaActor._identity).
PLATFORM_ENV = ("STORAGE_EMULATOR_HOST", "MODELYARD_STORAGE_TOKEN", "MODELYARD_PLATFORM")
# The command's interpreter for a python_package_spec pool: the node's job venv replaces it.
PACKAGE_PYTHON = "<job-python>"


@dataclasses.dataclass(frozen=True)
class NodeSetup:
    """What a node makes for a replica: the packages to install (each ``(file name, URI in storage |
    bytes)``), the platform's local base output directory, if the job has one, and files the job's
    command names by relative paths (``(relative path, bytes)``: a tuning job's shipped trial files),
    written into the replica's working directory."""

    packages: tuple[tuple[str, Any], ...] = ()
    host_output: str | None = None
    files: tuple[tuple[str, bytes], ...] = ()

    @classmethod
    def of(cls, package_uris: list[str], host_output: str | None,
           files: dict[str, bytes] | None = None) -> "NodeSetup":
        """Packages in storage go as URIs; a file of the platform's host as its bytes."""
        packages = []
        from modelyard.platform.jobs.job_packages import storage_uri

        for uri in dict.fromkeys(storage_uri(u) for u in package_uris):  # /gcs/B/P: the object gs://B/P
            if objstore.is_remote(uri):
                packages.append((uri.rstrip("/").rsplit("/", 1)[-1], uri))
            else:
                path = Path(objstore.local_path(uri))
                packages.append((path.name, path.read_bytes()))
        return cls(tuple(packages), host_output, tuple(sorted((files or {}).items())))


def unpack_output(data: bytes, into: str) -> int:
    """A node's output tree (``node_cache.pack`` bytes) merged into ``into``; how many files."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        members = tar.getmembers()
        tar.extractall(into, filter="data")
    return len(members)


def live_files(env: dict[str, str], output: Path) -> list[Path]:
    """The files a tuning trial's metric is read from while it runs (``CLOUD_ML_HP_METRIC_FILE``, and
    ``modelyard train``'s ``metrics.json`` in ``MODELYARD_JOB_DIR``), when they are under the node's
    ``output`` (the trial's directory, copied back whole only at the end): the tuner on the platform
    reads them live, for early stopping and the trial's measurements."""
    named = [env.get("CLOUD_ML_HP_METRIC_FILE")]
    if env.get("MODELYARD_JOB_DIR"):
        named.append(os.path.join(env["MODELYARD_JOB_DIR"], METRICS_JSON))
    out = []
    for path in filter(None, named):
        if Path(path).resolve().is_relative_to(output.resolve()):
            out.append(Path(path))
    return out


def changed_files(paths: list[Path], root: Path, seen: dict[Path, int]) -> dict[str, bytes]:
    """``paths`` (under ``root``) whose modification time changed since ``seen`` (updated), as
    ``{path relative to root: contents}``; an absent file is left for the next call."""
    out = {}
    for path in paths:
        try:
            mtime = path.stat().st_mtime_ns
            if seen.get(path) == mtime:
                continue
            data = path.read_bytes()
        except OSError:
            continue
        seen[path] = mtime
        out[path.resolve().relative_to(root.resolve()).as_posix()] = data
    return out


def write_live(host_output: str, files: dict[str, bytes]) -> None:
    """``changed_files``' answer written under the platform's ``host_output``, each file replaced whole
    (a reader never sees half of one)."""
    for rel, data in files.items():
        target = Path(host_output) / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.live")
        tmp.write_bytes(data)
        os.replace(tmp, target)


def _node() -> tuple[str, str]:
    """(node id, node address) of the Ray node this code runs on, the address as the cluster knows it."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    host = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), None)
    return node_id, host or ray.util.get_node_ip_address()


class JobReplicaActor:
    """Runs on a Ray node (threaded actor): one replica process of a job, its output and its end."""

    def __init__(self) -> None:
        self.node_id = ""
        self.host = ""
        self._port_socket: socket.socket | None = None
        self.proc: subprocess.Popen | None = None
        self.generation = 0  # one per start: a worker restarted in place is a new generation
        self._lines: collections.deque[bytes] = collections.deque()
        self._first = 0  # index of _lines[0] in this generation's output
        self._ended = False
        self._cond = threading.Condition()
        self._exited = threading.Event()
        self._live: list[Path] = []  # a trial's metric files (live_files), read while it runs
        self._live_seen: dict[Path, int] = {}

    def reserve(self, want_port: bool) -> dict:
        """This node's id and address, and (``want_port``) a port held free on it until ``start``."""
        self.node_id, self.host = _node()
        port = None
        if want_port:
            self._port_socket = socket.socket()
            self._port_socket.bind((self.host, 0))
            port = self._port_socket.getsockname()[1]
        return {"node_id": self.node_id, "host": self.host, "port": port}

    def _localize(self, command: list[str], env: dict[str, str], setup: NodeSetup
                  ) -> tuple[list[str], dict[str, str], str]:
        """The command, env and working directory as this node runs them (see ``NodeSetup``)."""
        from modelyard.platform.jobs import job_env, job_packages

        # Storage settings first: the mirror and the packages are fetched with them.
        for key in ("STORAGE_EMULATOR_HOST", "MODELYARD_STORAGE_TOKEN"):
            if key in env:
                os.environ[key] = env[key]
        root = Path(tempfile.gettempdir()) / "modelyard-jobs"
        root.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix="job-", dir=root))
        self.mount = job_env.GcsMount(self.scratch, None)
        self.mount.stage_in(command + list(env.values()))
        command = [self.mount.rewrite(a) for a in command]
        env = {k: self.mount.rewrite(v) for k, v in env.items()}
        for rel, data in setup.files:  # the command's relative paths find them in its working directory
            target = (self.scratch / rel).resolve()
            if not target.is_relative_to(self.scratch.resolve()):
                raise ValueError(f"{rel}: not a relative path inside the job")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        uris = []
        for name, source in setup.packages:  # a file of the platform's host came as its bytes
            if isinstance(source, bytes):
                target = self.scratch / "host-packages" / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(source)
                source = str(target)
            uris.append(source)
        # The job's own Python, packages or none, as a local job's (its venv carries sdk_defaults).
        python = job_packages.install(self.scratch, uris)  # the one rule every job's packages follow
        env = {**env, **python.env()}
        command = [python.python if a == PACKAGE_PYTHON else a for a in command]
        if setup.host_output:
            here = str(self.scratch / "output")
            host = setup.host_output.rstrip("/")
            env = {k: v.replace(host, here) for k, v in env.items()}
            command = [a.replace(host, here) for a in command]
            for key in ("AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR"):
                if env.get(key, "").startswith(here):
                    Path(env[key]).mkdir(parents=True, exist_ok=True)
            self._live = live_files(env, self.scratch / "output")
        return command, env, str(self.scratch)

    def finish(self, generation: int, setup: NodeSetup) -> dict:
        """Once the process of ``generation`` ended: its /gcs/ writes back to storage, its local output
        as bytes for the platform (``{"published", "output"}``), and the scratch directory removed."""
        self._exited.wait()
        out: dict = {"published": 0, "output": None}
        scratch = getattr(self, "scratch", None)
        if scratch is None or generation != self.generation:
            return out
        try:
            out["published"] = self.mount.publish()
            if setup.host_output and (scratch / "output").is_dir():
                out["output"] = node_cache.pack(scratch / "output")[1]
        except Exception as exc:  # the job fails saying so: its output did not come back whole
            out["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            self.scratch = None
        return out

    def start(self, command: list[str], env: dict[str, str], unset: list[str], cwd: str,
              setup: NodeSetup | None = None) -> dict:
        """Start the replica's process with this node's environment plus ``env``; ``{"pid"}`` or ``{"error"}``."""
        if self._port_socket is not None:  # the replica binds it now
            self._port_socket.close()
            self._port_socket = None
        self._live, self._live_seen = [], {}
        if setup is not None:
            try:
                command, env, cwd = self._localize(command, env, setup)
            except Exception as exc:  # JobFailed from pip, StorageError, OSError: the job fails with it
                message = getattr(exc, "message", None) or str(exc)
                return {"error": f"preparing the replica on Ray node {self.node_id[:12]} ({self.host}): {message}"}
        full = {k: v for k, v in os.environ.items() if k not in unset}
        full.update(env)
        full[NODE_ID_ENV] = self.node_id
        with self._cond:
            self.generation += 1
            self._lines.clear()
            self._first = 0
            self._ended = False
        self._exited.clear()
        started = threading.Event()
        error: list[str] = []
        # Forked from a thread that lives exactly as long as the process: PDEATHSIG fires when that
        # thread ends, which is when the process has exited or the actor is gone.
        threading.Thread(target=self._run, args=(command, full, cwd if os.path.isdir(cwd) else None, started, error),
                         daemon=True).start()
        started.wait()
        if error:
            return {"error": error[0]}
        return {"pid": self.proc.pid, "generation": self.generation, "live": bool(self._live)}

    def _run(self, command, env, cwd, started: threading.Event, error: list[str]) -> None:
        with contextlib.ExitStack() as identity:
            try:
                self._identity(identity, env)
                self.proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True, preexec_fn=_die_with_parent)
            except Exception as exc:  # OSError of either process, or the identity's certificates
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
                error.append(f"cannot start {command[0]} on Ray node {self.node_id[:12]} ({self.host}): {why}")
                with self._cond:
                    self._ended = True
                    self._cond.notify_all()
                self._exited.set()
                started.set()
                return
            started.set()
            for raw in iter(self.proc.stdout.readline, b""):
                with self._cond:
                    self._lines.append(raw)
                    self._cond.notify_all()
            self.proc.stdout.close()
            self.proc.wait()
        with self._cond:
            self._ended = True
            self._cond.notify_all()
        self._exited.set()

    def _identity(self, stack: contextlib.ExitStack, env: dict[str, str]) -> None:
        """The job's metadata server and storage gateway on this node for the replica's process, as a
        local job's processes have theirs (``job_identity.serve``: the same rule), ``env`` pointing at
        it. Started from the thread that lives as long as the process, so it dies with the actor too."""
        from modelyard.platform.jobs import job_identity

        scratch = getattr(self, "scratch", None)
        if scratch is None or not env.get("STORAGE_EMULATOR_HOST"):
            return
        served = stack.enter_context(job_identity.serve(
            scratch, env["STORAGE_EMULATOR_HOST"], env.get("MODELYARD_STORAGE_TOKEN"),
            env.get("CLOUD_ML_PROJECT_ID") or "local", env))
        job_identity.apply(env, served)

    def read(self, generation: int, start: int, wait_s: float) -> tuple[list[bytes], bool]:
        """Output lines from index ``start`` on (waiting up to ``wait_s`` for some), and whether the
        output has ended. Lines before ``start`` were read: they are dropped here."""
        with self._cond:
            if generation != self.generation:
                return [], True
            while self._first < start and self._lines:
                self._lines.popleft()
                self._first += 1
            if not self._lines and not self._ended:
                self._cond.wait(wait_s)
            return list(self._lines), self._ended

    def live(self, generation: int) -> dict[str, bytes]:
        """The trial's metric files that changed since the last call (``changed_files``, paths relative
        to the node's output), while the process of ``generation`` runs."""
        scratch = getattr(self, "scratch", None)
        if generation != self.generation or scratch is None:
            return {}
        return changed_files(self._live, scratch / "output", self._live_seen)

    def wait(self, generation: int) -> int | None:
        """The exit code of the process of ``generation``, once it has exited."""
        self._exited.wait()
        return self.proc.returncode if self.proc is not None and generation == self.generation else None

    def signal(self, sig: int) -> None:
        """``sig`` to the replica's process group (its children too)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class _RemoteLines:
    """``readline()`` over a replica's output on its node, as the launcher reads a pipe; b"" at the end."""

    def __init__(self, actor, generation: int) -> None:
        self.actor = actor
        self.generation = generation
        self.next = 0
        self.buffer: collections.deque[bytes] = collections.deque()
        self.ended = False

    def readline(self) -> bytes:
        import ray

        while not self.buffer:
            if self.ended:
                return b""
            try:
                lines, ended = ray.get(self.actor.read.remote(self.generation, self.next, READ_WAIT_S),
                                       timeout=CALL_TIMEOUT_S)
            except Exception:  # the actor or its node is gone: no more output
                self.ended = True
                continue
            self.buffer.extend(lines)
            self.next += len(lines)
            self.ended = ended  # then the lines just read are the last
        return self.buffer.popleft()

    def close(self) -> None:
        pass


class RemoteProcess:
    """A replica process on a Ray node, with the parts of ``subprocess.Popen`` the launcher uses."""

    def __init__(self, actor, pid: int, generation: int, setup: NodeSetup | None = None,
                 emit=lambda line: None, lost=lambda exc: None, live: bool = False) -> None:
        self.actor = actor
        self.pid = pid
        self.returncode: int | None = None
        self.stdout = _RemoteLines(actor, generation)
        self._done = threading.Event()
        self._setup = setup
        self._emit = emit
        self._lost = lost
        # Once the process has exited, its whole output comes back (_collect) and no live copy may land
        # after it: a copy read just before the end would put an older metric file back.
        self._live_lock = threading.Lock()
        self._final = False
        threading.Thread(target=self._watch, args=(generation,), daemon=True).start()
        if live and setup is not None and setup.host_output:
            threading.Thread(target=self._mirror, args=(generation,), daemon=True).start()

    def _mirror(self, generation: int) -> None:
        """A trial's metric files brought to the platform's copy of its directory as they change, until
        the process ends (then ``finish`` brings everything)."""
        import ray

        while not self._done.wait(LIVE_S):
            try:
                files = ray.get(self.actor.live.remote(generation), timeout=CALL_TIMEOUT_S)
                with self._live_lock:
                    if self._final:
                        return
                    write_live(self._setup.host_output, files)
            except Exception:  # the actor is gone (its end is _watch's) or the host's disk refused: next time
                continue

    def _watch(self, generation: int) -> None:
        import ray

        try:
            code = ray.get(self.actor.wait.remote(generation))
        except Exception as exc:  # the actor (or its node) died: so did the process
            code = -signal.SIGKILL
            self._lost(exc)
        else:
            # Exited: its output comes back before the exit is seen (the job's success means it is there).
            with self._live_lock:
                self._final = True
            code = self._collect(generation, code)
        self.returncode = -signal.SIGKILL if code is None else code
        self._done.set()

    def _collect(self, generation: int, code: int | None) -> int | None:
        import ray

        if self._setup is None:
            return code
        try:
            got = ray.get(self.actor.finish.remote(generation, self._setup), timeout=PLACE_TIMEOUT_S)
            if got.get("error"):
                raise RuntimeError(got["error"])
            if got["published"]:
                self._emit(f"[modelyard] wrote {got['published']} file(s) under /gcs/ back to their buckets")
            if got["output"] is not None:
                n = unpack_output(got["output"], self._setup.host_output)
                self._emit(f"[modelyard] copied {n} output file(s) from the node to {self._setup.host_output}")
        except Exception as exc:
            self._emit(f"[modelyard] the replica's output could not be brought back: {type(exc).__name__}: {exc}")
            return code or 1
        return code

    def poll(self) -> int | None:
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"replica pid {self.pid}", timeout)
        return self.returncode


class Placement:
    """The job's actors, one per task, and where each landed."""

    def __init__(self, address: str, job_id: str) -> None:
        self.address = address
        self.job_id = job_id
        self.actors: dict[Task, object] = {}
        self.where: dict[Task, dict] = {}

    def connect(self) -> None:
        """Join the cluster as this job's driver; JobFailed if it cannot be reached."""
        from modelyard.platform.jobs.job_runner import JobFailed
        from modelyard.platform.dataplane.replicas_ray import EngineUnavailable

        try:
            connect(self.address)
        except EngineUnavailable as exc:
            raise JobFailed(str(exc), "UNAVAILABLE") from None

    def place(self, counts: dict[str, int], evaluator: bool, gpus: dict[str, float],
              num_cpus: float = 1.0) -> dict[str, list[str]]:
        """Start the actors (SPREAD) and return the cluster spec of their nodes' addresses and ports."""
        import ray

        from modelyard.platform.jobs.job_runner import JobFailed

        remote = ray.remote(JobReplicaActor)
        tasks = [Task(role, i) for role in ("chief", "worker", "ps") for i in range(counts.get(role, 0))]
        if evaluator:
            tasks.append(Task(EVALUATOR, 0))
        # A replica no node could ever take would wait for placement forever: say so now instead.
        nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
        for role in dict.fromkeys(t.type for t in tasks):
            need = {"CPU": num_cpus, "GPU": gpus.get(role, 0)}
            if not any(all(have.get(k, 0) >= v for k, v in need.items() if v) for have in nodes):
                raise JobFailed(f"no node of the Ray cluster has {num_cpus:g} CPU(s) and {need['GPU']:g} GPU(s) "
                                f"for a {role} replica (machine_spec.accelerator_count); nodes have: "
                                + "; ".join(f"{h.get('CPU', 0):g} CPU, {h.get('GPU', 0):g} GPU" for h in nodes),
                                "FAILED_PRECONDITION")
        for task in tasks:
            self.actors[task] = remote.options(
                name=f"{ACTOR_PREFIX}{self.job_id}-{task.type}-{task.index}", namespace=NAMESPACE,
                num_cpus=num_cpus, num_gpus=gpus.get(task.type, 0), scheduling_strategy="SPREAD", max_restarts=0,
                max_concurrency=8).remote()
        refs = {self.actors[t].reserve.remote(t.type != EVALUATOR): t for t in tasks}
        deadline = time.monotonic() + PLACE_TIMEOUT_S
        pending = list(refs)
        while pending:
            if launcher._STOP_REQUESTED.is_set():
                raise KeyboardInterrupt  # cancelled while waiting for nodes
            if time.monotonic() > deadline:
                raise JobFailed(f"{len(pending)} of the job's {len(tasks)} replica(s) found no Ray node within "
                                f"{PLACE_TIMEOUT_S:.0f} s: each needs {num_cpus:g} free CPU(s) (and its pool's GPUs)",
                                "RESOURCE_EXHAUSTED")
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
            for ref in done:
                self.where[refs[ref]] = ray.get(ref)
        spec: dict[str, list[str]] = {}
        for task in tasks:
            if task.type != EVALUATOR:
                spec.setdefault(task.type, []).append(f"{self.where[task]['host']}:{self.where[task]['port']}")
        return spec

    def close(self) -> None:
        """End every actor of the job (their processes die with them)."""
        import ray

        for handle in self.actors.values():
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # already gone
                pass


def node_env(env: dict[str, str], here: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """(what a replica's environment ``env`` sets beyond the job's process's own ``here``, what it unsets):
    only that travels, the node's environment (PATH, HOME, ...) is the base there; ``PLATFORM_ENV`` always.
    ``here`` holds the job's own token, never the platform's (the runner's ``without_admin_token``), and
    so do the job's Ray runtime environment (``replicas_ray.connect`` reads it) and every replica."""
    from modelyard.platform.jobs.job_runner import JOB_ID_ENV

    here = os.environ if here is None else here
    delta = {k: v for k, v in env.items() if here.get(k) != v and k != JOB_ID_ENV}
    delta.update({k: env[k] for k in PLATFORM_ENV if k in env})
    return delta, [k for k in here if k not in env]


class RaySupervisor(launcher.Supervisor):
    """The launcher's supervisor, each task's process started by its actor (``placement`` is set by the caller)."""

    placement: Placement

    def _start_task(self, task: Task) -> launcher.Running:
        import ray

        delta, unset = node_env(self._env(task))
        actor = self.placement.actors[task]
        where = self.placement.where[task]
        setup = getattr(self, "node_setup", None)
        # A node installing the job's packages takes as long as pip does.
        got = ray.get(actor.start.remote(self.command, delta, unset, os.getcwd(), setup),
                      timeout=CALL_TIMEOUT_S if setup is None or not setup.packages else PLACE_TIMEOUT_S)
        if "error" in got:
            self.stop()
            raise launcher.LaunchError(got["error"])
        node = f"Ray node {where['node_id'][:12]} ({where['host']})"
        runs: list[launcher.Running] = []

        def lost(exc: Exception) -> None:
            # In the replica's last lines too: the job's error names the node that died.
            line = f"[modelyard] {node} is gone ({type(exc).__name__}): the replica died with it"
            if runs:
                runs[0].tail.append(line)
            self._emit(task, line)

        run = launcher.Running(task, RemoteProcess(actor, got["pid"], got["generation"], setup,
                                                   emit=lambda line: self._emit(task, line), lost=lost,
                                                   live=got.get("live", False)))
        runs.append(run)
        run.reader = threading.Thread(target=self._pump, args=(run,), daemon=True)
        run.reader.start()
        self._emit(task, f"[modelyard] started pid {got['pid']} on Ray node {where['node_id'][:12]} ({where['host']})")
        return run

    def _signal(self, run: launcher.Running, sig: int) -> None:
        import ray

        try:
            ray.get(run.process.actor.signal.remote(sig), timeout=CALL_TIMEOUT_S)
        except Exception:  # the actor is gone, and its process with it
            pass
