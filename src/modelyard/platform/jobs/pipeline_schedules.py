"""Vertex AI's ``schedules`` of pipeline runs (the stock SDK's ``PipelineJob.create_schedule`` and
``PipelineJobSchedule``): create, get, list, patch, delete, pause and resume, and the scheduler that
starts each run at its cron time through the same create path as ``POST .../pipelineJobs``.

A schedule holds a ``createPipelineJobRequest`` (checked at create as a run's would be), a ``cron``
(``cron.parse``), an optional start and end time, ``maxRunCount``, ``maxConcurrentRunCount`` (and
``maxConcurrentActiveRunCount``) and ``allowQueueing``. At each of its times the scheduler starts a run
named ``{schedule id}-{YYYYMMDDHHMMSS}`` (the time, UTC), with ``scheduleName`` set and the label
``modelyard-schedule``: the platform's list filter ``schedule_name=...`` (the SDK's ``list_jobs``) reads
it. A time whose run would exceed the concurrency limit is skipped, or, with ``allowQueueing``, started
once a run ends. A schedule is COMPLETED when it has started ``maxRunCount`` runs or its next time is
past ``endTime``; pause stops it starting runs (those started go on); resume starts again from the next
time after now, or with ``catchUp`` runs every time missed first.

Everything is in the store (``state/schedule_schema``), so a restarted platform's scheduler carries
on; a time missed while no platform ran is run once when it comes back (every one with ``catchUp``).
A run is started for one time once: its id is the time's, and the next time is a compare-and-set.
Only the leading platform of a store schedules.
"""
from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone
from typing import Awaitable, Callable

from modelyard.platform.api import list_filter, names
from modelyard.platform.api.errors import ApiError, invalid, not_found
from modelyard.platform.api.names import Route
from modelyard.platform.api.timefmt import rfc3339
from modelyard.platform.jobs import cron as cronlib
from modelyard.platform.state import schedule_schema as db

log = logging.getLogger(__name__)
COLLECTION = "schedules"
LABEL = "modelyard-schedule"  # on each run a schedule starts: the list filter schedule_name reads it
ACTIVE, PAUSED, COMPLETED = "ACTIVE", "PAUSED", "COMPLETED"
FIELDS = {"display_name": list_filter.Field(list_filter.STRING),
          "state": list_filter.Field(list_filter.ENUM, {s: s for s in (ACTIVE, PAUSED, COMPLETED)}),
          "create_time": list_filter.Field(list_filter.TIME), "update_time": list_filter.Field(list_filter.TIME),
          "next_run_time": list_filter.Field(list_filter.TIME)}
ORDERABLE = ("display_name", "create_time", "update_time", "next_run_time")
# What a client may set (camelCase, as the body and an update mask name them).
SETTABLE = ("displayName", "cron", "startTime", "endTime", "maxRunCount", "maxConcurrentRunCount",
            "maxConcurrentActiveRunCount", "allowQueueing", "createPipelineJobRequest")
TICK_SECONDS = 1.0

# validate(request body of a pipeline job, its route) -> None, raising ApiError: a run's checks at create.
Validate = Callable[[Route, dict], Awaitable[None]]
# start_run(parent, run id, pipelineJob body, schedule name) -> the run's name; ALREADY_EXISTS if made before.
StartRun = Callable[[str, str, dict, str], Awaitable[str]]
# active_runs(parent, schedule id) -> how many of its runs have not ended.
ActiveRuns = Callable[[str, str], Awaitable[int]]


def schedule_name(row: dict) -> str:
    return f"{row['parent']}/{COLLECTION}/{row['id']}"


def _int(value, field: str, minimum: int) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)  # int64 arrives as a JSON string (proto3 JSON mapping)
    except (TypeError, ValueError):
        raise invalid(f"Schedule.{field} must be an integer, got {value!r}.") from None
    if number < minimum:
        raise invalid(f"Schedule.{field} must be at least {minimum}, got {number}.")
    return number


def _time(value, field: str) -> float | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise invalid(f"Schedule.{field} must be an RFC 3339 timestamp, got {value!r}.")
    return list_filter.parse_time(value, field)


