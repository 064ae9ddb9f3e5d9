"""A CustomJob's TensorBoard logs sent to the TensorBoard resource its ``jobSpec.tensorboard`` names, as
Vertex AI does: the event files under the job's ``AIP_TENSORBOARD_LOG_DIR`` become TensorBoard experiment
``{job id}`` of that resource, one run per folder holding event files (``train``, ``validation``; the
folder itself is run ``default``), one scalar time series per tag. Written through the platform's REST API
with the job's own credentials (its metadata server's token behind ``--auth-token``), when the job's
replicas have ended (Vertex uploads while the job runs; here the scalars arrive at its end).

Scalars only (a summary value's ``simple_value``, or a float/double scalar tensor as TF2's
``tf.summary.scalar`` writes); images, histograms and other tensors are skipped. The event files are read
as TFRecords with TensorBoard's protos (no TensorFlow import).
"""
from __future__ import annotations

import re
import struct
import tempfile
import urllib.error
import urllib.parse
from pathlib import Path

from modelyard import objstore
from modelyard.json_http import json_request

WRITE_BATCH = 1000  # points per write request


def _records(data: bytes):
    """The TFRecords of an event file (length, its CRC, the record, its CRC); a torn tail is left out."""
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        start, end = pos + 12, pos + 12 + length
        if end + 4 > len(data):
            return
        yield data[start:end]
        pos = end + 4


def _scalar(value) -> float | None:
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.HasField("tensor") and not value.tensor.tensor_shape.dim:
        t = value.tensor
        if t.dtype == 1:  # DT_FLOAT
            return float(t.float_val[0]) if t.float_val else struct.unpack("<f", t.tensor_content[:4])[0]
        if t.dtype == 2:  # DT_DOUBLE
            return float(t.double_val[0]) if t.double_val else struct.unpack("<d", t.tensor_content[:8])[0]
    return None


def read_scalars(files: list[Path]) -> dict[str, list[tuple[int, float, float]]]:
    """``{tag: [(step, wall_time, value), ...]}`` of the event files, in file order."""
    from tensorboard.compat.proto import event_pb2

    out: dict[str, list[tuple[int, float, float]]] = {}
    for path in files:
        for record in _records(path.read_bytes()):
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                number = _scalar(value)
                if number is not None:
                    out.setdefault(value.tag, []).append((int(event.step), float(event.wall_time), number))
    return out


def _run_id(folder: str) -> str:
    rid = re.sub(r"[^a-z0-9-]+", "-", folder.lower()).strip("-")[:128]
    return rid or "default"


def local_logs(logdir: str, into: Path) -> Path:
    """The log directory on this host: a local one as it is, a storage one downloaded under ``into``."""
    scheme = objstore.scheme_of(logdir)
    if not scheme:
        return Path(objstore.local_path(logdir))
    fs = objstore.filesystem(scheme)
    root = logdir.rstrip("/")
    for remote in fs.find(root):
        if "tfevents" in remote.rsplit("/", 1)[-1]:
            target = into / remote[len(root.split("://", 1)[-1]):].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(remote, str(target))
    return into


class _Api:
    def __init__(self, url: str, token: str | None) -> None:
        self.url, self.token = url.rstrip("/"), token

    def call(self, method: str, path: str, body: dict | None = None, query: dict | None = None,
             ok: tuple[int, ...] = ()) -> dict | None:
        url = f"{self.url}/v1/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        try:
            return json_request(method, url, body, self.token, timeout=60)
        except urllib.error.HTTPError as exc:
            if exc.code in ok:
                return None
            raise RuntimeError(f"{method} {path}: {exc.code} {exc.read()[:500]!r}") from None


def upload(logdir: str, tensorboard: str, experiment_id: str, url: str, token: str | None) -> int:
    """Sends the scalars under ``logdir`` into ``tensorboard`` (a resource name) as experiment
    ``experiment_id``; the number of points sent."""
    api = _Api(url, token)
    sent = 0
    with tempfile.TemporaryDirectory(prefix="tb-upload-") as tmp:
        root = local_logs(logdir, Path(tmp))
        if not root.is_dir():
            return 0
        by_folder: dict[str, list[Path]] = {}
        for path in sorted(root.rglob("*tfevents*")):
            by_folder.setdefault(str(path.parent.relative_to(root)), []).append(path)
        if not by_folder:
            return 0
        exp = f"{tensorboard}/experiments/{experiment_id}"
        api.call("POST", f"{tensorboard}/experiments", {"displayName": experiment_id, "source": "modelyard job"},
                 {"tensorboardExperimentId": experiment_id}, ok=(409,))
        for folder, files in by_folder.items():
            scalars = read_scalars(files)
            if not scalars:
                continue
            run = f"{exp}/runs/{_run_id(folder)}"
            api.call("POST", f"{exp}/runs", {"displayName": folder if folder != "." else "default"},
                     {"tensorboardRunId": _run_id(folder)}, ok=(409,))
            listed = api.call("GET", f"{run}/timeSeries", query={"pageSize": 1000}) or {}
            ids = {s["displayName"]: s["name"].rsplit("/", 1)[1] for s in listed.get("tensorboardTimeSeries", [])}
            for tag in scalars:
                if tag not in ids:
                    made = api.call("POST", f"{run}/timeSeries", {"displayName": tag, "valueType": "SCALAR"})
                    ids[tag] = made["name"].rsplit("/", 1)[1]
            points = [(ids[tag], p) for tag, values in scalars.items() for p in values]
            for i in range(0, len(points), WRITE_BATCH):
                by_series: dict[str, list[dict]] = {}
                for sid, (step, wall, value) in points[i:i + WRITE_BATCH]:
                    by_series.setdefault(sid, []).append({"step": str(step), "scalar": {"value": value},
                                                          "wallTime": _rfc3339(wall)})
                api.call("POST", f"{run}:write", {"timeSeriesData": [
                    {"tensorboardTimeSeriesId": sid, "valueType": "SCALAR", "values": values}
                    for sid, values in by_series.items()]})
            sent += len(points)
    return sent


def _rfc3339(epoch: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

