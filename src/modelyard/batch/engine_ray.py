"""The Ray engine: the local engine's chunks, run by Ray actors spread over a Ray cluster of
machines that share no disk.

Only *where* a chunk runs differs from ``engine_local``: the job, its plan of chunks, the
per-chunk work (``work.process_chunk``) and the part commits are the same, so both engines write
byte-identical parts and resume each other's jobs. No actor is given a path of the driver's
machine:

- the model directory travels once through Ray's object store as a tar named by its SHA-256;
  each node unpacks it into its own bounded cache (``node_cache``) and a later job with the same
  model on that node fetches nothing;
- a ``gs://``/``s3://`` input of JSON lines, a file list or TFRecord is split by the driver's
  probes (a few KiB read at each nominal chunk boundary, 8 records for TFRecord, ``readers.split``) and each actor reads
  its own chunk's byte range from storage: the object crosses storage once, from every node in
  parallel, and never through the driver's node. A remote CSV (no probe can tell where its rows
  start) is read by the driver's plan, and each chunk's bytes the plan read go on to its actor
  through Ray's object store (a CSV chunk planned by an earlier run, a resume, its actor reads).
  A local input's chunk is read by the driver and sent the same way (no other node sees the
  file). Every read of a remote input is pinned to the version the run looked up
  (``remote.RemoteInputs``): an object replaced mid-job fails the job, never mixes versions. The
  input is never copied whole, to the driver's disk or a node's. The actor keeps the range in a
  scratch file at the same offsets (``Chunk.local_copy``): messages still name the input's own URI;
- the actor predicts the chunk into a scratch job directory and answers with the part's bytes and
  counts; the driver commits them into the job with the same record as the local engine
  (``shards.commit_part_data``: errors part, then the results part's rename). So only the
  driver writes the job, and a remote ``--output`` is published from there as before;
- actors get the driver's storage settings (``STORAGE_EMULATOR_HOST``, ``AWS_ENDPOINT_URL`` ...,
  ``STORAGE_ENV``) through Ray's runtime environment, so a node needs only ``pip install``; not the
  driver's storage token, but a read-only one derived from it for the buckets of the job's inputs
  (``storage_runtime_env``).

A node that dies (its raylet and processes killed, its machine gone) takes its actors with it:
the chunks they held were not committed (only the driver commits), so they are handed to the
live actors again, and a replacement actor is started wherever Ray finds a CPU. Every row still
lands exactly once. If no actor is left and none can start, the job fails naming the dead nodes.

The coordinator is a Ray driver: if it is killed, Ray ends its actors with it (they are not
detached) and nothing more is committed; the same command resumes from the committed parts.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import socket
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

from modelyard import node_cache, objstore, read_tokens
from modelyard.batch.readers import Chunk, file_list
from modelyard.batch.remote import RemoteInputs, read_range
from modelyard.batch.spec import BatchError, JobSpec

# Chunks held by each actor: the one it runs and the next, waiting when the first is answered.
IN_FLIGHT_PER_ACTOR = 2
# While the actors load their models the driver plans ahead, this many chunks per actor at most: a
# planned chunk of a local input or a remote CSV holds its bytes until it is handed out.
PLANNED_AHEAD_PER_ACTOR = IN_FLIGHT_PER_ACTOR
CONNECT_TIMEOUT_S = 5.0
# No actor with its model loaded after this long: the cluster has no CPU for one (or cannot load it).
START_TIMEOUT_S = 600.0
# Every actor dead (their nodes gone) and no replacement ready after this long: the job fails.
REPLACE_TIMEOUT_S = 120.0
WAIT_STEP_S = 1.0
# The driver's settings a node needs to reach the same storage (only those set are passed on).
STORAGE_ENV = ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "MODELYARD_STORAGE_TOKEN",
               "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
               "AWS_DEFAULT_REGION")
TOKEN_ENV = "MODELYARD_STORAGE_TOKEN"  # never passed on as it is: storage_runtime_env


def require_ray():
    """The ``ray`` module, or a BatchError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise BatchError("--engine ray needs Ray: pip install 'modelyard[ray]'") from None
    return ray