def _checked(parent: str, spec: dict) -> dict:
    """The schedule's settable fields, checked (INVALID_ARGUMENT naming the field), as stored."""
    name = spec.get("displayName")
    if not isinstance(name, str) or not name.strip() or len(name) > 128:
        raise invalid("Schedule.display_name is required: 1 to 128 characters.")
    cronlib.parse(spec.get("cron"))
    if spec.get("createNotebookExecutionJobRequest"):
        raise invalid("Schedule.create_notebook_execution_job_request is not supported: modelyard schedules "
                      "pipeline runs (create_pipeline_job_request).")
    request = spec.get("createPipelineJobRequest")
    if not isinstance(request, dict) or not isinstance(request.get("pipelineJob"), dict):
        raise invalid("Schedule.create_pipeline_job_request.pipeline_job is required: the run to start.")
    if request.get("parent") not in (None, "", parent):
        raise invalid(f"Schedule.create_pipeline_job_request.parent {request['parent']!r} must be the "
                      f"schedule's own {parent!r}.")
    if request.get("pipelineJobId"):
        raise invalid("Schedule.create_pipeline_job_request.pipeline_job_id cannot be set: each run the "
                      "schedule starts gets an id of its own.")
    if _int(spec.get("maxConcurrentRunCount"), "max_concurrent_run_count", 1) is None:
        raise invalid("Schedule.max_concurrent_run_count is required: how many runs may be started at once.")
    _int(spec.get("maxRunCount"), "max_run_count", 1)
    _int(spec.get("maxConcurrentActiveRunCount"), "max_concurrent_active_run_count", 1)
    start, end = _time(spec.get("startTime"), "start_time"), _time(spec.get("endTime"), "end_time")
    if start is not None and end is not None and end <= start:
        raise invalid("Schedule.end_time must be after start_time.")
    if not isinstance(spec.get("allowQueueing", False), bool):
        raise invalid("Schedule.allow_queueing must be a boolean.")
    return {k: spec[k] for k in SETTABLE if k in spec and k != "displayName"} | {
        "createPipelineJobRequest": {**request, "parent": parent}}


def first_time(spec: dict, created: float, after: float | None = None) -> float | None:
    """The schedule's first time at or after its start (its creation when none), and after ``after`` (now:
    a start in the past does not make the times before now run, as on Vertex)."""
    start = _time(spec.get("startTime"), "start_time") or created
    base = max(start - 1e-6, after if after is not None else float("-inf"))
    return _bounded(spec, cronlib.parse(spec["cron"]).next_after(base))


def _bounded(spec: dict, when: float | None) -> float | None:
    end = _time(spec.get("endTime"), "end_time")
    return None if when is None or (end is not None and when > end) else when


def render(row: dict) -> dict:
    spec = row["spec"]
    out = {"name": schedule_name(row), "displayName": row["display_name"], **spec,
           "startTime": spec.get("startTime") or rfc3339(row["created"]),
           "startedRunCount": str(row["started_run_count"]), "state": row["state"],
           "createTime": rfc3339(row["created"]), "updateTime": rfc3339(row["updated"]),
           "catchUp": bool(row["catch_up"]), "allowQueueing": bool(spec.get("allowQueueing", False))}
    for field in ("maxRunCount", "maxConcurrentRunCount", "maxConcurrentActiveRunCount"):
        if spec.get(field) is not None:
            out[field] = str(int(spec[field]))
    if row["next_run"] is not None and row["state"] == ACTIVE:
        out["nextRunTime"] = rfc3339(row["next_run"])
    if row["last_pause"] is not None:
        out["lastPauseTime"] = rfc3339(row["last_pause"])
    if row["last_resume"] is not None:
        out["lastResumeTime"] = rfc3339(row["last_resume"])
    if row["last_response"]:
        out["lastScheduledRunResponse"] = row["last_response"]
    return out


