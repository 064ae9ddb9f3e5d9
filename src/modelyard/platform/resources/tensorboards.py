"""The TensorBoard API: ``tensorboards``, their ``experiments``, ``runs`` and ``timeSeries``
(create, get, list with filters and pages, patch, delete with everything below), and the time
series' data: ``write`` (a run's or an experiment's), ``read``, ``batchRead`` and
``exportTensorboardTimeSeries``. Vertex Experiments keep a run's time-series metrics here."""
from __future__ import annotations

import base64
import binascii
import time
from typing import Mapping

from modelyard.platform.api import metadata_filter, tracking_messages as msg, tracking_pages
from modelyard.platform.api.errors import ApiError, invalid
from modelyard.platform.api.names import new_id
from modelyard.platform.api.timefmt import rfc3339
from modelyard.platform.api.tracking_names import (CHOSEN_ID, TrackingRoute, check_chosen_id,
                                                   parse_tracking_path)
from modelyard.platform.resources import metadata_nodes
from modelyard.platform.state.tensorboard_db import LEVELS, TensorboardDB

VALUE_TYPES = ("VALUE_TYPE_UNSPECIFIED", "SCALAR", "TENSOR", "BLOB_SEQUENCE")
MAX_POINTS_PER_WRITE = 20000  # one write request; Vertex's own bound is per request too
MAX_BATCH_READ = 100
DEFAULT_READ_POINTS = {"SCALAR": 1000, "TENSOR": 100, "BLOB_SEQUENCE": 10}
_MESSAGE = {"tensorboards": "Tensorboard", "experiments": "TensorboardExperiment", "runs": "TensorboardRun",
            "timeSeries": "TensorboardTimeSeries"}
_CREATE_ID = {"experiments": "tensorboardExperimentId", "runs": "tensorboardRunId",
              "timeSeries": "tensorboardTimeSeriesId"}
_ORDER = {"create_time": "created", "update_time": "updated", "display_name": "display_name"}
_KEYS = {"tensorboards": "tensorboard_id", "experiments": "experiment_id", "runs": "run_id"}


def keys_of(route: TrackingRoute, upto: int | None = None) -> dict:
    """The db keys of the resource the route's first ``upto`` levels name (the whole route by default)."""
    levels = route.ids[:upto] if upto is not None else route.ids
    return {**_parent_keys(levels), "id": levels[-1][1]}


def check_tensorboard(db: TensorboardDB, name: object, field: str) -> str:
    """``name`` if it names an existing TensorBoard (``projects/p/locations/l/tensorboards/id``); else
    INVALID_ARGUMENT / NOT_FOUND naming ``field``."""
    route = None
    if isinstance(name, str) and name.count("/") == 5:
        try:
            route = parse_tracking_path(name)
        except ApiError:
            route = None
    if route is None or route.leaf != "tensorboards" or route.leaf_id is None or route.verb:
        raise invalid(f"{field} must name a TensorBoard: projects/{{p}}/locations/{{l}}/tensorboards/{{id}}, "
                      f"got {name!r}.")
    try:
        db.get("tensorboards", keys_of(route))
    except ApiError as exc:
        if exc.status == "NOT_FOUND":
            raise ApiError("NOT_FOUND", f"{field}: TensorBoard {name} does not exist.") from None
        raise
    return name


def _parent_keys(levels) -> dict:
    """The key columns a row below ``levels[:-1]`` has for its parents."""
    return {_KEYS[c]: rid for c, rid in levels[:-1]}


def render(level: str, row: dict, name: str, db: TensorboardDB | None = None,
           stats: dict[str, tuple[int, float]] | None = None) -> dict:
    """A resource as the API shows it; ``stats``: time series' (max step, max wall time), read for a
    whole list at once (else from ``db`` for this one)."""
    out = {"name": name, "displayName": row["display_name"], "description": row["description"],
           "createTime": rfc3339(row["created"]), "updateTime": rfc3339(row["updated"]), "etag": str(row["etag"])}
    if level != "timeSeries":
        out["labels"] = row["labels"] or {}
    if level == "tensorboards":
        out["isDefault"] = bool(row["is_default"])
        out["blobStoragePathPrefix"] = f"modelyard-tensorboards/{row['id']}"
        if db is not None:
            out["runCount"] = db.count("runs", {"tensorboard_id": row["id"]})
    elif level == "experiments":
        out["source"] = row["source"]
    elif level == "timeSeries":
        out.update(valueType=row["value_type"], pluginName=row["plugin_name"], pluginData=row["plugin_data"])
        if stats is None and db is not None:
            stats = db.series_stats([row["id"]])
        found = (stats or {}).get(row["id"])
        if found:
            out["metadata"] = {"maxStep": str(found[0]), "maxWallTime": rfc3339(found[1])}
    return out