def check_reachable(address: str) -> None:
    """Fail fast on an address no one listens at (``ray.init`` would retry for minutes)."""
    if address in ("auto", "local") or address.startswith("ray://"):
        return  # Ray's own resolution, or Ray Client: ray.init says what is wrong
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise BatchError(f"--ray-address {address}: expected HOST:PORT of a Ray cluster's head (GCS) node")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise BatchError(f"--ray-address {address}: no Ray cluster reachable there ({exc.strerror or exc}); "
                         "start one with `ray start --head` or give its head node's HOST:PORT") from None


def connect(address: str | None):
    """``ray.init`` the driver (``address`` None: ``RAY_ADDRESS`` or a new local Ray); returns ``ray``."""
    ray = require_ray()
    # "local", not None: None would join whichever Ray this machine ran last (Ray's address file).
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    if ray.is_initialized() and _JOINED.get("address") == address:
        return ray  # joined already (Ray spells the address its own way: 127.0.0.1 becomes the host's IP)
    check_reachable(address)
    if ray.is_initialized() and address not in ("auto", "local") \
            and ray.get_runtime_context().gcs_address != address:
        ray.shutdown()  # this process drove another cluster before: join the one asked for
    if not ray.is_initialized():
        try:
            # Actors' TensorFlow chatter stays in the cluster's logs; failures come back as exceptions.
            ray.init(address=address, log_to_driver=False, logging_level="ERROR",
                     configure_logging=False, include_dashboard=False if address == "local" else None)
        except Exception as exc:  # ConnectionError, RuntimeError: Ray's message names the cause
            raise BatchError(f"--ray-address {address}: cannot join the Ray cluster: "
                             f"{type(exc).__name__}: {exc}") from None
    _JOINED["address"] = address
    return ray


_JOINED: dict[str, str] = {}  # the address this process joined, as it was asked for


def cluster_cpus(ray) -> int:
    """Whole CPUs of the connected cluster: the default number of actors."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def readable_buckets(spec: JobSpec) -> list[str]:
    """The buckets a job's actors read: its ``gs://`` inputs' (a file list may name objects of any
    bucket: ``*``). The model reaches them through Ray's object store, and only the driver writes."""
    if spec.format == "file-list":
        return ["*"]
    return sorted({f.path[len("gs://"):].split("/", 1)[0] for f in spec.inputs if f.path.startswith("gs://")})


def storage_runtime_env(readable: Iterable[str] = ()) -> dict:
    """Ray ``runtime_env`` passing this process's storage settings on to actors and tasks. Its storage
    token (the platform's, or the job's) is not: the actors get a read-only token derived from it for
    the ``readable`` buckets (``modelyard.read_tokens``), and none when they read no bucket."""
    found = {k: os.environ[k] for k in STORAGE_ENV if os.environ.get(k)}
    token = found.pop(TOKEN_ENV, None)
    readable = sorted(set(readable))
    if token and readable:
        found[TOKEN_ENV] = token if read_tokens.parse(token) is not None else read_tokens.attenuate(token, readable)
    return {"env_vars": found} if found else {}


def _read_range(path: str, start: int, end: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start)