def _camel(path: str) -> str:
    head, *rest = path.strip().split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class Schedules:
    """The API's side: ``engine`` is the store's; ``validate`` checks a run's body as its create does."""

    def __init__(self, engine, validate: Validate, wake: Callable[[], None] = lambda: None) -> None:
        self.engine = engine
        self.validate = validate
        self.wake = wake

    def _get(self, route: Route) -> dict:
        row = db.get(self.engine, route.resource_id or "")
        if row is None or row["parent"] != route.parent:
            raise not_found("Schedule", f"{route.parent}/{COLLECTION}/{route.resource_id}")
        return row

    async def create(self, route: Route, body: dict, now: float | None = None) -> dict:
        spec = _checked(route.parent, body)
        await self.validate(route, spec["createPipelineJobRequest"]["pipelineJob"])
        created = time.time() if now is None else now
        row = {"id": names.new_id(), "parent": route.parent, "display_name": body["displayName"], "spec": spec,
               "state": ACTIVE, "started_run_count": 0, "next_run": first_time(spec, created, after=created),
               "catch_up": False,
               "last_pause": None, "last_resume": None, "last_response": None, "created": created,
               "updated": created}
        if row["next_run"] is None:  # its end is before its first time: nothing will ever run
            row["state"] = COMPLETED
        await asyncio.to_thread(db.add, self.engine, row)
        self.wake()
        return render(row)

    def get(self, route: Route) -> dict:
        return render(self._get(route))

    def list(self, route: Route, query) -> dict:
        request = list_filter.list_request(query, FIELDS, ORDERABLE, "schedule", f"{route.parent}/{COLLECTION}")
        rows, token = db.page(self.engine, route.parent, request)
        out: dict = {COLLECTION: [render(r) for r in rows]} if rows else {}
        if token:
            out["nextPageToken"] = token
        return out

    async def patch(self, route: Route, body: dict, mask: str | None, now: float | None = None) -> dict:
        row = self._get(route)
        fields = [_camel(f) for f in (mask or "").split(",") if f.strip()] or [k for k in SETTABLE if k in body]
        unknown = [f for f in fields if f not in SETTABLE]
        if unknown:
            raise invalid(f"update_mask: {', '.join(unknown)} cannot be updated; the fields that can: "
                          f"{', '.join(SETTABLE)}.")
        merged = {**row["spec"], "displayName": row["display_name"]}
        for f in fields:
            if body.get(f) is None:
                merged.pop(f, None)
            else:
                merged[f] = body[f]
        spec = _checked(route.parent, merged)
        if "createPipelineJobRequest" in fields:
            await self.validate(route, spec["createPipelineJobRequest"]["pipelineJob"])
        values: dict = {"spec": spec, "display_name": merged["displayName"]}
        if row["state"] == ACTIVE and {"cron", "startTime", "endTime"} & set(fields):
            values["next_run"] = first_time(spec, row["created"], after=time.time() if now is None else now)
            if values["next_run"] is None:
                values["state"] = COMPLETED
        db.change(self.engine, row["id"], **values)
        self.wake()
        return self.get(route)

    def delete(self, route: Route) -> None:
        db.remove(self.engine, self._get(route)["id"])  # the runs it started stay

    def pause(self, route: Route, now: float | None = None) -> dict:
        row = self._get(route)
        if row["state"] != ACTIVE or not db.change(self.engine, row["id"], {"state": ACTIVE}, state=PAUSED,
                                                   last_pause=time.time() if now is None else now):
            raise ApiError("FAILED_PRECONDITION", f"Schedule {schedule_name(row)} is {row['state']}: only an "
                           "ACTIVE schedule can be paused.")
        return {}

    def resume(self, route: Route, catch_up: bool = False, now: float | None = None) -> dict:
        row = self._get(route)
        now = time.time() if now is None else now
        if row["state"] != PAUSED:
            raise ApiError("FAILED_PRECONDITION", f"Schedule {schedule_name(row)} is {row['state']}: only a "
                           "PAUSED schedule can be resumed.")
        # catch_up: the times missed while paused run (from where it stopped); else the next time after now.
        nxt = row["next_run"] if catch_up and row["next_run"] is not None else first_time(row["spec"], row["created"],
                                                                                          after=now)
        state = ACTIVE if nxt is not None else COMPLETED
        if not db.change(self.engine, row["id"], {"state": PAUSED}, state=state, next_run=nxt, catch_up=catch_up,
                         last_resume=now):
            raise ApiError("ABORTED", f"Schedule {schedule_name(row)} changed meanwhile: try again.")
        self.wake()
        return {}


