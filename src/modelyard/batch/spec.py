"""What a batch job is: the resolved model version, the input files and the instance options.

Two runs are the same job when their ``JobSpec.identity()`` match; that is how a re-run of
the same command finds its unfinished job. Resolving a spec touches only the file system
(no TensorFlow), so bad arguments fail in a fraction of a second.
"""
from __future__ import annotations

import glob
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from modelyard import objstore
from modelyard.model.export import latest_version, list_versions
from modelyard.model.savedmodel import SAVED_MODEL_FILES, TFLITE_FILE

FORMATS = ("jsonl", "csv", "tf-record", "file-list")
# The format an input's extension says, when --format is not given (file lists have no extension of their own).
EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv",
              ".tfrecord": "tf-record", ".tfrecords": "tf-record", ".tfr": "tf-record"}
INSTANCE_TYPES = ("object", "array")
DEFAULT_CHUNK_ROWS = 10_000


class BatchError(Exception):
    """The job cannot start or go on; the message says why and what to do."""


@dataclass(frozen=True)
class InputFile:
    path: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class JobSpec:
    model_name: str
    version: int | None
    version_dir: str
    inputs: tuple[InputFile, ...]
    format: str = "jsonl"
    key_field: str | None = None
    included_fields: tuple[str, ...] = ()
    excluded_fields: tuple[str, ...] = ()
    instance_type: str | None = None
    signature_name: str = "serving_default"
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    runtime: str = "auto"
    extra: dict = field(default_factory=dict)
    json_numbers: str = "tf_serving"  # how JSON numbers meet integer inputs: dtypes.JSON_NUMBER_RULES

    def identity(self) -> dict:
        """Everything that decides which rows and which predictions the job writes."""
        data = asdict(self)
        data.pop("extra")
        if data["json_numbers"] == "tf_serving":
            data.pop("json_numbers")  # the default: jobs recorded before the setting existed still match
        data["inputs"] = [list(asdict(f).values()) for f in self.inputs]
        data["included_fields"] = list(self.included_fields)
        data["excluded_fields"] = list(self.excluded_fields)
        return data

    @classmethod
    def from_identity(cls, data: dict) -> "JobSpec":
        data = dict(data)
        data["inputs"] = tuple(InputFile(*f) for f in data["inputs"])
        data["included_fields"] = tuple(data["included_fields"])
        data["excluded_fields"] = tuple(data["excluded_fields"])
        return cls(**data)


def _is_version_dir(path: Path) -> bool:
    from modelyard.model.runtime.estimators import ESTIMATOR_FILES  # scikit-learn / XGBoost models

    return any((path / name).is_file() for name in SAVED_MODEL_FILES + (TFLITE_FILE,) + ESTIMATOR_FILES)


def resolve_model(model: str) -> tuple[str, int | None, Path]:
    """``BASE[:VERSION]`` -> ``(model name, version, version dir)``; BASE may itself be a version dir."""
    base, version = model, None
    head, sep, tail = model.rpartition(":")
    if sep and tail.isdigit() and head:
        base, version = head, int(tail)
    if base.startswith("file://"):
        base = base[len("file://"):]
    path = Path(base)
    if not path.exists():
        raise BatchError(f"--model {model}: {path} does not exist")
    if not path.is_dir():
        raise BatchError(f"--model {model}: {path} is not a directory (expected a model base path or a version directory)")
    if _is_version_dir(path):
        if version is not None:
            raise BatchError(f"--model {model}: {path} is already a version directory; drop :{version}")
        number = int(path.name) if path.name.isascii() and path.name.isdigit() else None
        name = path.parent.name if number is not None else path.name
        return name, number, path
    if version is not None:
        versions = list_versions(path)
        if version not in versions:
            have = ", ".join(str(v) for v in sorted(versions)) or "none"
            raise BatchError(f"--model {model}: {path} has no version {version} (versions: {have})")
        chosen = versions[version]
    else:
        latest = latest_version(path)
        if latest is None:
            raise BatchError(
                f"--model {model}: {path} is not a model: expected {' or '.join(SAVED_MODEL_FILES)} or "
                f"{TFLITE_FILE} (a version directory), or integer-named version subdirectories (a base path)"
            )
        version, chosen = latest
    if not _is_version_dir(chosen):
        raise BatchError(f"--model {model}: version directory {chosen} holds no {' or '.join(SAVED_MODEL_FILES)} or {TFLITE_FILE}")
    return path.name, version, chosen


