"""``batch_predict``: find or create the job, plan it, run the pending chunks, finalize, report.

Re-running the same call finds the unfinished job under ``output`` and finishes it; a
finished job is reported and left alone.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TextIO

from modelyard import objstore
from modelyard.batch import job as jobs
from modelyard.batch import remote
from modelyard.batch.progress import Progress
from modelyard.batch import job_plan
from modelyard.batch.readers import Chunk, FileSource, collect, iter_plan
from modelyard.batch.shards import committed, finalize
from modelyard.batch.spec import (DEFAULT_CHUNK_ROWS, BatchError, JobSpec, check_options, expand_inputs,
                                  guess_format, resolve_model)

DEFAULT_BATCH_SIZE = 64


def _fields(value) -> tuple[str, ...]:
    if not value:
        return ()
    if isinstance(value, str):
        value = value.split(",")
    return tuple(v.strip() for v in value if v.strip())


def build_spec(model: str, input, format: str | None = None, key_field: str | None = None,
               included_fields=(), excluded_fields=(), instance_type: str | None = None,
               signature_name: str = "serving_default", runtime: str = "auto",
               chunk_rows: int = DEFAULT_CHUNK_ROWS, json_numbers: str = "tf_serving") -> JobSpec:
    name, version, version_dir = resolve_model(model)
    if chunk_rows < 1:
        raise BatchError(f"chunk_rows {chunk_rows}: must be at least 1")
    if runtime not in ("auto", "tensorflow", "litert"):
        raise BatchError(f"--runtime {runtime}: expected auto, tensorflow or litert")
    if json_numbers not in ("tf_serving", "vertex"):
        raise BatchError(f"--json-numbers {json_numbers}: expected tf_serving or vertex")
    inputs = expand_inputs(input)
    return JobSpec(name, version, str(version_dir.resolve()), inputs, format or guess_format(inputs), key_field,
                   _fields(included_fields), _fields(excluded_fields), instance_type, signature_name,
                   chunk_rows, runtime, json_numbers=json_numbers)


def batch_predict(model: str | None = None, input=None, output: str | os.PathLike | None = None, *,
                  format: str | None = None, batch_size: int = DEFAULT_BATCH_SIZE, workers: int | None = None,
                  key_field: str | None = None, included_fields=(), excluded_fields=(),
                  instance_type: str | None = None, resume: str | os.PathLike | None = None,
                  signature_name: str = "serving_default", runtime: str = "auto",
                  chunk_rows: int = DEFAULT_CHUNK_ROWS, engine: str = "local", ray_address: str | None = None,
                  progress: bool = False, log: Callable[[str], None] | None = None,
                  stream: TextIO | None = None, json_numbers: str = "tf_serving") -> jobs.BatchPredictionJob:
    """Run (or finish) a batch prediction job and return it.

    ``model``: ``BASE[:VERSION]`` or a version directory; ``input``: path, glob or list of them
    (``format`` None: guessed from the files' extensions, jsonl when they say nothing);
    ``output``: the directory that receives ``prediction-<model>-<timestamp>/``: local, ``file://``,
    or ``gs://`` / ``s3://`` (run in a local staging directory, uploaded when the job succeeds). Bad arguments
    raise ``BatchError``; a job that fails while running is returned with state JOB_STATE_FAILED.
    ``engine``: ``"local"`` (worker processes here; ``workers`` default: cores) or ``"ray"`` (Ray
    actors on the cluster at ``ray_address``, default ``RAY_ADDRESS`` or a new local Ray;
    ``workers`` default: the cluster's CPUs).
    ``json_numbers``: how JSON numbers meet integer inputs, as ``modelyard serve --json_numbers``:
    ``"tf_serving"`` (``0.0`` is refused) or ``"vertex"`` (integral numbers are integers; the platform's jobs).
    """
    say = log or (lambda msg: print(msg, file=stream or sys.stderr))
    _check_engine(engine, workers, ray_address)
    if engine == "local":
        workers = (os.cpu_count() or 1) if workers is None else workers
    check_options(format, instance_type, _fields(included_fields), _fields(excluded_fields), batch_size,
                  1 if workers is None else workers)
    spec = None
    if model is not None or input is not None:
        if model is None or input is None:
            raise BatchError("--model and --input go together")
        spec = build_spec(model, input, format, key_field, included_fields, excluded_fields, instance_type,
                          signature_name, runtime, chunk_rows, json_numbers)
        if format is None:
            say(f"reading the input as {spec.format} (from its extension; --format sets it)")
    if resume is not None:
        job = jobs.BatchPredictionJob(resume)
        if spec is not None and not jobs.is_same_job(job.data, spec):
            differs = "; ".join(jobs.differences(job.data["spec"], json.loads(json.dumps(spec.identity()))))
            then = ("that job is finished: drop --resume to run these arguments as a new job beside it"
                    if jobs.is_finished(job.data) else "drop --model/--input (and the other options) to finish "
                    "that job as it was started, or drop --resume to start a new job with these")
            raise BatchError(f"--resume {resume} is a different job from the one these arguments describe: "
                             f"{differs}; {then}")
        spec = job.spec
    elif spec is None:
        raise BatchError("give --model and --input (a new job) or --resume JOB_DIR")
    else:
        if output is None:
            raise BatchError("--output is required for a new job")
        job = _find_or_create(str(output), spec, say)
    if jobs.is_finished(job.data):
        remote.publish(job)  # a crash between finishing and uploading is made good here
        stats = job.completion_stats
        say(f"job {job.output_info.gcs_output_directory} already finished ({job.state.rsplit('_', 1)[-1]}: "
            f"{stats.get('successful_count', 0):,} results, {stats.get('failed_count', 0):,} errors); nothing to do")
        return job
    with jobs.JobLock(job.job_dir):
        job = _run(job, spec, batch_size, workers, progress, say, stream, engine, ray_address)
    if job.state == jobs.SUCCEEDED:
        remote.drop_staged_inputs(job.job_dir)
        dest = remote.publish(job)
        if dest:
            say(f"uploaded the results to {dest}")
    return job


def _find_or_create(output: str, spec: JobSpec, say: Callable[[str], None]) -> jobs.BatchPredictionJob:
    """The spec's job under ``output`` (unfinished, or finished), else a new one. A gs:// / s3:// output
    runs in its local staging directory, and a job finished there is recognised on the remote side."""
    try:
        is_remote = objstore.is_remote(output)
    except objstore.StorageError as exc:
        raise BatchError(f"--output {exc.message}") from None
    local = Path(objstore.local_path(output)) if not is_remote else remote.staging_dir(output)
    found = jobs.find_job(local, spec) or (remote.find_finished(output, spec, local) if is_remote else None)
    if found:
        return jobs.BatchPredictionJob(found)
    for other, differs in jobs.unfinished_lookalikes(local, spec):
        say(f"note: --output also holds {other.name}, an unfinished job of the same input files that differs "
            f"({'; '.join(differs)}); a new job starts beside it (--resume {other} finishes that one)")
    job = jobs.create_job(local, spec)
    if not is_remote:
        return job
    job.update(output_uri=output.rstrip("/"))
    return job


def _check_engine(engine: str, workers: int | None, ray_address: str | None) -> None:
    """Engine options, checked before any job is created: a bad one leaves nothing on disk."""
    if engine not in ("local", "ray"):
        raise BatchError(f"--engine {engine}: expected local or ray")
    if engine == "local":
        if ray_address is not None:
            raise BatchError("--ray-address goes with --engine ray")
        return
    from modelyard.batch.engine_ray import check_reachable, require_ray

    require_ray()
    if workers is not None and workers < 1:
        raise BatchError(f"--workers {workers}: the ray engine runs 1 or more actors (default: the cluster's CPUs)")
    address = ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        check_reachable(address)


def _run(job: jobs.BatchPredictionJob, spec: JobSpec, batch_size: int, workers: int | None, progress: bool,
         say: Callable[[str], None], stream: TextIO | None, engine: str = "local",
         ray_address: str | None = None) -> jobs.BatchPredictionJob:
    from modelyard.batch.engine_local import LocalWorkers, run_local

    started = time.monotonic()
    job.update(state=jobs.RUNNING, start_time=job.data.get("start_time") or jobs.utc_now(),
               runs=job.data.get("runs", 0) + 1, error=None)
    # Local workers start now: their TensorFlow import and model load overlap staging and planning.
    pool = LocalWorkers(job.job_dir, spec, batch_size, workers) if engine == "local" and workers else None
    try:
        opener = None
        if engine == "ray":  # remote inputs are not staged: planned by ranged reads, each chunk's bytes sent on
            local_inputs, opener = [f.path for f in spec.inputs], remote.RemoteInputs(spec)
        else:
            local_inputs = remote.stage_inputs(job.job_dir, spec)  # before the plan: readers need local files
        # A new job is planned while the workers predict its first chunks.
        rate = job_plan.RowsPerByte()
        source, total, rows_done = _chunks(job.job_dir, local_inputs, spec,
                                           estimate=lambda rows: setattr(bar, "total", rows), say=say, opener=opener,
                                           rate=rate)
        bar = Progress(total, rows_done, stream=stream, enabled=progress)

        def ready(runtime: str) -> None:
            say(f"model {spec.version_dir} runs on {runtime}")
            ready_at.append(time.monotonic())
            bar.restart()

        ready_at: list[float] = []
        def advance(index: int, ok: int, err: int) -> None:
            bar.advance(ok + err)
            rate.done(index, ok + err)
        if engine == "ray":
            from modelyard.batch.engine_ray import run_ray

            run_ray(job.job_dir, spec, source, batch_size, workers, on_done=advance, on_ready=ready,
                    address=ray_address, log=say, inputs=opener)
        else:
            run_local(job.job_dir, spec, source, batch_size, workers, on_done=advance, on_ready=ready,
                      started=pool)
        chunks, _contexts = job_plan.load_plan(job.job_dir)  # whole now, however it was made
        bar.close()
        predicted = time.monotonic() - ready_at[0] if ready_at else 0.0
        counts = finalize(job.job_dir, len(chunks))
        total = counts["successful_count"] + counts["failed_count"]  # chunks found by probes were counted as read
    except BatchError as exc:
        return _failed(job, str(exc))
    except Exception as exc:  # anything else in a chunk or the model load: the job fails and says why
        return _failed(job, f"{type(exc).__name__}: {exc}")
    finally:
        if pool is not None:
            pool.stop()
    stats = {**counts, "incomplete_count": 0}
    elapsed = time.monotonic() - started
    if stats["successful_count"] == 0 and stats["failed_count"] > 0:
        # Every row was tried and refused: a failed job (finished: a re-run does not try them again).
        job.update(state=jobs.FAILED, finished=True, completion_stats=stats, end_time=jobs.utc_now(),
                   last_run_seconds=round(elapsed, 3), error=_nothing_succeeded(job.job_dir, spec, stats))
        return job
    # last_run_seconds: this run, model loads included; predict_seconds: from the first loaded model on.
    job.update(state=jobs.SUCCEEDED, completion_stats=stats, end_time=jobs.utc_now(),
               last_run_seconds=round(elapsed, 3), predict_seconds=round(predicted, 3),
               rows_this_run=total - rows_done)
    return job


def _failed(job: jobs.BatchPredictionJob, error: str) -> jobs.BatchPredictionJob:
    """The job FAILED with ``error`` and the counts of the chunks it committed (a resume keeps them). If
    its record cannot be written either (the output's disk or inodes full), a BatchError says so in one
    line; job.json keeps its previous state (written atomically), and the same command resumes."""
    counts = {"successful_count": 0, "failed_count": 0}
    try:
        for ok, err, _name in committed(job.job_dir).values():
            counts["successful_count"] += ok
            counts["failed_count"] += err
    except OSError:
        pass  # the counts are a report; the error is what matters
    try:
        job.update(state=jobs.FAILED, error=error, end_time=jobs.utc_now(),
                   completion_stats={**counts, "incomplete_count": 0})
    except OSError as exc:
        last = (error.strip().splitlines() or [""])[-1]  # one line: a worker's error may hold its traceback
        raise BatchError(f"{last}; and the job's record could not be updated ({exc.strerror}: "
                         f"{exc.filename or job.job_dir}): free space or inodes there, then run the same "
                         "command again to resume") from None
    return job


def _nothing_succeeded(job_dir: Path, spec: JobSpec, stats: dict[str, int]) -> str:
    """The error of a job none of whose rows succeeded: the first row's error, and the format it was read as."""
    from modelyard.batch.shards import ERRORS_FILE, iter_lines

    first = next(iter_lines([job_dir / ERRORS_FILE]), {}) if (job_dir / ERRORS_FILE).is_file() else {}
    message = (first.get("error") or {}).get("message", "")
    return (f"no row succeeded: all {stats['failed_count']:,} rows failed"
            + (f" (the first: {message})" if message else "")
            + f". The input was read as {spec.format} (--format); every error is in {job_dir / ERRORS_FILE}")


def _planned(files: list[str], spec: JobSpec, opener: Any = None) -> Iterator[tuple[Chunk, Any]]:
    """``iter_plan`` for the job (``opener``: how its files are read, local files by default), an
    input it cannot plan failing the job (BatchError)."""
    try:
        yield from iter_plan(files, spec.format, spec.chunk_rows, opener or FileSource)
    except (ValueError, OSError) as exc:
        raise BatchError(str(exc)) from None


def _chunks(job_dir: Path, files: list[str], spec: JobSpec, estimate: Callable[[int], None],
            say: Callable[[str], None], opener: Any = None,
            rate: job_plan.RowsPerByte | None = None) -> tuple[Iterable, int, int]:
    """``(source, total rows, rows already committed)``: the job's ``(chunk, context)`` pairs not
    committed yet.

    A job with a plan (or one cut short by a kill, made again and checked) runs it as it is.
    A new one is planned while its chunks run: the total is 0 here and ``estimate`` gets it as
    the plan grows."""
    planned = job_plan.load_plan(job_dir)
    if planned is None and (job_dir / job_plan.PARTIAL_PLAN_FILE).exists():
        planned = collect(_planned(files, spec, opener))
        job_plan.finish_partial_plan(job_dir, planned)
    rate = rate or job_plan.RowsPerByte()
    if planned is None:  # a new job: nothing is committed yet
        return _counted(job_plan.recorded(job_dir, _planned(files, spec, opener)), spec, estimate, rate), 0, 0
    chunks, contexts = planned
    done = committed(job_dir)
    rows_done = sum(ok + err for ok, err, _name in done.values())
    if done and len(done) < len(chunks):
        say(f"resuming {job_dir}: {len(done)} of {len(chunks)} chunks ({rows_done:,} rows) already committed")
    pending = [(c, contexts.get(c.file)) for c in chunks if c.index not in done]
    for chunk in chunks:
        rate.planned(chunk)
    for index, (ok, err, _name) in done.items():
        rate.done(index, ok + err)
    rate.on_change = estimate
    return pending, rate.total(), rows_done


def _counted(source: Iterable[tuple[Chunk, Any]], spec: JobSpec, estimate: Callable[[int], None],
             rate: job_plan.RowsPerByte):
    """``source`` passed through, the job's row count estimated as it goes (rows per byte so far)
    for the progress bar, exact once the plan is whole and its chunks found by probes are done."""
    size = sum(f.size for f in spec.inputs)  # as recorded: remote inputs are not on this disk
    spanned = 0
    for chunk, context in source:
        rate.planned(chunk)
        spanned += chunk.end - chunk.start
        estimate(round(rate.total() * size / spanned) if spanned else rate.total())
        yield chunk, context
    rate.on_change = estimate
    estimate(rate.total())