class ChunkWorker:
    """One Ray actor: the job's model from the node's cache, loaded once, then chunks on request (``run``)."""

    def __init__(self, identity: dict, batch_size: int, model: tuple[str, list]):
        from modelyard.batch.engine_local import predictor_for, settle_heap, shaping_of

        import ray

        self.batch_size = batch_size
        spec = JobSpec.from_identity(identity)
        self.shaping = shaping_of(spec)
        self.scratch = Path(tempfile.mkdtemp(prefix="modelyard-batch-"))
        self.predictor: Any = None
        self.load_error: str | None = None
        self.model_dir, self.fetched = "", False
        digest, holder = model  # the ObjectRef in a list: fetched only when this node has no copy
        try:
            local, self.fetched = node_cache.materialize(digest, lambda: ray.get(holder[0]))
            self._model_hold = node_cache.hold(local)  # for the actor's life: no other job prunes it meanwhile
            self.model_dir = str(local)
            self.spec = dataclasses.replace(spec, version_dir=self.model_dir)
            self.predictor = predictor_for(self.spec)
        except Exception as exc:  # reported by ready(): the job fails with the loader's message
            self.spec = spec
            self.load_error = f"loading {spec.version_dir}: {type(exc).__name__}: {exc}"
        else:
            settle_heap()

    def ready(self) -> tuple:
        """``("ok", runtime, node id, node ip, model dir here, fetched now)`` or ``("failed", why, node id, ip)``."""
        import ray

        node, ip = ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
        if self.load_error:
            return ("failed", self.load_error, node, ip)
        return ("ok", self.predictor.runtime, node, ip, self.model_dir, self.fetched)

    def _local(self, chunk: Chunk, data: bytes | None, version: str) -> Chunk:
        """The chunk, its bytes in a scratch file at the same offsets (sparse below them)."""
        if data is None:  # a remote input's chunk the driver has not read: one ranged read, pinned
            data = read_range(chunk.file, chunk.start, chunk.end, version)
            if len(data) != chunk.end - chunk.start:
                raise ValueError(f"{chunk.file} is shorter than its plan: bytes {chunk.start}-{chunk.end} "
                                 f"gave {len(data)} bytes")
        copy = self.scratch / f"c{chunk.index:06d}.input"
        with open(copy, "wb") as f:
            f.seek(chunk.start)
            f.write(data)
        return dataclasses.replace(chunk, local_copy=str(copy))

    def run(self, chunk: Chunk, context: Any, data: bytes | None, version: str = "") -> tuple:
        """``("done", index, ok, err, results bytes, errors bytes)`` or ``("failed", index, why)``."""
        from modelyard.batch.shards import PARTS_DIR
        from modelyard.batch.work import process_chunk

        if self.load_error:
            return ("failed", chunk.index, self.load_error)
        job = self.scratch / f"c{chunk.index:06d}"
        try:
            job.mkdir()
            ok, err = process_chunk(job, self._local(chunk, data, version), self.spec.format, context, self.shaping,
                                    self.predictor, self.batch_size)
            parts = job / PARTS_DIR
            results = (parts / f"c{chunk.index:06d}-ok{ok}-err{err}.results").read_bytes()
            errors = (parts / f"c{chunk.index:06d}.errors").read_bytes()
        except Exception as exc:
            return ("failed", chunk.index, f"chunk {chunk.index} ({chunk.file}): {type(exc).__name__}: {exc}\n"
                                           + traceback.format_exc(limit=3))
        finally:
            shutil.rmtree(job, ignore_errors=True)
            (self.scratch / f"c{chunk.index:06d}.input").unlink(missing_ok=True)
        return ("done", chunk.index, ok, err, results, errors)


class _Todo:
    """The chunks of ``source``, pulled as they are wanted: a plan being made advances only as far
    as the actors need (or while they load their models, ``prefetch``). Each comes with the bytes
    the plan read for it (``held``; None when it read none). Chunks a dead actor held come back
    first (``again``)."""

    def __init__(self, source: Iterable[tuple[Chunk, Any]], held: Callable[[Chunk], bytes | None]):
        self._source = iter(source)
        self._held = held
        self._ahead: collections.deque = collections.deque()
        self.exhausted = False

    def prefetch(self) -> bool:
        """Plan one more chunk ahead; False once the source is exhausted."""
        item = next(self._source, None)
        if item is None:
            self.exhausted = True
            return False
        self._ahead.append((*item, self._held(item[0])))
        return True

    def ahead(self) -> int:
        return len(self._ahead)

    def again(self, item: tuple[Chunk, Any, bytes | None]) -> None:
        self._ahead.appendleft(item)

    def next(self) -> tuple[Chunk, Any, bytes | None] | None:
        if not self._ahead and not self.exhausted:
            self.prefetch()
        return self._ahead.popleft() if self._ahead else None

    def empty(self) -> bool:
        return not self._ahead and (self.exhausted or not self.prefetch())


