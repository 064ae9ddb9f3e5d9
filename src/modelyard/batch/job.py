"""A batch prediction job on disk: its directory and ``job.json`` (spec, state, stats); its plan is ``job_plan``'s.

States are Vertex AI's (``JOB_STATE_PENDING`` ... ``JOB_STATE_SUCCEEDED``). The job directory
is ``<output>/prediction-<model>-<UTC timestamp>/``, and one output holds any number of them;
``job.json`` is replaced atomically on every state change, and an exclusive lock on ``.lock``
keeps two runs off one job.
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from modelyard.batch.shards import ERRORS_FILE, iter_lines, result_shards, write_json
from modelyard.batch.spec import BatchError, JobSpec

PENDING, RUNNING, SUCCEEDED, FAILED = ("JOB_STATE_PENDING", "JOB_STATE_RUNNING",
                                       "JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED")
JOB_FILE = "job.json"
JOB_PREFIX = "prediction-"


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def job_dir_name(model_name: str, now: _dt.datetime | None = None) -> str:
    """``prediction-<model>-<YYYY_MM_DDThh_mm_ss_sssZ>``: Vertex AI's name, with path-safe separators."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return f"{JOB_PREFIX}{model_name}-{now.strftime('%Y_%m_%dT%H_%M_%S')}_{now.microsecond // 1000:03d}Z"


@dataclass(frozen=True)
class OutputInfo:
    gcs_output_directory: str  # the Vertex field name: a local directory or a gs:// / s3:// prefix


class BatchPredictionJob:
    """One job directory: ``state``, ``output_info``, ``completion_stats``, ``iter_outputs()``."""

    def __init__(self, job_dir: str | Path):
        self.job_dir = Path(job_dir)
        self._data = self._read()

    def _read(self) -> dict:
        path = self.job_dir / JOB_FILE
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise BatchError(f"{self.job_dir} is not a batch prediction job (no {JOB_FILE})") from None
        except (OSError, ValueError) as exc:
            raise BatchError(f"{path} cannot be read: {exc}") from None

    def refresh(self) -> "BatchPredictionJob":
        self._data = self._read()
        return self

    @property
    def spec(self) -> JobSpec:
        return JobSpec.from_identity(self._data["spec"])

    @property
    def state(self) -> str:
        return self._data["state"]

    @property
    def error(self) -> str | None:
        return self._data.get("error")

    @property
    def display_name(self) -> str:
        return self.job_dir.name

    @property
    def output_info(self) -> OutputInfo:
        """The job's directory: on gs:// / s3:// when the job was given a remote ``--output``."""
        remote = self._data.get("output_uri")
        return OutputInfo(f"{remote.rstrip('/')}/{self.job_dir.name}" if remote else str(self.job_dir))

    @property
    def completion_stats(self) -> dict[str, int]:
        return dict(self._data.get("completion_stats", {}))

    @property
    def data(self) -> dict:
        return dict(self._data)

    def iter_outputs(self, errors: bool = False) -> Iterator[dict]:
        """Every result line as a dict (shard by shard); with ``errors=True``, the error lines after."""
        yield from iter_lines(result_shards(self.job_dir))
        if errors and (self.job_dir / ERRORS_FILE).is_file():
            yield from iter_lines([self.job_dir / ERRORS_FILE])

    def update(self, **changes: Any) -> None:
        self._data.update(changes)
        write_json(self.job_dir / JOB_FILE, self._data)

    def __repr__(self) -> str:
        return f"BatchPredictionJob({str(self.job_dir)!r}, state={self.state})"


def _describe(spec: dict) -> str:
    files = [f[0] for f in spec["inputs"]]
    shown = files[0] + (f" and {len(files) - 1} more" if len(files) > 1 else "")
    return f"model {spec['version_dir']}, {spec['format']} input {shown}"


def is_finished(data: dict) -> bool:
    """A job with nothing left to do: succeeded, or failed after every row was tried (no row succeeded)."""
    return data.get("state") == SUCCEEDED or bool(data.get("finished"))