def _filter_row(level: str, row: dict, name: str) -> dict:
    """A row as the list filter reads it (``metadata_filter``'s TensorBoard fields)."""
    return {**row, "name": name, "is_default": "true" if row.get("is_default") else "false"}


def _values(level: str, body: dict, creating: bool) -> dict:
    msg.check_message(body, _MESSAGE[level])
    out: dict = {}
    for field, column in (("displayName", "display_name"), ("description", "description")):
        value = msg.get(body, field)
        if value is not None:
            out[column] = value
    if msg.get(body, "labels") is not None and level != "timeSeries":
        out["labels"] = dict(msg.get(body, "labels"))
    if level == "tensorboards" and msg.get(body, "isDefault") is not None:
        out["is_default"] = int(bool(msg.get(body, "isDefault")))
    if level == "experiments" and msg.get(body, "source") is not None:
        out["source"] = str(msg.get(body, "source"))
    if level == "timeSeries":
        if msg.get(body, "valueType") is not None:
            out["value_type"] = metadata_nodes.enum_name(msg.get(body, "valueType"), VALUE_TYPES,
                                                         "TensorboardTimeSeries.value_type")
        for field, column in (("pluginName", "plugin_name"), ("pluginData", "plugin_data")):
            if msg.get(body, field) is not None:
                out[column] = str(msg.get(body, field))
    if creating:
        if level in ("tensorboards", "timeSeries") and not out.get("display_name"):
            raise invalid(f"{_MESSAGE[level]}.display_name is required.")
        if level == "timeSeries" and out.get("value_type", "VALUE_TYPE_UNSPECIFIED") == "VALUE_TYPE_UNSPECIFIED":
            raise invalid("TensorboardTimeSeries.value_type is required: SCALAR, TENSOR or BLOB_SEQUENCE.")
    return out


def _clear_default(db: TensorboardDB, parent: str, keep: str) -> None:
    """One default TensorBoard per project and location, as Vertex has it."""
    for row in db.list("tensorboards", {"parent": parent}):
        if row["is_default"] and row["id"] != keep:
            db.update("tensorboards", {"id": row["id"]}, {"is_default": 0})


def create(db: TensorboardDB, route: TrackingRoute, body: dict, query: Mapping[str, str]) -> tuple[dict, str]:
    """A new resource under the route's parent; (its rendering, its name)."""
    level = route.leaf
    values = _values(level, body, creating=True)
    if level != "tensorboards":
        db.get(list(LEVELS)[len(route.ids) - 2], keys_of(route, len(route.ids) - 1))  # the parent exists
    chosen = query.get(_CREATE_ID.get(level, ""), "") or query.get(
        metadata_nodes.fields._snake(_CREATE_ID.get(level, "x")), "")
    if level == "tensorboards":
        rid = new_id()
    elif level == "timeSeries":
        rid = check_chosen_id(chosen, "tensorboardTimeSeries") if chosen else new_id()
    else:
        rid = check_chosen_id(chosen, _MESSAGE[level])
    now = time.time()
    defaults = {"tensorboards": {"labels": {}, "is_default": 0}, "experiments": {"labels": {}, "source": ""},
                "runs": {"labels": {}}, "timeSeries": {"plugin_name": "", "plugin_data": ""}}[level]
    row = {**_parent_keys(route.ids), "id": rid, "display_name": "", "description": "", "created": now,
           "updated": now, "etag": 1, **defaults, **values}
    if level == "tensorboards":
        row["parent"] = route.parent
    if level == "timeSeries":
        run_keys = {k: row[k] for k in ("tensorboard_id", "experiment_id", "run_id")}
        if any(s["display_name"] == row["display_name"] for s in db.list("timeSeries", run_keys)):
            raise ApiError("ALREADY_EXISTS", f"TensorboardTimeSeries {row['display_name']!r} already exists in "
                           f"run {route.name(len(route.ids) - 1)}.")
    db.add(level, row)
    if level == "tensorboards" and row.get("is_default"):
        _clear_default(db, route.parent, rid)
    name = f"{route.name()}/{rid}"
    return render(level, row, name, db), name


