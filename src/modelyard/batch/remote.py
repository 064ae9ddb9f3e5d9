"""gs:// and s3:// for batch jobs: remote inputs staged or read by ranges, remote outputs published at the end.

The readers plan chunks as byte ranges and seek into them. The local engine's workers read local
files, so its remote inputs are downloaded whole into ``<job dir>/.inputs/`` before planning (a
resumed job finds them there and downloads nothing again) and removed once the job has succeeded.
The Ray engine stages nothing (``RemoteInputs``, every read pinned to one version of the object).
An input whose record starts can be found by probes (JSON lines, file lists, TFRecord:
``readers.splittable``) is split by small reads at each nominal chunk boundary, and each chunk's
actor reads its own byte range (``read_range``): the object crosses storage once, from every node
in parallel, and the driver reads only the probes. A CSV input (a quoted field may hold a newline,
so no probe can tell where a row starts) is planned by reading it block by block as far as the plan
has got, every row counted as the local engine counts them, and the bytes the plan read go on to
the chunk's actor (a CSV chunk planned by an earlier run is read by its actor).

A remote ``--output`` gets a local staging directory keyed by the URI (``staging_dir``), under which
the job runs exactly as a local one does (atomic part commits, exactly-once resume). When it
succeeds, the result shards and the error file are uploaded (each object written whole), then
``job.json``: its presence on the remote side is what says the job is finished, so a run of the same
command with the staging directory gone still recognises it (and mirrors it back).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from modelyard import objstore
from modelyard.batch.readers import Chunk, FileSource, RangedSource, Source, splittable
from modelyard.batch.job import JOB_FILE, JOB_PREFIX, SUCCEEDED, BatchPredictionJob, is_same_job
from modelyard.batch.shards import ERRORS_FILE, result_shards
from modelyard.batch.spec import BatchError, JobSpec

INPUTS_DIR = ".inputs"
STAGING_ENV = "MODELYARD_BATCH_STAGING"


def staging_dir(output_uri: str) -> Path:
    """The local directory standing in for a remote ``--output`` (``$MODELYARD_BATCH_STAGING`` or
    ``~/.cache/modelyard/batch``), one per output URI, so the same command finds the same job."""
    root = Path(os.environ.get(STAGING_ENV) or Path.home() / ".cache" / "modelyard" / "batch")
    key = hashlib.sha256(output_uri.rstrip("/").encode()).hexdigest()[:20]
    return root / key


def stage_inputs(job_dir: Path, spec: JobSpec) -> list[str]:
    """Local paths of the job's inputs, remote ones downloaded into the job (once)."""
    paths = [f.path for f in spec.inputs]
    if not any(objstore.is_remote(p) for p in paths):
        return paths
    try:
        # Absolute: the job's plan names these files, and a resume may spell the job's path otherwise.
        return objstore.stage_in(paths, (job_dir / INPUTS_DIR).resolve())
    except objstore.StorageError as exc:
        raise BatchError(f"staging the inputs: {exc.message}") from None


def read_range(uri: str, start: int, end: int, version: str = "") -> bytes:
    """Bytes ``[start, end)`` of a remote object, in one ranged read, of ``version`` when given (see
    ``RemoteInputs``); ValueError naming the URI if it fails, or if that version is gone."""
    try:
        return objstore.read_range(uri, start, end, version)
    except objstore.StorageError as exc:
        raise ValueError(f"reading bytes {start}-{end}: {exc.message}") from None