def run_ray(job_dir: Path, spec: JobSpec, source: Iterable[tuple[Chunk, Any]], batch_size: int,
            workers: int | None, on_done: Callable[[int, int, int], None],
            on_ready: Callable[[str], None] = lambda runtime: None, address: str | None = None,
            log: Callable[[str], None] = lambda message: None, inputs: RemoteInputs | None = None) -> None:
    """Run every chunk of ``source`` (``(chunk, context)`` pairs, maybe a plan still being made) on
    Ray actors, committing each answer into ``job_dir``; ``on_done(index, ok, err)`` after each commit.

    ``workers``: actors to start (None: the cluster's CPUs). ``log`` gets a line per dead worker and
    one at the end: how many actors ran chunks, on how many nodes. ``inputs``: how the plan read the
    job's files (the bytes of each chunk it just planned, the pinned version of each remote input);
    None: the files as they are now. Raises BatchError on failure.
    """
    inputs = inputs or RemoteInputs()
    todo = _Todo(source, inputs.take)
    if isinstance(source, list) and not source:
        return  # a resumed job whose chunks are all committed: no actor to start
    ray = connect(address)
    count = workers or cluster_cpus(ray)
    # The model once into the object store: every node fetches it from there (or finds it cached).
    try:
        digest, packed = node_cache.pack(Path(spec.version_dir))
    except OSError as exc:
        raise BatchError(f"reading the model {spec.version_dir}: {exc}") from None
    model = (digest, [ray.put(packed)])
    del packed
    actor_class = ray.remote(num_cpus=1, scheduling_strategy="SPREAD", max_restarts=0)(ChunkWorker)
    actor_class = actor_class.options(runtime_env=storage_runtime_env(readable_buckets(spec)))
    # The actors start loading the model now; the plan's first chunk (for a remote input: a size
    # lookup and ranged reads of its first rows) is made meanwhile, not before.
    pool = _Pool(ray, lambda: actor_class.remote(spec.identity(), batch_size, model), count, log)
    try:
        if todo.empty():  # inputs without a single row: nothing to predict
            return
        _drive(ray, pool, todo, job_dir, on_done, on_ready, inputs, spec.format)
        nodes = set(pool.nodes.values())
        log(f"ray: {len(pool.nodes)} workers of {count} ran on {len(nodes)} nodes"
            + (f"; {pool.died} died" if pool.died else ""))
    finally:
        # Every chunk is committed (or the job failed): nothing is left for an actor to do.
        for actor in pool.all():
            try:
                ray.kill(actor)
            except Exception:  # its node is gone, and the actor with it
                pass


@dataclasses.dataclass
class _Pool:
    """The job's actors: starting (model loading), live, and how to start a replacement."""

    ray: Any
    start: Callable[[], Any]
    count: int
    log: Callable[[str], None]
    starting: dict = dataclasses.field(default_factory=dict)  # ready() ref -> actor
    live: dict = dataclasses.field(default_factory=dict)  # actor -> chunks it holds
    nodes: dict = dataclasses.field(default_factory=dict)  # actor -> "node id (ip)", once ready
    dead_nodes: list = dataclasses.field(default_factory=list)
    died: int = 0
    started: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        for _ in range(self.count):
            self.add()

    def add(self) -> None:
        actor = self.start()
        self.started.append(actor)
        self.starting[actor.ready.remote()] = actor

    def all(self) -> list:
        return list(self.started)

    def lost(self, actor: Any, why: str, chunks: int) -> None:
        """``actor`` died (its node did): a replacement is started while the budget lasts (as many
        replacements as workers; a model that kills every actor fails the job instead)."""
        self.live.pop(actor, None)
        try:
            self.ray.kill(actor)  # gone already, unless only its answer was lost: then it goes now
        except Exception:
            pass
        for ref, other in list(self.starting.items()):
            if other is actor:
                del self.starting[ref]
        where = self.nodes.get(actor, "a node")
        self.dead_nodes.append(where)
        self.died += 1
        self.log(f"ray: a worker on {where} died ({why}); its {chunks} chunks run again on live workers")
        if self.died <= self.count:
            self.add()


