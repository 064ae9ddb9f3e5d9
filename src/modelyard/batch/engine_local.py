"""The local engine: chunks run by worker processes on this machine, each loading the model once.

Workers are spawned (TensorFlow is not fork-safe), die with the coordinator (``PR_SET_PDEATHSIG``),
read their chunks straight from the input files and commit their own parts; only chunk
numbers and counts cross the process boundary. ``workers=0`` runs in the calling process.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from modelyard.batch.readers import Chunk
from modelyard.batch.spec import BatchError, JobSpec

if TYPE_CHECKING:  # instances imports TensorFlow: only the workers need it, not the coordinator
    from modelyard.batch.instances import Shaping

# Loaded predictors of this process, by (version dir, signature, runtime): workers=0 jobs
# run back to back (tests, notebooks) reuse the model instead of loading it again.
_PREDICTORS: dict[tuple, Any] = {}


def shaping_of(spec: JobSpec) -> "Shaping":
    from modelyard.batch.instances import Shaping

    # CSV rows are read as objects keyed by the header; Vertex sends them as arrays by default.
    default_type = "array" if spec.format == "csv" else None
    return Shaping(spec.key_field, spec.included_fields, spec.excluded_fields, spec.instance_type or default_type)


def predictor_for(spec: JobSpec):
    from modelyard.batch.predictor import Predictor, load_servable

    key = (spec.version_dir, spec.signature_name, spec.runtime, spec.json_numbers)
    if key not in _PREDICTORS:
        _PREDICTORS[key] = Predictor(load_servable(Path(spec.version_dir), spec.runtime, spec.signature_name),
                                     spec.signature_name, spec.json_numbers)
    return _PREDICTORS[key]


def settle_heap() -> None:
    """In a worker, once the model is loaded: the objects alive now (TensorFlow's, by the million)
    leave the cyclic collector's view. Measured: without this, full collections walking them
    took a quarter of a worker's time."""
    import gc

    gc.collect()
    gc.freeze()


def _die_with_parent() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphan keeps writing after a kill -9
    except OSError:  # pragma: no cover - not Linux
        pass


def _worker(job_dir: str, identity: dict, batch_size: int, tasks, answers, parent: int) -> None:
    _die_with_parent()
    if os.getppid() != parent:
        return  # the coordinator died before the death signal was armed
    from modelyard.batch.work import process_chunk

    spec = JobSpec.from_identity(identity)
    try:
        predictor = predictor_for(spec)
    except Exception as exc:  # any load failure fails the job with the loader's message
        answers.put(("failed", f"loading {spec.version_dir}: {type(exc).__name__}: {exc}"))
        return
    settle_heap()
    answers.put(("ready", os.getpid(), predictor.runtime))
    shaping = shaping_of(spec)

    def reporter(chunk: Chunk):
        # Called once the chunk is committed, maybe from its part writer's thread while this one
        # predicts the next chunk: the answer goes out only after the commit.
        def report(outcome) -> None:
            if isinstance(outcome, BaseException):
                answers.put(("failed", f"chunk {chunk.index} ({chunk.file}): {type(outcome).__name__}: {outcome}"))
            else:
                answers.put(("done", chunk.index, *outcome))
        return report

    while True:
        task = tasks.get()
        if task is None:
            break
        chunk, context = task
        try:
            process_chunk(Path(job_dir), chunk, spec.format, context, shaping, predictor, batch_size,
                          report=reporter(chunk))
        except Exception as exc:
            answers.put(("failed", f"chunk {chunk.index} ({chunk.file}): {type(exc).__name__}: {exc}\n"
                                   + traceback.format_exc(limit=3)))
            return
    # Every commit done and every answer flushed, then out without TensorFlow's interpreter
    # teardown (seconds, and noisy).
    from modelyard.batch.part_writer import wait_finished

    wait_finished()
    answers.close()
    answers.join_thread()
    os._exit(0)


class LocalWorkers:
    """The job's worker processes, started as early as the caller likes: each imports TensorFlow
    and loads the model while the coordinator stages inputs and plans the chunks."""

    def __init__(self, job_dir: Path, spec: JobSpec, batch_size: int, workers: int):
        ctx = mp.get_context("spawn")
        self.tasks, self.answers = ctx.Queue(), ctx.Queue()
        self.procs = [ctx.Process(target=_worker, daemon=True,
                                  args=(str(job_dir), spec.identity(), batch_size, self.tasks, self.answers,
                                        os.getpid()))
                      for _ in range(workers)]
        for p in self.procs:
            p.start()

    def run(self, source: Iterable[tuple[Chunk, Any]], on_done: Callable[[int, int, int], None],
            on_ready: Callable[[str], None]) -> None:
        """Hand out every chunk of ``source`` and wait for its commit. ``source`` is
        read by a thread of its own: when it is the plan being made, workers predict the first
        chunks while the rest of the input is still being counted."""
        left: set[int] = set()
        failure: list[BaseException] = []
        stop = threading.Event()

        def feed() -> None:
            try:
                for chunk, context in source:
                    if stop.is_set():
                        return
                    left.add(chunk.index)  # before the task: its answer must find it
                    self.tasks.put((chunk, context))
            except BaseException as exc:  # a plan that cannot be made fails the job, in the caller
                failure.append(exc)
            finally:
                for _ in self.procs:
                    self.tasks.put(None)
                self.answers.put(("planned",))

        feeder = threading.Thread(target=feed, name="batch-plan", daemon=True)
        feeder.start()
        planned = announced = False
        try:
            while not planned or left:
                try:
                    message = self.answers.get(timeout=0.5)
                except queue.Empty:
                    self._check_alive(len(left))
                    continue
                kind = message[0]
                if kind == "planned":
                    if failure:
                        raise failure[0]
                    planned = True
                elif kind == "failed":
                    raise BatchError(f"worker failed: {message[1]}")
                elif kind == "ready":
                    if not announced:
                        on_ready(message[2])
                        announced = True
                else:
                    _, index, ok, err = message
                    left.discard(index)
                    on_done(index, ok, err)
        finally:
            stop.set()  # a failed job's plan stops once its next chunk is found
            feeder.join()

    def _check_alive(self, left: int) -> None:
        dead = [p for p in self.procs if not p.is_alive() and p.exitcode not in (0, None)]
        if dead:
            raise BatchError(f"worker pid {dead[0].pid} {_death(dead[0].exitcode)} with {left} chunks left; "
                             "run the same command again to resume")
        if all(not p.is_alive() for p in self.procs):
            raise BatchError(f"all workers exited with {left} chunks left")

    def stop(self) -> None:
        # Every chunk is committed (or the job failed): a worker has nothing left to write, and
        # TensorFlow's interpreter teardown takes seconds, so the workers are killed, not awaited.
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join()
        # Chunks nobody will take may still fill the queue's pipe: without this, the interpreter's
        # exit waits for ever to flush them (a job that failed early with thousands of chunks).
        self.tasks.cancel_join_thread()


def _death(code: int) -> str:
    if code >= 0:
        return f"died (exit code {code})"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"was killed by signal {-code}"
    hint = {"SIGKILL": " (out of memory, or killed)",
            "SIGBUS": " (an input file shrank while the job read it; the resume will say which)"}.get(name, "")
    return f"was killed by {name}{hint}"


def run_local(job_dir: Path, spec: JobSpec, source: Iterable[tuple[Chunk, Any]], batch_size: int, workers: int,
              on_done: Callable[[int, int, int], None],
              on_ready: Callable[[str], None] = lambda runtime: None, started: LocalWorkers | None = None) -> None:
    """Run every chunk of ``source`` (``(chunk, context)`` pairs); ``on_done(index, ok, err)`` after
    each commit. Raises BatchError on failure.

    ``started``: workers already started for this job (``LocalWorkers``): used here, stopped by
    whoever started them."""
    if workers == 0:
        from modelyard.batch.work import process_chunk

        predictor = None
        shaping = shaping_of(spec)
        for chunk, context in source:
            if predictor is None:  # loaded for the first chunk: a job with none loads nothing
                predictor = predictor_for(spec)
                on_ready(predictor.runtime)
            ok, err = process_chunk(job_dir, chunk, spec.format, context, shaping, predictor, batch_size)
            on_done(chunk.index, ok, err)
        return
    pool = started or LocalWorkers(job_dir, spec, batch_size, workers)
    try:
        pool.run(source, on_done, on_ready)
    finally:
        if pool is not started:
            pool.stop()