class RemoteInputs:
    """How a Ray job reads its inputs: local files as they are, remote objects by ranged reads of
    one pinned version.

    Each remote input is looked up once per run (``version``): its size and time must still be those
    the job was created with (else the job fails: its plan and committed parts name rows of the
    input it saw), and its version (generation, ETag) pins every read after, the plan's and the
    actors' alike: an object replaced mid-job fails the job instead of mixing rows of two versions.

    A job's remote input of a format split by probes (``spec.format``, ``readers.splittable``) is
    planned by probes (``RangedSource(probe=True)``) and each actor reads its chunk's range. Any
    other (CSV) is read by the plan, and its reads are kept (``keep``) until ``take`` hands a
    chunk's bytes to its actor, so the object crosses storage once; a CSV chunk planned in an
    earlier run (a resume) is read by its actor, pinned the same way. Without a spec (``ranged_source``)
    an object is scanned as a local file is."""

    def __init__(self, spec: JobSpec | None = None, keep: bool = True) -> None:
        self._recorded = {f.path: f for f in spec.inputs} if spec is not None else {}
        self._keep = keep
        self._probe = spec is not None and splittable(spec.format)
        self._versions: dict[str, tuple[int, str]] = {}
        self._sources: dict[str, RangedSource] = {}

    def version(self, path: str) -> str:
        """The version of ``path`` this run reads ("" for a local file); ValueError if it changed."""
        return self._pin(path)[1] if objstore.is_remote(path) else ""

    def _pin(self, path: str) -> tuple[int, str]:
        if path not in self._versions:
            try:
                size, mtime_ns, version = objstore.describe(path)
            except objstore.StorageError as exc:
                raise ValueError(exc.message) from None
            seen = self._recorded.get(path)
            if seen is not None and (seen.size, seen.mtime_ns) != (size, mtime_ns):
                raise ValueError(f"{path} changed since the job was created: {seen.size:,} bytes of "
                                 f"{seen.mtime_ns} then, {size:,} bytes of {mtime_ns} now; start a new job "
                                 "(a new --output) to predict it as it is")
            self._versions[path] = (size, version)
        return self._versions[path]

    def __call__(self, path: str) -> Source:
        """The plan's source for ``path`` (``iter_plan``'s ``open_source``)."""
        if not objstore.is_remote(path):
            return FileSource(path)
        size, version = self._pin(path)
        source = RangedSource(path, size, lambda start, end: read_range(path, start, end, version),
                             keep=self._keep, probe=self._probe)
        self._sources[path] = source
        return source

    def take(self, chunk: Chunk) -> bytes | None:
        """The bytes of a remote ``chunk`` the plan has just read, None if it has not (a chunk found by
        probes, or planned by an earlier run: its actor reads them)."""
        source = self._sources.get(chunk.file)
        return source.take(chunk.start, chunk.end) if source is not None else None


def ranged_source(path: str) -> Source:
    """The bytes a plan reads of ``path`` outside a job: a local file as it is; a remote object by
    ranged reads of its current version, never copied whole. ValueError naming the URI if it cannot be read."""
    return RemoteInputs(keep=False)(path)


def drop_staged_inputs(job_dir: Path) -> None:
    shutil.rmtree(job_dir / INPUTS_DIR, ignore_errors=True)


def find_finished(output_uri: str, spec: JobSpec, local_out: Path) -> Path | None:
    """This spec's finished job on the remote ``output_uri``, mirrored into ``local_out``; None if there
    is none (other jobs there are left alone)."""
    try:
        for uri in objstore.list_dirs(output_uri):
            name = uri.rsplit("/", 1)[-1]
            if not name.startswith(JOB_PREFIX):
                continue
            text = objstore.read_text(f"{uri}/{JOB_FILE}")
            if is_same_job(json.loads(text) if text else None, spec):
                target = local_out / name
                if not target.exists():
                    local_out.mkdir(parents=True, exist_ok=True)
                    objstore.get_tree(uri, target)
                return target
    except objstore.StorageError as exc:
        raise BatchError(f"--output {output_uri}: {exc.message}") from None
    return None


def publish(job: BatchPredictionJob) -> str | None:
    """Upload a succeeded job to its remote output (shards and errors, then ``job.json``); returns the
    remote directory, None for a local job. Harmless to repeat: every object is replaced whole."""
    output_uri = job.data.get("output_uri")
    if not output_uri or job.state != SUCCEEDED:
        return None
    dest = job.output_info.gcs_output_directory
    try:
        if objstore.read_text(f"{dest}/{JOB_FILE}") is None:
            files = result_shards(job.job_dir) + [job.job_dir / ERRORS_FILE]
            objstore.publish([f for f in files if f.is_file()], dest)
            objstore.publish([job.job_dir / JOB_FILE], dest)  # last: the job is finished once this is there
    except objstore.StorageError as exc:
        raise BatchError(f"uploading the results to {dest}: {exc.message} (run the same command again to "
                         f"retry; the results are kept in {job.job_dir})") from None
    return dest