def get(db: TensorboardDB, route: TrackingRoute) -> dict:
    return render(route.leaf, db.get(route.leaf, keys_of(route)), route.name(), db)


def list_(db: TensorboardDB, route: TrackingRoute, query: Mapping[str, str]) -> dict:
    level = route.leaf
    tree = metadata_filter.parse(query.get("filter"), level)
    if level == "tensorboards":
        listed = db.list(level, {"parent": route.parent})
    else:  # the parent must exist: checked by the same query's connection
        listed = db.list(level, _parent_keys(route.ids), parent=list(LEVELS)[len(route.ids) - 2])
    rows = [r for r in listed
            if metadata_filter.matches(tree, _filter_row(level, r, f"{route.name()}/{r['id']}"), lambda _f: set())]
    rows = tracking_pages.order(rows, query.get("orderBy") or query.get("order_by"), _ORDER)
    chunk, token = tracking_pages.page(rows, query, route.name())
    plural = {"tensorboards": "tensorboards", "experiments": "tensorboardExperiments", "runs": "tensorboardRuns",
              "timeSeries": "tensorboardTimeSeries"}[level]
    stats = db.series_stats([r["id"] for r in chunk]) if level == "timeSeries" else None
    out: dict = {plural: [render(level, r, f"{route.name()}/{r['id']}", db, stats) for r in chunk]}
    if token:
        out["nextPageToken"] = token
    return out


def patch(db: TensorboardDB, route: TrackingRoute, body: dict, update_mask: str | None) -> dict:
    level = route.leaf
    values = _values(level, body, creating=False)
    if update_mask:
        wanted = {metadata_nodes.fields._snake(f.strip()) for f in update_mask.split(",") if f.strip()}
        values = {k: v for k, v in values.items() if k in wanted}
    row = db.update(level, keys_of(route), values)
    if level == "tensorboards" and values.get("is_default"):
        _clear_default(db, route.parent, row["id"])
    return render(level, row, route.name(), db)


def delete(db: TensorboardDB, route: TrackingRoute) -> None:
    db.delete(route.leaf, keys_of(route))


# ---- data ----------------------------------------------------------------------------------------
def _wall_time(value: object, where: str) -> float:
    if value is None:
        return time.time()
    if not isinstance(value, str):
        raise invalid(f"{where}.wall_time must be an RFC 3339 timestamp.")
    try:
        return metadata_filter.parse_time(value, value)
    except ApiError:
        raise invalid(f"{where}.wall_time {value!r} is not an RFC 3339 timestamp.") from None


def _point(series_id: str, value_type: str, point: dict, where: str) -> dict:
    if not isinstance(point, dict):
        raise invalid(f"{where} must be a TimeSeriesDataPoint object.")
    try:
        step = int(msg.get(point, "step", 0) or 0)
    except (TypeError, ValueError):
        raise invalid(f"{where}.step must be a whole number.") from None
    row = {"series_id": series_id, "step": step, "wall_time": _wall_time(msg.get(point, "wallTime"), where),
           "scalar": None, "tensor": None, "blobs": None}
    kinds = [k for k in ("scalar", "tensor", "blobs") if msg.get(point, k) is not None]
    wanted = {"SCALAR": "scalar", "TENSOR": "tensor", "BLOB_SEQUENCE": "blobs"}[value_type]
    if kinds != [wanted]:
        raise invalid(f"{where} of a {value_type} time series holds a {wanted} value, not {kinds or 'nothing'}.")
    value = msg.get(point, wanted) or {}
    if wanted == "scalar":
        scalar = value.get("value", 0.0)
        if isinstance(scalar, str) and scalar in ("NaN", "Infinity", "-Infinity"):
            scalar = float(scalar.replace("Infinity", "inf"))
        if not isinstance(scalar, (int, float)) or isinstance(scalar, bool):
            raise invalid(f"{where}.scalar.value must be a number.")
        row["scalar"] = float(scalar)
    elif wanted == "tensor":
        try:
            row["tensor"] = base64.b64decode(value.get("value", ""), validate=False)
        except (binascii.Error, TypeError):
            raise invalid(f"{where}.tensor.value must be base64 bytes.") from None
    else:
        row["blobs"] = [str(b.get("id", "")) for b in value.get("values", []) if isinstance(b, dict)]
    return row


