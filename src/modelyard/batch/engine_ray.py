"""The Ray engine: the local engine's chunks, run by Ray actors spread over a Ray cluster.

Only *where* a chunk runs differs from ``engine_local``: the job, its plan of chunks, the
per-chunk work (``work.process_chunk``) and the atomic part commits (``shards.commit_part``)
are the same, so both engines write byte-identical parts and resume each other's jobs. Each
actor (``num_cpus=1``, placed with Ray's SPREAD strategy) loads the model once, reads its chunks
straight from the input files and commits its own parts; only chunk numbers and counts travel
back. So every node must see the model, the inputs and the output directory at the same paths
(on a one-machine cluster they do; on several machines, a shared mount).

The coordinator is a Ray driver: if it is killed, Ray ends its actors with it (they are not
detached). A part an actor was renaming at that instant is whole or absent, and a part written
twice (by a dying actor and by the next run) holds the same rows under the same name, so the
next run still ends with every row exactly once.
"""
from __future__ import annotations

import collections
import os
import socket
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

from modelyard.batch.readers import Chunk
from modelyard.batch.spec import BatchError, JobSpec

# Chunks queued per actor beyond the one it runs: the next chunk is waiting when one commits.
IN_FLIGHT_PER_ACTOR = 2
CONNECT_TIMEOUT_S = 5.0
# No actor with its model loaded after this long: the cluster has no CPU for one (or cannot load it).
START_TIMEOUT_S = 600.0
WAIT_STEP_S = 1.0


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
    return ray