def _when(mtime_ns: int) -> str:
    return _dt.datetime.fromtimestamp(mtime_ns / 1e9, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def differences(recorded: dict, wanted: dict) -> list[str]:
    """What differs between a job's recorded spec and this run's, one phrase each (job first, then this run)."""
    out = []
    before = {f[0]: f for f in recorded.get("inputs", [])}
    after = {f[0]: f for f in wanted.get("inputs", [])}
    for path in sorted(set(before) | set(after)):
        if path not in after:
            out.append(f"input {path} is the job's, not this run's")
        elif path not in before:
            out.append(f"input {path} is this run's, not the job's")
        elif before[path] != after[path]:
            (_, size0, time0), (_, size1, time1) = before[path], after[path]
            change = [f"{size0:,} -> {size1:,} bytes"] if size0 != size1 else []
            if time0 != time1:
                change.append(f"modified {_when(time0)} -> {_when(time1)}")
            out.append(f"input {path} changed since the job started ({', '.join(change)})")
    for key in sorted((set(recorded) | set(wanted)) - {"inputs"}):
        if recorded.get(key) != wanted.get(key):
            out.append(f"{key}: {recorded.get(key)!r} (job) vs {wanted.get(key)!r} (this run)")
    return out


def find_job(output_dir: Path, spec: JobSpec) -> Path | None:
    """This spec's job under ``output_dir`` (finished or not), None if there is none. The output holds any
    number of jobs, each in its own ``prediction-<model>-<time>/`` folder, as a Vertex destination does."""
    if not output_dir.exists():
        return None
    if not output_dir.is_dir():
        raise BatchError(f"--output {output_dir} is a file, not a directory")
    for entry in sorted(output_dir.iterdir()):
        if entry.name.startswith(JOB_PREFIX) and (entry / JOB_FILE).is_file():
            if is_same_job(BatchPredictionJob(entry).data, spec):
                return entry
    return None


def is_same_job(data: dict | None, spec: JobSpec) -> bool:
    """True when a job's ``job.json`` ``data`` records this spec (so this run continues or reports it)."""
    return data is not None and data.get("spec") == json.loads(json.dumps(spec.identity()))


def unfinished_lookalikes(output_dir: Path, spec: JobSpec) -> list[tuple[Path, list[str]]]:
    """Unfinished jobs under ``output_dir`` reading the same input files as ``spec`` but not the same job
    (an input edited since, another option): each with what differs, so the user can ``--resume`` it."""
    wanted = json.loads(json.dumps(spec.identity()))
    paths = sorted(f[0] for f in wanted["inputs"])
    out = []
    if not output_dir.is_dir():
        return out
    for entry in sorted(output_dir.iterdir()):
        if not (entry.name.startswith(JOB_PREFIX) and (entry / JOB_FILE).is_file()):
            continue
        data = BatchPredictionJob(entry).data
        if is_finished(data) or data["spec"] == wanted or sorted(f[0] for f in data["spec"]["inputs"]) != paths:
            continue
        out.append((entry, differences(data["spec"], wanted)))
    return out


def create_job(output_dir: Path, spec: JobSpec) -> BatchPredictionJob:
    output_dir.mkdir(parents=True, exist_ok=True)
    while True:  # two jobs of one model started in the same millisecond get the next one
        job_dir = output_dir / job_dir_name(spec.model_name)
        try:
            job_dir.mkdir()
            break
        except FileExistsError:
            time.sleep(0.001)
    try:
        write_json(job_dir / JOB_FILE, {"spec": spec.identity(), "state": PENDING, "create_time": utc_now(),
                                        "completion_stats": {}, "error": None, "runs": 0})
    except OSError:  # no record, no job: a directory without job.json would only confuse the next run
        shutil.rmtree(job_dir, ignore_errors=True)
        raise
    return BatchPredictionJob(job_dir)


class JobLock:
    """An exclusive, non-blocking lock on the job (released when the process dies, even by SIGKILL)."""

    def __init__(self, job_dir: Path):
        self.path = job_dir / ".lock"
        self.fd: int | None = None

    def __enter__(self) -> "JobLock":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip()
            os.close(self.fd)
            raise BatchError(f"job {self.path.parent} is being run by another process (pid {holder or '?'})") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