def expand_inputs(patterns: list[str] | str) -> tuple[InputFile, ...]:
    """Local paths, globs (``**`` too), ``file://``, ``gs://`` and ``s3://`` URLs -> the matching files,
    sorted, each once (remote ones as URIs, staged into the job directory when it runs)."""
    if isinstance(patterns, str):
        patterns = [patterns]
    if not patterns:
        raise BatchError("--input: no input given")
    found: dict[str, InputFile] = {}
    for pattern in patterns:
        if "://" in pattern and not pattern.startswith("file://"):
            found.update(_expand_remote(pattern))
            continue
        local = pattern[len("file://"):] if pattern.startswith("file://") else pattern
        if glob.has_magic(local):
            matches = sorted(m for m in glob.glob(local, recursive=True) if os.path.isfile(m))
            if not matches:
                raise BatchError(f"--input {pattern}: the pattern matched no files")
        else:
            if not os.path.exists(local):
                raise BatchError(f"--input {pattern}: no such file")
            if os.path.isdir(local):
                raise BatchError(f"--input {pattern}: is a directory; give a file or a glob such as {local.rstrip('/')}/*.jsonl")
            matches = [local]
        for match in matches:
            real = os.path.abspath(match)
            if real not in found:
                st = os.stat(real)
                if not os.access(real, os.R_OK):
                    raise BatchError(f"--input {pattern}: {real} is not readable")
                found[real] = InputFile(real, st.st_size, st.st_mtime_ns)
    return tuple(found[p] for p in sorted(found))


def guess_format(inputs: tuple[InputFile, ...]) -> str:
    """The inputs' format from their extensions (``.csv`` -> csv, ``.jsonl`` -> jsonl, ``.tfrecord`` ->
    tf-record ...); jsonl when none says; BatchError when they say different things."""
    said: dict[str, str] = {}
    for f in inputs:
        name = f.path.rsplit("/", 1)[-1].lower()
        ext = "." + name.rsplit(".", 1)[-1] if "." in name else ""
        if ext in EXTENSIONS:
            said.setdefault(EXTENSIONS[ext], f.path)
    if len(said) > 1:
        shown = ", ".join(f"{path} ({fmt})" for fmt, path in said.items())
        raise BatchError(f"--input: the files are of different formats ({shown}); give --format, or one job per format")
    return next(iter(said), "jsonl")


def _expand_remote(pattern: str) -> dict[str, InputFile]:
    """A gs:// / s3:// path or glob -> its objects, each with the size and time that identify the job."""
    try:
        return {uri: InputFile(uri, *objstore.stat(uri)) for uri in objstore.expand([pattern])}
    except objstore.StorageError as exc:
        raise BatchError(f"--input {pattern}: {exc.message}") from None


def check_options(fmt: str | None, instance_type: str | None, included: tuple[str, ...], excluded: tuple[str, ...],
                  batch_size: int, workers: int) -> None:
    if fmt is not None and fmt not in FORMATS:
        raise BatchError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    if instance_type is not None and instance_type not in INSTANCE_TYPES:
        raise BatchError(f"--instance-type {instance_type}: expected object or array")
    if included and excluded:
        raise BatchError("--included-fields and --excluded-fields cannot both be given (Vertex AI's rule)")
    if batch_size < 1:
        raise BatchError(f"--batch-size {batch_size}: must be at least 1")
    if workers < 0:
        raise BatchError(f"--workers {workers}: must be 0 (in this process) or more")
