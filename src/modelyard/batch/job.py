"""A batch prediction job on disk: its directory and ``job.json`` (spec, state, stats); its plan is ``job_plan``'s.

States are Vertex AI's (``JOB_STATE_PENDING`` ... ``JOB_STATE_SUCCEEDED``). The job directory
is ``<output>/prediction-<model>-<UTC timestamp>/``; ``job.json`` is replaced atomically on
every state change, and an exclusive lock on ``.lock`` keeps two runs off one job.
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
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


def find_job(output_dir: Path, spec: JobSpec) -> Path | None:
    """This spec's job under ``output_dir``, None if there is none; refuses a directory holding another job."""
    if not output_dir.exists():
        return None
    if not output_dir.is_dir():
        raise BatchError(f"--output {output_dir} is a file, not a directory")
    for entry in sorted(output_dir.iterdir()):
        if not (entry.name.startswith(JOB_PREFIX) and entry.is_dir()):
            continue
        data = BatchPredictionJob(entry).data if (entry / JOB_FILE).is_file() else None
        if is_same_job(str(output_dir), entry.name, data, spec):
            return entry
    return None


def is_same_job(output: str, name: str, data: dict | None, spec: JobSpec) -> bool:
    """True when job ``name`` (its ``job.json`` ``data``) under ``output`` is this spec's job; BatchError
    when it is another job or no job: an output directory holds one job (local or gs:// / s3://)."""
    if data is None:
        raise BatchError(f"--output {output} already holds {name}, which is not a modelyard job "
                         f"(no {JOB_FILE}); give an empty or new --output directory")
    wanted = json.loads(json.dumps(spec.identity()))
    if data["spec"] == wanted:
        return True
    raise BatchError(
        f"--output {output} already holds a different job: {name} ({_describe(data['spec'])}; "
        f"this run: {_describe(wanted)}). Give a new --output directory, or --resume {output.rstrip('/')}/{name} "
        "to finish that job."
    )


def create_job(output_dir: Path, spec: JobSpec) -> BatchPredictionJob:
    output_dir.mkdir(parents=True, exist_ok=True)
    job_dir = output_dir / job_dir_name(spec.model_name)
    job_dir.mkdir()
    write_json(job_dir / JOB_FILE, {"spec": spec.identity(), "state": PENDING, "create_time": utc_now(),
                                    "completion_stats": {}, "error": None, "runs": 0})
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
