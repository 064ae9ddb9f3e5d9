"""Vertex AI Vizier's trials: create / get / list / delete, ``suggest`` (a long-running operation),
``addTrialMeasurement``, ``complete``, ``stop``, ``checkTrialEarlyStoppingState`` (an operation)
and ``listOptimalTrials``.

Suggestions come from the tuning engine (``modelyard.tuning.designers``), fed every trial of the
study from the store. A client (``clientId``) first gets back its own trials still ACTIVE, then
the REQUESTED trials a user created, then new ones, as Vertex does: a worker that restarts is
handed the trial it was working on. One suggestion at a time per study (a lock per study in this
process), so two calls of one client never both make new trials.

Trial states: REQUESTED (created without a result) -> ACTIVE (suggested to a client) -> STOPPING
(``stop``, or an early-stopping check that said stop) -> SUCCEEDED | INFEASIBLE (``complete``).
"""
from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from modelyard.platform.api.errors import ApiError, invalid
from modelyard.platform.api.timefmt import rfc3339
from modelyard.platform.resources.operations import typed
from modelyard.platform.state import vizier_schema as db
from modelyard.tuning import designers, stopping
from modelyard.tuning.spec import Metric, Param, SpecError, parse_search

OPEN = ("REQUESTED", "ACTIVE", "STOPPING")
MAX_SUGGESTIONS = 1000  # one call's suggestionCount
_locks: dict[str, asyncio.Lock] = {}


def engine_spec(spec: dict) -> tuple[list[Metric], list[Param], str, str]:
    """The tuning engine's reading of a stored StudySpec; INVALID_ARGUMENT with the parser's message."""
    try:
        return parse_search(spec)
    except SpecError as exc:
        raise invalid(f"Study.study_spec: {exc}") from None


def _name(study: dict, trial_id: int) -> str:
    return f"{study['parent']}/studies/{study['id']}/trials/{trial_id}"


def render(study: dict, row: dict) -> dict:
    out = {"name": _name(study, row["id"]), "id": str(row["id"]), "state": row["state"], **row["doc"]}
    if row["client_id"]:
        out["clientId"] = row["client_id"]
    return out


