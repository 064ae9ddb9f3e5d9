"""Reading a running trial's measurements from whichever of three places it writes them.

- ``metrics.json`` of ``modelyard train`` (one entry per epoch, rewritten atomically);
- TensorBoard event files anywhere under the job directory (a tag, as AI Platform read
  ``hyperparameter_metric_tag``): parsed here record by record, with the protobuf classes
  TensorBoard ships, so the tuning process never imports TensorFlow;
- the ``cloudml-hypertune`` file (``CLOUD_ML_HP_METRIC_FILE``): JSON lines, rewritten whole
  by the library after every report and holding only its last 100 entries, so entries are
  remembered here by their timestamp.

Each reader is incremental (it keeps what it has seen) and tolerant of a file caught
half-written: what cannot be read yet is read on the next poll.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

METRICS_JSON = "metrics.json"
HYPERTUNE_FILE = "hypertune/output.metrics"
_HYPERTUNE_SKIP = {"timestamp", "trial", "global_step", "checkpoint_path"}
_MODELYARD_SKIP = {"epoch", "steps", "seconds", "samples_per_sec", "cpu_seconds", "samples_per_cpu_sec", "epoch_seconds"}

Series = dict[str, dict[int, float]]  # tag -> step -> value


class MetricsJsonReader:
    """``modelyard train``'s per-epoch metrics; the step is the epoch (1-based)."""

    name = "metrics.json"

    def __init__(self, job_dir: Path):
        self.path = job_dir / METRICS_JSON
        self._mtime = 0.0
        self.series: Series = {}

    def poll(self) -> None:
        try:
            mtime = self.path.stat().st_mtime_ns
            if mtime == self._mtime:
                return
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return  # absent, or replaced under us: read again next poll
        self._mtime = mtime
        for entry in data.get("epochs", []):
            for key, value in entry.items():
                if key not in _MODELYARD_SKIP and isinstance(value, (int, float)):
                    self.series.setdefault(key, {})[int(entry["epoch"])] = float(value)


def _tensor_value(tensor) -> float | None:
    """The scalar in a TensorProto written by tf.summary.scalar (float/double/half/int)."""
    for name in ("float_val", "double_val", "half_val", "int_val", "int64_val"):
        values = getattr(tensor, name)
        if len(values) == 1:
            return float(values[0])
    content = tensor.tensor_content
    formats = {1: "<f", 2: "<d", 3: "<i", 9: "<q"}  # DT_FLOAT, DT_DOUBLE, DT_INT32, DT_INT64
    fmt = formats.get(tensor.dtype)
    if fmt and len(content) == struct.calcsize(fmt):
        return float(struct.unpack(fmt, content)[0])
    return None


class _EventFile:
    """One ``events.out.tfevents.*`` file read incrementally as TFRecords.

    A record is: uint64 length, uint32 CRC of the length, data, uint32 CRC of the data.
    A record whose bytes are not all there yet is left for the next poll.
    """

    def __init__(self, path: Path, run: str):
        self.path, self.run, self.offset = path, run, 0

    def read(self, series: Series) -> None:
        from tensorboard.compat.proto import event_pb2

        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        pos = 0
        while len(data) - pos >= 12:
            (length,) = struct.unpack_from("<Q", data, pos)
            end = pos + 12 + length + 4
            if end > len(data):
                break
            event = event_pb2.Event()
            try:
                event.ParseFromString(data[pos + 12:pos + 12 + length])
            except Exception:  # a corrupt record: skip it, as TensorBoard does
                event = None
            pos = end
            if event is None or not event.HasField("summary"):
                continue
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    number = float(value.simple_value)
                elif value.HasField("tensor"):
                    number = _tensor_value(value.tensor)
                else:
                    continue
                if number is None:
                    continue
                tag = f"{self.run}/{value.tag}" if self.run else value.tag
                series.setdefault(tag, {})[int(event.step)] = number
        self.offset += pos


class TensorBoardReader:
    """Scalars from every event file under the job dir; a tag is ``run/tag`` for files in a
    sub-directory (``validation/epoch_accuracy``), so a plain tag may also match it."""

    name = "TensorBoard"

    def __init__(self, job_dir: Path):
        self.job_dir = job_dir
        self.files: dict[Path, _EventFile] = {}
        self.series: Series = {}

    def poll(self) -> None:
        if not self.job_dir.is_dir():
            return
        for root, _, names in os.walk(self.job_dir):
            for name in names:
                if "tfevents" in name:
                    path = Path(root) / name
                    if path not in self.files:
                        run = os.path.relpath(root, self.job_dir)
                        self.files[path] = _EventFile(path, "" if run == "." else run)
        for event_file in sorted(self.files.values(), key=lambda e: str(e.path)):
            event_file.read(self.series)


class HypertuneReader:
    """``cloudml-hypertune``'s file. Its ``global_step`` is 0 when the caller gave none; then the
    step is the report's order."""

    name = "cloudml-hypertune"

    def __init__(self, path: Path):
        self.path = path
        self._seen: set[tuple[str, str]] = set()
        self._order: dict[str, int] = {}
        self.series: Series = {}

    def poll(self) -> None:
        try:
            lines = self.path.read_text().splitlines()
        except OSError:
            return
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # the library rewrites the file in place: a line may be half there
            if not isinstance(entry, dict):
                continue
            for tag, raw in entry.items():
                if tag in _HYPERTUNE_SKIP:
                    continue
                key = (tag, str(entry.get("timestamp")))
                if key in self._seen:
                    continue
                try:
                    value = float(raw)
                    step = int(entry.get("global_step") or 0)
                except (TypeError, ValueError):
                    continue
                self._seen.add(key)
                series = self.series.setdefault(tag, {})
                order = self._order.get(tag, 0) + 1
                self._order[tag] = order
                series[step if step > 0 else order] = value


def _is_validation(tag: str) -> bool:
    return any(part in ("validation", "eval", "evaluation") for part in tag.split("/")[:-1])


class TrialMetrics:
    """The measurements of one trial, from the sources its study allows."""

    def __init__(self, job_dir: Path, hypertune_file: Path, source: str):
        readers = {
            "hypertune": HypertuneReader(hypertune_file),
            "modelyard": MetricsJsonReader(job_dir),
            "tensorboard": TensorBoardReader(job_dir),
        }
        # In `auto`, the first source that has a tag wins, in this order: the two written
        # for tuning (hypertune, metrics.json) before TensorBoard's many tags.
        self.readers = list(readers.values()) if source == "auto" else [readers[source]]

    def poll(self) -> None:
        for reader in self.readers:
            reader.poll()

    def series(self, tag: str) -> dict[int, float]:
        """Step -> value for ``tag`` (a TensorBoard ``run/tag`` matches a plain ``tag``)."""
        for reader in self.readers:
            if tag in reader.series:
                return reader.series[tag]
            if isinstance(reader, TensorBoardReader):
                # Keras writes the same tag for train and validation runs: validation wins.
                names = sorted(reader.series, key=lambda n: (not _is_validation(n), n))
                for name in names:
                    if name.rsplit("/", 1)[-1] == tag:
                        return reader.series[name]
        return {}

    def reported(self) -> str:
        """What the trial did report, per source, for the error naming a missing metric."""
        parts = [f"{r.name}: {', '.join(sorted(r.series))}" for r in self.readers if r.series]
        return "; ".join(parts) if parts else "nothing (no metrics.json, TensorBoard events or hypertune file)"