def _run_points(db: TensorboardDB, run_keys: dict, data: object, where: str) -> list[dict]:
    if not isinstance(data, list):
        raise invalid(f"{where}.time_series_data must be a list.")
    series = {s["id"]: s for s in db.list("timeSeries", run_keys)}
    rows: list[dict] = []
    for i, item in enumerate(data):
        at = f"{where}.time_series_data[{i}]"
        if not isinstance(item, dict):
            raise invalid(f"{at} must be a TimeSeriesData object.")
        sid = msg.get(item, "tensorboardTimeSeriesId")
        if sid not in series:
            raise ApiError("NOT_FOUND", f"TensorboardTimeSeries {sid!r} is not a time series of run "
                           f"{run_keys['run_id']}: create it first.")
        value_type = series[sid]["value_type"]
        sent = msg.get(item, "valueType")
        if sent is not None and metadata_nodes.enum_name(sent, VALUE_TYPES, f"{at}.value_type") != value_type:
            raise invalid(f"{at}.value_type does not match time series {sid}, which is {value_type}.")
        values = msg.get(item, "values", []) or []
        rows += [_point(sid, value_type, p, f"{at}.values[{j}]") for j, p in enumerate(values)]
        if len(rows) > MAX_POINTS_PER_WRITE:
            raise invalid(f"A write holds more than {MAX_POINTS_PER_WRITE} points: split it.")
    return rows


def write_run(db: TensorboardDB, route: TrackingRoute, body: dict) -> dict:
    msg.check_message(body, "WriteTensorboardRunDataRequest")
    keys = keys_of(route)
    db.get("runs", keys)
    run_keys = {"tensorboard_id": keys["tensorboard_id"], "experiment_id": keys["experiment_id"], "run_id": keys["id"]}
    db.add_points(_run_points(db, run_keys, msg.get(body, "timeSeriesData", []), "request"))
    return {}


def write_experiment(db: TensorboardDB, route: TrackingRoute, body: dict) -> dict:
    msg.check_message(body, "WriteTensorboardExperimentDataRequest")
    db.get("experiments", keys_of(route))
    rows: list[dict] = []
    for i, req in enumerate(msg.get(body, "writeRunDataRequests", []) or []):
        run_route = parse_tracking_path(str(msg.get(req, "tensorboardRun", "")))
        if run_route.name(2) != route.name() or run_route.leaf != "runs" or run_route.leaf_id is None:
            raise invalid(f"write_run_data_requests[{i}].tensorboard_run must name a run of {route.name()}.")
        keys = keys_of(run_route)
        db.get("runs", keys)
        run_keys = {"tensorboard_id": keys["tensorboard_id"], "experiment_id": keys["experiment_id"],
                    "run_id": keys["id"]}
        rows += _run_points(db, run_keys, msg.get(req, "timeSeriesData", []), f"write_run_data_requests[{i}]")
    if len(rows) > MAX_POINTS_PER_WRITE:
        raise invalid(f"A write holds more than {MAX_POINTS_PER_WRITE} points: split it.")
    db.add_points(rows)
    return {}


def _render_point(p: dict) -> dict:
    out: dict = {"wallTime": rfc3339(p["wall_time"]), "step": str(p["step"])}
    if p["scalar"] is not None:
        out["scalar"] = {"value": p["scalar"]}
    elif p["tensor"] is not None:
        out["tensor"] = {"value": base64.b64encode(p["tensor"]).decode()}
    else:
        out["blobs"] = {"values": [{"id": b} for b in p["blobs"] or []]}
    return out


def _series_data(row: dict, points: list[dict]) -> dict:
    return {"tensorboardTimeSeriesId": row["id"], "valueType": row["value_type"],
            "values": [_render_point(p) for p in points]}


def _limit(row: dict, asked: int | None) -> int:
    """At most this many points of a series are read (Vertex's defaults per value type)."""
    return asked or DEFAULT_READ_POINTS[row["value_type"]]


def _max_points(query: Mapping[str, str]) -> int | None:
    raw = query.get("maxDataPoints") or query.get("max_data_points")
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise invalid(f"Invalid max_data_points {raw!r}: a whole number.") from None
    if value < 0:
        raise invalid("max_data_points cannot be negative.")
    return value or None