def _number(value: Any, what: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise invalid(f"{what}: {value!r} is not a number.") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(f"{what}: expected a finite number, got {value!r}.")
    return float(value)


def _measurement(raw: Any, what: str) -> dict:
    """A Measurement from a request, checked: ``{stepCount, metrics: [{metricId, value}]}``."""
    if not isinstance(raw, dict):
        raise invalid(f"{what} must be a Measurement object.")
    extra = set(raw) - {"stepCount", "step_count", "metrics", "elapsedDuration", "elapsed_duration"}
    if extra:
        raise invalid(f'Invalid JSON payload received. Unknown name "{sorted(extra)[0]}" at \'{what}\': '
                      "Cannot find field.")
    metrics = []
    for i, metric in enumerate(raw.get("metrics") or []):
        if not isinstance(metric, dict) or not (metric.get("metricId") or metric.get("metric_id")):
            raise invalid(f"{what}.metrics[{i}]: give metricId and value.")
        mid = metric.get("metricId") or metric.get("metric_id")
        metrics.append({"metricId": mid, "value": _number(metric.get("value", 0.0), f"{what}.metrics[{i}].value")})
    step = raw.get("stepCount", raw.get("step_count", 0))
    try:
        step = int(step)
    except (TypeError, ValueError):
        raise invalid(f"{what}.step_count: {step!r} is not an integer.") from None
    out = {"stepCount": str(step), "metrics": metrics}
    elapsed = raw.get("elapsedDuration", raw.get("elapsed_duration"))
    if elapsed is not None:
        out["elapsedDuration"] = elapsed
    return out


def _value(measurement: dict | None, metric_id: str) -> float | None:
    for metric in (measurement or {}).get("metrics", []):
        if metric["metricId"] == metric_id:
            return float(metric["value"])
    return None


def _observed(metrics: list[Metric], row: dict) -> designers.Observed:
    params = {p["parameterId"]: p["value"] for p in row["doc"].get("parameters", [])}
    if row["state"] in OPEN:
        return designers.Observed(params)
    values = [_value(row["doc"].get("finalMeasurement"), m.id) for m in metrics]
    if row["state"] == "INFEASIBLE" or any(v is None for v in values):
        return designers.Observed(params, infeasible=True)
    return designers.Observed(params, values)


def _cast(params: list[Param], values: dict[str, Any]) -> list[dict]:
    """Suggested values as Trial.Parameter JSON (integers as integers, in the spec's order)."""
    kinds = {q.id: q.kind for p in params for q in p.walk()}
    out = []
    for pid, value in values.items():
        if kinds.get(pid) == "INTEGER":
            value = int(value)
        out.append({"parameterId": pid, "value": value})
    return out


def _parameters(params: list[Param], raw: Any) -> list[dict]:
    """A created trial's parameters, checked against the study's space."""
    if not isinstance(raw, list):
        raise invalid("Trial.parameters must be a list of {parameterId, value}.")
    known = {q.id: q for p in params for q in p.walk()}
    out = []
    for i, item in enumerate(raw):
        pid = item.get("parameterId", item.get("parameter_id")) if isinstance(item, dict) else None
        if pid not in known:
            raise invalid(f"Trial.parameters[{i}]: {pid!r} is not a parameter of the study "
                          f"({', '.join(sorted(known))}).")
        param, value = known[pid], item.get("value")
        if param.kind in ("DOUBLE", "INTEGER"):
            value = _number(value, f"Trial.parameters[{i}].value")
            if not param.min <= value <= param.max:
                raise invalid(f"Trial.parameters[{i}]: {pid} = {value} is outside [{param.min}, {param.max}].")
            value = int(value) if param.kind == "INTEGER" else value
        elif value not in param.values:
            raise invalid(f"Trial.parameters[{i}]: {pid} = {value!r} is not one of {param.values}.")
        out.append({"parameterId": pid, "value": value})
    return out


def create(p, study: dict, body: dict) -> dict:
    """A user's trial: REQUESTED (suggested before new points), or SUCCEEDED with its finalMeasurement."""
    metrics, params, _, _ = engine_spec(study["spec"])
    doc: dict[str, Any] = {"parameters": _parameters(params, body.get("parameters", [])),
                           "startTime": rfc3339(time.time())}
    state = "REQUESTED"
    final = body.get("finalMeasurement", body.get("final_measurement"))
    if final is not None:
        doc["finalMeasurement"] = _measurement(final, "trial.final_measurement")
        doc["endTime"] = doc["startTime"]
        state = "SUCCEEDED"
    measurements = body.get("measurements") or []
    doc["measurements"] = [_measurement(m, f"trial.measurements[{i}]") for i, m in enumerate(measurements)]
    (row,) = db.add_trials(p.store.engine, study["id"], [{"state": state, "client_id": "", "doc": doc}])
    return render(study, row)


def _seed(study: dict, count: int) -> int:
    return (int(study["id"]) + 7919 * count) % (2**31)


def _new_points(study: dict, rows: list[dict], count: int) -> list[dict]:
    metrics, params, algorithm, _ = engine_spec(study["spec"])
    history = [_observed(metrics, r) for r in rows]
    points = designers.suggest(params, [m.goal for m in metrics], algorithm, history, count,
                               seed=_seed(study, len(rows)))
    return [{"parameters": _cast(params, point)} for point in points]


def suggest(p, study: dict, body: dict) -> dict:
    """``trials:suggest``: an operation whose response is a SuggestTrialsResponse."""
    count = body.get("suggestionCount", body.get("suggestion_count"))
    try:
        count = int(count)
    except (TypeError, ValueError):
        raise invalid(f"SuggestTrialsRequest.suggestion_count must be a number, got {count!r}.") from None
    if not 1 <= count <= MAX_SUGGESTIONS:
        raise invalid(f"SuggestTrialsRequest.suggestion_count must be between 1 and {MAX_SUGGESTIONS}, got {count}.")
    client = body.get("clientId", body.get("client_id"))
    if not isinstance(client, str) or not client:
        raise invalid("SuggestTrialsRequest.client_id is required.")
    engine = p.store.engine
    started = time.time()

    async def work() -> dict:
        lock = _locks.setdefault(study["id"], asyncio.Lock())
        async with lock:
            rows = await asyncio.to_thread(db.list_trials, engine, study["id"])
            mine = [r for r in rows if r["client_id"] == client and r["state"] == "ACTIVE"][:count]
            requested = [r for r in rows if r["state"] == "REQUESTED"][:count - len(mine)]
            for r in requested:
                db.update_trial(engine, study["id"], r["id"], state="ACTIVE", client_id=client)
                r.update(state="ACTIVE", client_id=client)
            wanted = count - len(mine) - len(requested)
            fresh: list[dict] = []
            if wanted:
                points = await asyncio.to_thread(_new_points, study, rows, wanted)
                now = rfc3339(time.time())
                fresh = db.add_trials(engine, study["id"], [
                    {"state": "ACTIVE", "client_id": client, "doc": {**point, "startTime": now, "measurements": []}}
                    for point in points])
            handed = mine + requested + fresh
            state = study["state"]
            if not handed and wanted:  # a grid with every point handed out
                state = "COMPLETED"
                db.set_study_state(engine, study["id"], state, "every grid point has been suggested")
            return typed("SuggestTrialsResponse", {
                "trials": [render(study, r) for r in handed], "studyState": state,
                "startTime": rfc3339(started), "endTime": rfc3339(time.time())})

    return p.ops.start(study["parent"], "studies", study["id"], "SuggestTrialsMetadata", work)


def _open_trial(p, study: dict, trial_id: int, action: str) -> dict:
    row = db.get_trial(p.store.engine, study["id"], trial_id)
    if row["state"] not in OPEN:
        raise ApiError("FAILED_PRECONDITION", f"Trial {_name(study, trial_id)} is {row['state']}: "
                       f"{action} needs a trial that is not completed.")
    return row


def add_measurement(p, study: dict, trial_id: int, body: dict) -> dict:
    row = _open_trial(p, study, trial_id, "addTrialMeasurement")
    if "measurement" not in body:
        raise invalid("AddTrialMeasurementRequest.measurement is required.")
    doc = dict(row["doc"])
    doc["measurements"] = [*doc.get("measurements", []), _measurement(body["measurement"], "measurement")]
    db.update_trial(p.store.engine, study["id"], trial_id, doc=doc)
    return render(study, {**row, "doc": doc})


def complete(p, study: dict, trial_id: int, body: dict) -> dict:
    row = _open_trial(p, study, trial_id, "complete")
    metrics, _, _, selection = engine_spec(study["spec"])
    doc = dict(row["doc"])
    final = body.get("finalMeasurement", body.get("final_measurement"))
    infeasible = bool(body.get("trialInfeasible", body.get("trial_infeasible", False)))
    if infeasible:
        state = "INFEASIBLE"
        doc["infeasibleReason"] = str(body.get("infeasibleReason", body.get("infeasible_reason")) or "")
    else:
        state = "SUCCEEDED"
    if final is not None:
        doc["finalMeasurement"] = _measurement(final, "final_measurement")
    elif not infeasible:
        chosen = _select(doc.get("measurements", []), metrics[0], selection)
        if chosen is None:
            raise invalid(f"Trial {_name(study, trial_id)} has no measurement of {metrics[0].id!r}: give "
                          "final_measurement, or trial_infeasible with an infeasible_reason.")
        doc["finalMeasurement"] = chosen
    doc["endTime"] = rfc3339(time.time())
    db.update_trial(p.store.engine, study["id"], trial_id, state=state, doc=doc)
    return render(study, {**row, "state": state, "doc": doc})


def _select(measurements: list[dict], metric: Metric, selection: str) -> dict | None:
    """The intermediate measurement that becomes final (StudySpec.measurement_selection_type)."""
    having = [m for m in measurements if _value(m, metric.id) is not None]
    if not having:
        return None
    if selection == "BEST_MEASUREMENT":
        pick = max if metric.goal == "MAXIMIZE" else min
        return pick(having, key=lambda m: _value(m, metric.id))
    return having[-1]


def stop(p, study: dict, trial_id: int, body: dict) -> dict:
    row = _open_trial(p, study, trial_id, "stop")
    db.update_trial(p.store.engine, study["id"], trial_id, state="STOPPING")
    return render(study, {**row, "state": "STOPPING"})


def _curve(row: dict, metric_id: str) -> dict[int, float]:
    out = {}
    for m in row["doc"].get("measurements", []):
        value = _value(m, metric_id)
        if value is not None:
            out[int(m["stepCount"])] = value
    return out


def should_stop(study: dict, row: dict, rows: list[dict]) -> bool:
    """The study's early-stopping rule on this trial (a STOPPING trial is always told to stop)."""
    if row["state"] == "STOPPING":
        return True
    if row["state"] not in OPEN:
        return False
    metrics, _, _, _ = engine_spec(study["spec"])
    if len(metrics) != 1:
        return False  # Vertex's stopping rules are for one metric
    metric, spec = metrics[0], study["spec"]
    maximize = metric.goal == "MAXIMIZE"
    done = [r for r in rows if r["state"] == "SUCCEEDED" and r["id"] != row["id"]]
    curve = _curve(row, metric.id)
    if "medianAutomatedStoppingSpec" in spec or "median_automated_stopping_spec" in spec:
        return stopping.median_should_stop(curve, [_curve(r, metric.id) for r in done], maximize)
    if "decayCurveStoppingSpec" in spec or "decay_curve_stopping_spec" in spec:
        finished = [(_curve(r, metric.id), _value(r["doc"].get("finalMeasurement"), metric.id)) for r in done]
        return stopping.decay_curve_should_stop(curve, [(c, f) for c, f in finished if f is not None], maximize)
    return False


def check_early_stopping(p, study: dict, trial_id: int, body: dict) -> dict:
    """``checkTrialEarlyStoppingState``: an operation, done when answered; a trial told to stop is STOPPING."""
    engine = p.store.engine
    rows = db.list_trials(engine, study["id"])
    row = next((r for r in rows if r["id"] == trial_id), None)
    if row is None:
        raise ApiError("NOT_FOUND", f"Trial {_name(study, trial_id)} is not found.")
    stop_it = should_stop(study, row, rows)
    if stop_it and row["state"] in ("REQUESTED", "ACTIVE"):
        db.update_trial(engine, study["id"], trial_id, state="STOPPING")
    return p.ops.done(study["parent"], f"studies/{study['id']}/trials", str(trial_id),
                      "CheckTrialEarlyStoppingStateMetatdata",  # sic: the proto's own spelling
                      typed("CheckTrialEarlyStoppingStateResponse", {"shouldStop": stop_it}))


def optimal(p, study: dict) -> dict:
    """``listOptimalTrials``: the best feasible completed trials (one metric), or the Pareto front."""
    metrics, _, _, _ = engine_spec(study["spec"])
    rows = db.list_trials(p.store.engine, study["id"])
    scored = []
    for r in rows:
        if r["state"] != "SUCCEEDED":
            continue
        values = [_value(r["doc"].get("finalMeasurement"), m.id) for m in metrics]
        if all(v is not None for v in values):
            # Signed so that larger is better for every metric.
            scored.append((r, [v if m.goal == "MAXIMIZE" else -v for m, v in zip(metrics, values)]))
    front = [r for r, v in scored
             if not any(all(a >= b for a, b in zip(w, v)) and any(a > b for a, b in zip(w, v)) for _, w in scored)]
    return {"optimalTrials": [render(study, r) for r in front]}


# verb -> (its function, the request message its body is)
VERBS = {"addTrialMeasurement": (add_measurement, "AddTrialMeasurementRequest"),
         "complete": (complete, "CompleteTrialRequest"), "stop": (stop, "StopTrialRequest"),
         "checkTrialEarlyStoppingState": (check_early_stopping, "CheckTrialEarlyStoppingStateRequest")}