def run_id(row: dict, when: float) -> str:
    """The id of the run a schedule starts for its time ``when``: the same for the same time, so a run
    started before a crash is found, not made twice (pipeline job ids start with a letter)."""
    stamp = datetime.fromtimestamp(when, timezone.utc).strftime("%Y%m%d%H%M%S")
    return f"s{row['id']}-{stamp}"


class Scheduler:
    """Starts each due schedule's run (``tick``); the clock is given, so tests drive it."""

    def __init__(self, engine, start_run: StartRun, active_runs: ActiveRuns,
                 clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.start_run = start_run
        self.active_runs = active_runs
        self.clock = clock
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None  # run_forever's

    def wake(self) -> None:
        """Tick now rather than at the next second (a schedule changed); callable from any thread."""
        loop = self._loop
        if loop is None:
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            self._wake.set()
        else:
            loop.call_soon_threadsafe(self._wake.set)

    async def tick(self) -> int:
        """Start what is due now; returns how many runs were started."""
        now = self.clock()
        started = 0
        for row in await asyncio.to_thread(db.due, self.engine, now):
            try:
                started += await self._fire(row, now)
            except Exception:  # one schedule's failure never stops the others'
                log.exception("schedule %s: starting its run failed", schedule_name(row))
        return started

    async def _fire(self, row: dict, now: float) -> int:
        spec, when = row["spec"], row["next_run"]
        limit = min(int(spec[f]) for f in ("maxConcurrentRunCount", "maxConcurrentActiveRunCount")
                    if spec.get(f) is not None)
        busy = await self.active_runs(row["parent"], row["id"]) >= limit
        if busy and spec.get("allowQueueing"):
            return 0  # queued: the time stays due until one of its runs ends
        nxt = cronlib.parse(spec["cron"]).next_after(when if row["catch_up"] else max(when, now))
        nxt = _bounded(spec, nxt)
        if busy:  # skipped, as Vertex skips a time over the limit without allow_queueing
            await asyncio.to_thread(db.change, self.engine, row["id"], {"next_run": when, "state": ACTIVE},
                                    next_run=nxt, state=ACTIVE if nxt is not None else COMPLETED)
            return 0
        name = schedule_name(row)
        job = {**spec["createPipelineJobRequest"]["pipelineJob"]}
        job["labels"] = {**(job.get("labels") or {}), LABEL: row["id"]}
        ran = 1
        try:
            response = await self.start_run(row["parent"], run_id(row, when), job, name)
        except ApiError as exc:
            if exc.status == "ALREADY_EXISTS":  # made before a crash, its time not advanced: counted now
                response = f"{row['parent']}/pipelineJobs/{run_id(row, when)}"
            else:  # refused (say, a spec this platform no longer runs): said in the schedule, the time passes
                ran, response = 0, f"{exc.status}: {exc.message}"
                log.warning("schedule %s: its run for %s was refused: %s", name, rfc3339(when), exc.message)
        count = row["started_run_count"] + ran
        done = nxt is None or (spec.get("maxRunCount") is not None and count >= int(spec["maxRunCount"]))
        changed = await asyncio.to_thread(
            db.change, self.engine, row["id"], {"next_run": when, "state": ACTIVE}, started_run_count=count,
            next_run=None if done else nxt, state=COMPLETED if done else ACTIVE,
            last_response={"scheduledRunTime": rfc3339(when), "runResponse": response})
        return ran if changed else 0

    def next_wait(self) -> float:
        return TICK_SECONDS

    async def run_forever(self, leading: Callable[[], bool]) -> None:
        """Tick while the platform runs (only when it leads its store), woken early by a change."""
        self._loop = asyncio.get_running_loop()
        while True:
            if leading():
                try:
                    await self.tick()
                except Exception:  # the store unreachable for a moment: the next tick tries again
                    log.exception("the pipeline scheduler's tick failed")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.next_wait())
            except asyncio.TimeoutError:
                pass