def cluster_cpus(ray) -> int:
    """Whole CPUs of the connected cluster: the default number of actors."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


class ChunkWorker:
    """One Ray actor: the job's model loaded once, then chunks on request (``run``)."""

    def __init__(self, job_dir: str, identity: dict, batch_size: int):
        from modelyard.batch.engine_local import predictor_for, settle_heap, shaping_of

        self.job_dir, self.batch_size = Path(job_dir), batch_size
        self.spec = JobSpec.from_identity(identity)
        self.shaping = shaping_of(self.spec)
        self.predictor: Any = None
        self.load_error: str | None = None
        try:
            self.predictor = predictor_for(self.spec)
        except Exception as exc:  # reported by ready(): the job fails with the loader's message
            self.load_error = f"loading {self.spec.version_dir}: {type(exc).__name__}: {exc}"
        else:
            settle_heap()

    def ready(self) -> tuple[str, str, str]:
        """``("ok", runtime, node id)`` or ``("failed", why, node id)`` once the model is loaded."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        return ("failed", self.load_error, node) if self.load_error else ("ok", self.predictor.runtime, node)

    def run(self, chunk: Chunk, context: Any) -> tuple[str, int, int, int] | tuple[str, int, str]:
        from modelyard.batch.work import process_chunk

        if self.load_error:
            return ("failed", chunk.index, self.load_error)
        try:
            ok, err = process_chunk(self.job_dir, chunk, self.spec.format, context, self.shaping, self.predictor,
                                    self.batch_size)
        except Exception as exc:
            return ("failed", chunk.index, f"chunk {chunk.index} ({chunk.file}): {type(exc).__name__}: {exc}\n"
                                           + traceback.format_exc(limit=3))
        return ("done", chunk.index, ok, err)


class _Todo:
    """The chunks of ``source``, pulled as they are wanted: a plan being made advances only as far
    as the actors need (or while they load their models, ``prefetch``)."""

    def __init__(self, source: Iterable[tuple[Chunk, Any]]):
        self._source = iter(source)
        self._ahead: collections.deque = collections.deque()
        self.exhausted = False

    def prefetch(self) -> bool:
        """Plan one more chunk ahead; False once the source is exhausted."""
        item = next(self._source, None)
        if item is None:
            self.exhausted = True
            return False
        self._ahead.append(item)
        return True

    def next(self) -> tuple[Chunk, Any] | None:
        if not self._ahead and not self.exhausted:
            self.prefetch()
        return self._ahead.popleft() if self._ahead else None

    def empty(self) -> bool:
        return not self._ahead and (self.exhausted or not self.prefetch())


def run_ray(job_dir: Path, spec: JobSpec, source: Iterable[tuple[Chunk, Any]], batch_size: int,
            workers: int | None, on_done: Callable[[int, int, int], None],
            on_ready: Callable[[str], None] = lambda runtime: None, address: str | None = None,
            log: Callable[[str], None] = lambda message: None) -> None:
    """Run every chunk of ``source`` (``(chunk, context)`` pairs, maybe a plan still being made) on
    Ray actors; ``on_done(index, ok, err)`` after each commit.

    ``workers``: actors to start (None: the cluster's CPUs). ``log`` gets one line at the end: how
    many actors ran chunks, on how many nodes. Raises BatchError on failure.
    """
    todo = _Todo(source)
    ray = connect(address)
    if todo.empty():
        return
    # Actors start before the plan goes further: they load their models while it is made (a job
    # with fewer chunks than actors leaves some idle).
    count = workers or cluster_cpus(ray)
    actor_class = ray.remote(num_cpus=1, scheduling_strategy="SPREAD", max_restarts=0)(ChunkWorker)
    # Absolute: actors run in their own working directories.
    where = str(Path(job_dir).resolve())
    actors = [actor_class.remote(where, spec.identity(), batch_size) for _ in range(count)]
    try:
        nodes = _drive(ray, actors, todo, on_done, on_ready)
        log(f"ray: {len(nodes)} workers of {count} ran on {len(set(nodes.values()))} nodes")
    finally:
        # Every chunk is committed (or the job failed): nothing is left for an actor to write.
        for actor in actors:
            ray.kill(actor)


def _drive(ray, actors: list, todo: _Todo, on_done: Callable[[int, int, int], None],
           on_ready: Callable[[str], None]) -> dict[Any, str]:
    """Hand out chunks until all are committed; returns {actor that loaded its model: node id}."""
    running: dict[Any, Any] = {}  # ObjectRef -> actor

    def submit(actor) -> None:
        item = todo.next()
        if item is not None:
            running[actor.run.remote(*item)] = actor

    # Chunks go only to actors whose model is loaded: on a shared cluster an actor may wait for a
    # CPU for ever, and chunks queued on it would wait with it while the others sit idle.
    readiness = {actor.ready.remote(): actor for actor in actors}
    announced = False
    nodes: dict[Any, str] = {}
    waited = 0.0
    while running or (readiness and not announced) or not todo.empty():
        # While no actor can take work yet, the driver plans ahead instead of only waiting.
        planning = not running and not todo.exhausted
        waiting_for = list(readiness) + list(running)
        if not waiting_for:  # every actor answered ready, none holds work, and work is left
            raise BatchError("no Ray worker left to hand the remaining chunks to")
        done_refs, _ = ray.wait(waiting_for, num_returns=1, timeout=0 if planning else WAIT_STEP_S)
        if not done_refs:
            if planning:
                todo.prefetch()
                continue
            waited += WAIT_STEP_S
            if not announced and waited >= START_TIMEOUT_S:
                raise BatchError(f"no Ray worker started in {START_TIMEOUT_S:.0f} s: each needs 1 free CPU "
                                 f"(the cluster has {ray.available_resources().get('CPU', 0):g} free of "
                                 f"{ray.cluster_resources().get('CPU', 0):g})")
            continue
        ref = done_refs[0]
        try:
            answer = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise BatchError(f"a Ray worker died with {len(running)} chunks in flight ({type(exc).__name__}: "
                             f"{first}); run the same command again to resume") from None
        except ray.exceptions.RayError as exc:
            raise BatchError(f"Ray worker failed: {type(exc).__name__}: {exc}") from None
        if ref in readiness:
            actor = readiness.pop(ref)
            if answer[0] == "failed":
                raise BatchError(f"worker failed: {answer[1]}")
            nodes[actor] = answer[2]
            if not announced:
                on_ready(answer[1])
                announced = True
            for _ in range(IN_FLIGHT_PER_ACTOR):
                submit(actor)
            continue
        actor = running.pop(ref)
        if answer[0] == "failed":
            raise BatchError(f"worker failed: {answer[2]}")
        _, index, ok, err = answer
        on_done(index, ok, err)
        submit(actor)
    return nodes
