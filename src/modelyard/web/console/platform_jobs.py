"""The platform's jobs for the console: batch prediction, custom and tuning jobs, and Vizier studies,
read through the platform's own Vertex AI REST API, summarised as progress and curves (a study as a
tuning job is: its trials' objective and the best so far; a tuning job's own study is shown once, as
the job).

Jobs are read through REST (not the store) so the console shows exactly what a client of
``GET .../batchPredictionJobs`` sees, whatever keeps them; a collection the platform does not
serve (an error answer, or no answer) shows nothing.
"""
from __future__ import annotations

import asyncio
import logging

import aiohttp

log = logging.getLogger(__name__)

# REST collection -> (the list answer's key, what the console calls it)
KINDS = {
    "batchPredictionJobs": ("batchPredictionJobs", "batch prediction"),
    "customJobs": ("customJobs", "custom job"),
    "hyperparameterTuningJobs": ("hyperparameterTuningJobs", "tuning"),
    "studies": ("studies", "Vizier study"),
}
# google.cloud.aiplatform.v1.JobState values a job can still be cancelled in.
CANCELLABLE = {"JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_PAUSED",
               "JOB_STATE_UPDATING"}
_TRIAL_DONE = {"SUCCEEDED", "INFEASIBLE", "STOPPED"}
_PAGE_SIZE = 100
_LEARNING_TRIALS = 50  # learning curves drawn: the latest trials' (the page stays small)
_TIMEOUT = aiohttp.ClientTimeout(total=3)


def _int(value) -> int:
    """int64 fields arrive as JSON strings (proto3 JSON mapping), sometimes as numbers."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _batch_progress(job: dict) -> dict:
    stats = job.get("completionStats") or {}
    ok, failed, waiting = (_int(stats.get(k)) for k in ("successfulCount", "failedCount", "incompleteCount"))
    done = ok + failed
    total = done + waiting if stats else None
    text = f"{ok} predicted, {failed} failed" + (f", {waiting} to go" if waiting else "")
    return {"done": done, "total": total, "text": text if stats else "no rows counted yet"}


def _objective(trial: dict, metric_id: str | None) -> float | None:
    metrics = (trial.get("finalMeasurement") or {}).get("metrics") or []
    for m in metrics:
        if metric_id is None or m.get("metricId") == metric_id:
            try:
                return float(m.get("value"))
            except (TypeError, ValueError):
                return None
    return None


def _learning_curve(trial: dict, metric_id: str | None) -> list[float]:
    """A trial's intermediate measurements of the objective, in step order (Optuna's intermediate values)."""
    points = []
    for m in trial.get("measurements") or []:
        for metric in m.get("metrics") or []:
            if metric_id is None or metric.get("metricId") == metric_id:
                try:
                    points.append((_int(m.get("stepCount")), float(metric.get("value"))))
                except (TypeError, ValueError):
                    pass
                break
    return [v for _, v in sorted(points)]


def _tuning(job: dict) -> tuple[dict, dict]:
    """(progress, curve): trials done of maxTrialCount; each trial's objective and the best so far, and
    the latest trials' learning curves."""
    spec_metrics = (job.get("studySpec") or {}).get("metrics") or []
    metric_id = spec_metrics[0].get("metricId") if spec_metrics else None
    maximize = not spec_metrics or spec_metrics[0].get("goal") != "MINIMIZE"
    trials = sorted(job.get("trials") or [], key=lambda t: _int(t.get("id")))
    done = sum(1 for t in trials if t.get("state") in _TRIAL_DONE)
    total = _int(job.get("maxTrialCount")) or None
    values, best, current = [], [], None
    for t in trials:
        v = _objective(t, metric_id)
        if v is None:
            continue
        current = v if current is None else (max if maximize else min)(current, v)
        values.append(v)
        best.append(current)
    progress = {"done": done, "total": total, "text": f"{done} of {total or '?'} trials done"
                + (f", best {metric_id or 'objective'} {current:.4g}" if current is not None else "")}
    learning = [c for c in (_learning_curve(t, metric_id) for t in trials[-_LEARNING_TRIALS:]) if len(c) > 1]
    return progress, {"metric": metric_id or "objective", "goal": "maximize" if maximize else "minimize",
                      "values": values, "best": best, "learning": learning}


def summarize(kind: str, job: dict) -> dict:
    """One job as the console shows it: state, progress, a curve for tuning, whether it can be cancelled."""
    state = job.get("state") or "JOB_STATE_UNSPECIFIED"
    if kind == "batchPredictionJobs":
        progress, curve = _batch_progress(job), None
    elif kind in ("hyperparameterTuningJobs", "studies"):
        progress, curve = _tuning(job)
    else:
        progress, curve = {"done": None, "total": None, "text": state.removeprefix("JOB_STATE_").lower()}, None
    return {"kind": kind, "kindLabel": KINDS[kind][1], "name": job.get("name", ""),
            "displayName": job.get("displayName", ""), "state": state, "progress": progress, "curve": curve,
            "error": (job.get("error") or {}).get("message", ""), "createTime": job.get("createTime", ""),
            "cancellable": state in CANCELLABLE}


async def _list(session: aiohttp.ClientSession, base: str, parent: str, kind: str, headers: dict) -> list[dict]:
    try:
        async with session.get(f"{base}/v1/{parent}/{kind}", params={"pageSize": str(_PAGE_SIZE)},
                               headers=headers) as r:
            if r.status != 200:
                return []  # this platform has no such collection (NOT_FOUND) or cannot list it now
            body = await r.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        log.debug("console: listing %s in %s failed: %s", kind, parent, exc)
        return []
    found = [job for job in body.get(KINDS[kind][0]) or [] if isinstance(job, dict)]
    if kind == "studies":  # a study's trials are a collection of their own
        trials = await asyncio.gather(*(_trials(session, base, study.get("name", ""), headers) for study in found))
        found = [{**study, "trials": t} for study, t in zip(found, trials)]
    return [summarize(kind, job) for job in found]


async def _trials(session: aiohttp.ClientSession, base: str, study: str, headers: dict) -> list[dict]:
    try:
        async with session.get(f"{base}/v1/{study}/trials", headers=headers) as r:
            if r.status != 200:
                return []
            return (await r.json(content_type=None)).get("trials") or []
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        log.debug("console: listing the trials of %s failed: %s", study, exc)
        return []


async def fetch(session: aiohttp.ClientSession, base: str, parents: list[str], token: str | None) -> list[dict]:
    """Every job of every kind in ``parents``, newest first, from the REST API at ``base``."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    lists = await asyncio.gather(*(_list(session, base, parent, kind, headers)
                                   for parent in parents for kind in KINDS))
    jobs = [job for found in lists for job in found]
    tuning_ids = {j["name"].rsplit("/", 1)[-1] for j in jobs if j["kind"] == "hyperparameterTuningJobs"}
    jobs = [j for j in jobs if j["kind"] != "studies" or j["name"].rsplit("/", 1)[-1] not in tuning_ids]
    jobs.sort(key=lambda j: j["createTime"], reverse=True)
    return jobs


def new_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=_TIMEOUT)