def _drive(ray, pool: _Pool, todo: _Todo, job_dir: Path, on_done: Callable[[int, int, int], None],
           on_ready: Callable[[str], None], inputs: RemoteInputs, fmt: str) -> None:
    """Hand out chunks (of input format ``fmt``) until all are committed."""
    from modelyard.batch.shards import commit_part_data

    running: dict[Any, tuple[Any, tuple[Chunk, Any, bytes | None]]] = {}  # ObjectRef -> (actor, item)

    def fill() -> None:
        # Chunks go only to actors whose model is loaded: on a shared cluster an actor may wait for a
        # CPU for ever, and chunks queued on it would wait with it while the others sit idle.
        for actor in list(pool.live):
            while pool.live[actor] < IN_FLIGHT_PER_ACTOR:
                item = todo.next()
                if item is None:
                    return
                chunk, context, data = item
                # A local input's bytes go to the actor through the object store, read here; a remote
                # one's as the plan read them (CSV), or its actor reads them (found by probes, or
                # planned by an earlier run), pinned to the version this run looked up.
                remote = objstore.is_remote(chunk.file)
                if data is None and not remote:
                    data = _read_range(chunk.file, chunk.start, chunk.end)
                if fmt == "file-list" and not remote:  # the files it names are on this machine too
                    context = file_list.relay(data, context)
                try:
                    version = inputs.version(chunk.file) if remote and data is None else ""
                except ValueError as exc:
                    raise BatchError(str(exc)) from None
                running[actor.run.remote(chunk, context, data, version)] = (actor, item)
                pool.live[actor] += 1

    announced = False
    waited = 0.0
    while running or (pool.starting and not announced) or not todo.empty():
        # While no actor can take work yet, the driver plans ahead instead of only waiting.
        planning = not running and not todo.exhausted and \
            todo.ahead() < PLANNED_AHEAD_PER_ACTOR * max(1, len(pool.live) + len(pool.starting))
        waiting_for = list(pool.starting) + list(running)
        if not waiting_for:  # every actor dead and no replacement left to start
            raise BatchError(f"no Ray worker left to hand the remaining chunks to (dead: "
                             f"{', '.join(pool.dead_nodes) or 'none'})")
        done_refs, _ = ray.wait(waiting_for, num_returns=1, timeout=0 if planning else WAIT_STEP_S)
        if not done_refs:
            if planning:
                todo.prefetch()
                continue
            waited += WAIT_STEP_S
            if not pool.live and not announced and waited >= START_TIMEOUT_S:
                raise BatchError(f"no Ray worker started in {START_TIMEOUT_S:.0f} s: each needs 1 free CPU "
                                 f"(the cluster has {ray.available_resources().get('CPU', 0):g} free of "
                                 f"{ray.cluster_resources().get('CPU', 0):g})")
            if not pool.live and announced and waited >= REPLACE_TIMEOUT_S:
                raise BatchError(f"every Ray worker died with its node ({', '.join(pool.dead_nodes)}) and no "
                                 f"replacement started in {REPLACE_TIMEOUT_S:.0f} s; run the same command "
                                 "again to resume")
            continue
        ref = done_refs[0]
        actor, item = pool.starting.pop(ref, None), None
        if actor is None:
            actor, item = running.pop(ref)
            pool.live[actor] -= 1
        try:
            answer = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError,
                ray.exceptions.WorkerCrashedError) as exc:
            # Its node died (or the actor process did; or the answer was kept on the dead node): what
            # it held was not committed, run it again.
            again = [item] if item is not None else []
            for other_ref, (other, other_item) in list(running.items()):
                if other is actor:
                    del running[other_ref]
                    again.append(other_item)
            for lost in sorted(again, key=lambda it: -it[0].index):
                todo.again(lost)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            pool.lost(actor, f"{type(exc).__name__}: {first[:200]}", len(again))
            waited = 0.0
            fill()
            continue
        except ray.exceptions.RayError as exc:
            raise BatchError(f"Ray worker failed: {type(exc).__name__}: {exc}") from None
        if item is None:  # a ready() answer
            if answer[0] == "failed":
                raise BatchError(f"worker failed: {answer[1]}")
            pool.nodes[actor] = f"node {answer[2][:12]} ({answer[3]})"
            pool.live[actor] = 0
            pool.log(f"ray: a worker is ready on {pool.nodes[actor]}, its model "
                     + ("fetched into" if answer[5] else "found in") + " the node's cache")
            if not announced:
                on_ready(answer[1])
                announced = True
            fill()
            continue
        if answer[0] == "failed":
            raise BatchError(f"worker failed: {answer[2]}")
        _, index, ok, err, results, errors = answer
        commit_part_data(job_dir, index, results, ok, errors, err)
        on_done(index, ok, err)
        fill()