def read(db: TensorboardDB, route: TrackingRoute, query: Mapping[str, str]) -> dict:
    row = db.get("timeSeries", keys_of(route))
    points = db.points([row["id"]], _limit(row, _max_points(query)))[row["id"]]
    return {"timeSeriesData": _series_data(row, points)}


def batch_read(db: TensorboardDB, route: TrackingRoute, series_names: list[str]) -> dict:
    """Several time series of one TensorBoard, at most ``MAX_BATCH_READ``, each sampled as ``read``."""
    if not series_names:
        raise invalid("batchRead takes time_series: the names of the time series to read.")
    if len(series_names) > MAX_BATCH_READ:
        raise invalid(f"batchRead reads at most {MAX_BATCH_READ} time series at once, not {len(series_names)}.")
    keys = []
    for name in series_names:
        ts_route = parse_tracking_path(name)
        if ts_route.leaf != "timeSeries" or ts_route.leaf_id is None or ts_route.name(1) != route.name():
            raise invalid(f"time_series {name!r} is not a time series of {route.name()}.")
        keys.append(keys_of(ts_route))
    rows = db.get_many("timeSeries", keys)
    out = []
    for kind in {r["value_type"] for r in rows}:  # one query per value type: each has its default limit
        of_kind = [r for r in rows if r["value_type"] == kind]
        points = db.points([r["id"] for r in of_kind], _limit(of_kind[0], None))
        out += [(r, points[r["id"]]) for r in of_kind]
    order = {r["id"]: i for i, r in enumerate(rows)}
    return {"timeSeriesData": [_series_data(r, pts) for r, pts in sorted(out, key=lambda x: order[x[0]["id"]])]}


def export(db: TensorboardDB, route: TrackingRoute, body: dict) -> dict:
    """Every point of a time series (no sampling), in pages; ``filter`` takes ``step`` and ``wall_time``
    comparisons is not supported: refused rather than ignored."""
    msg.check_message(body, "ExportTensorboardTimeSeriesDataRequest")
    if msg.get(body, "filter"):
        raise invalid("exportTensorboardTimeSeries: modelyard takes no filter here; read every point and select.")
    row = db.get("timeSeries", keys_of(route))
    points = db.points([row["id"]])[row["id"]]
    order_by = msg.get(body, "orderBy")
    if order_by:
        points = tracking_pages.order(points, order_by, {"step": "step", "wall_time": "wall_time"})
    query = {k: str(v) for k, v in (("pageSize", msg.get(body, "pageSize")), ("pageToken", msg.get(body, "pageToken")),
                                    ("orderBy", order_by)) if v}
    chunk, token = tracking_pages.page(points, query, route.name())
    out: dict = {"timeSeriesDataPoints": [_render_point(p) for p in chunk]}
    if token:
        out["nextPageToken"] = token
    return out


def batch_create(db: TensorboardDB, route: TrackingRoute, body: dict) -> dict:
    """``runs:batchCreate`` (on an experiment's runs) or ``experiments/{e}:batchCreate`` (time series)."""
    if route.leaf == "runs":
        msg.check_message(body, "BatchCreateTensorboardRunsRequest")
        out = []
        for i, req in enumerate(msg.get(body, "requests", []) or []):
            rid = msg.get(req, "tensorboardRunId")
            if not isinstance(rid, str) or not CHOSEN_ID.match(rid):
                raise invalid(f"requests[{i}].tensorboard_run_id is required: [a-z0-9][a-z0-9-]{{0,127}}.")
            rendered, _ = create(db, route, msg.get(req, "tensorboardRun", {}) or {}, {"tensorboardRunId": rid})
            out.append(rendered)
        return {"tensorboardRuns": out}
    msg.check_message(body, "BatchCreateTensorboardTimeSeriesRequest")
    out = []
    for i, req in enumerate(msg.get(body, "requests", []) or []):
        parent = parse_tracking_path(str(msg.get(req, "parent", "")) + "/timeSeries")
        if parent.name(2) != route.name() or len(parent.ids) != 4:
            raise invalid(f"requests[{i}].parent must name a run of {route.name()}.")
        chosen = msg.get(req, "tensorboardTimeSeriesId")
        rendered, _ = create(db, parent, msg.get(req, "tensorboardTimeSeries", {}) or {},
                             {"tensorboardTimeSeriesId": chosen} if chosen else {})
        out.append(rendered)
    return {"tensorboardTimeSeries": out}
