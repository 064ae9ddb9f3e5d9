"""Vertex AI schedules of pipeline runs (issue 46, ``pipelineJobSchedules``). The stock SDK's
``PipelineJob.create_schedule``, ``PipelineJobSchedule.list/get/pause/resume/update/delete`` and
``list_jobs`` on the session platform, whose scheduler starts the run at its cron time (one end-to-end
test). The scheduler's rules (times, limits, queueing, pause and resume, catch-up, a restart) are tested
one layer down: the real store (SQLite, migrated) and a clock the test moves; the cron parser alone.
"""
from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from google.api_core.exceptions import BadRequest
import requests
from sqlalchemy import create_engine

from modelyard.platform.api.errors import ApiError
from modelyard.platform.api.names import Route
from modelyard.platform.jobs import cron, pipeline_routes, pipeline_schedules
from modelyard.platform.state import schedule_schema, schema
from tests.aio import run
from tests.platform.conftest import STAGING_BUCKET, require
from tests.platform.jobs_helpers import aiplatform, pipeline_sdk, wait_state  # noqa: F401

ROOT = f"gs://{STAGING_BUCKET}/schedule-root"


def _t(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp() if "+" not in text else \
        datetime.fromisoformat(text).timestamp()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M")


# ---- cron ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("expr, after, expected", [
    ("* * * * *", "2026-03-01 10:00:30", "2026-03-01 10:01"),
    ("*/15 * * * *", "2026-03-01 10:00:00", "2026-03-01 10:15"),  # strictly after
    ("5/20 9-17 * * MON-FRI", "2026-03-06 17:50:00", "2026-03-09 09:05"),  # Friday evening -> Monday
    ("0 0 1 * MON", "2026-03-02 00:00:00", "2026-03-09 00:00"),  # both days given: either matches
    ("0 0 1 * MON", "2026-03-30 00:00:00", "2026-04-01 00:00"),
    ("0 12 * * 7", "2026-03-01 12:00:00", "2026-03-08 12:00"),  # 7 is Sunday too
    ("@monthly", "2026-01-31 00:00:00", "2026-02-01 00:00"),
    ("0 0 29 FEB *", "2026-03-01 00:00:00", "2028-02-29 00:00"),
    ("30 2 * * *", "2026-01-01 00:00:00", "2026-01-01 02:30"),
    ("0,30 1,2 * JAN,jul *", "2026-01-31 02:45:00", "2026-07-01 01:00"),
])
def test_cron_next_time(expr, after, expected):
    assert _iso(cron.parse(expr).next_after(_t(after))) == expected


def test_cron_time_zones_and_daylight_saving():
    ny = cron.parse("CRON_TZ=America/New_York 30 2 * * *")
    # 8 March 2026: New York skips 02:00-03:00, so 02:30 does not happen that day.
    assert _iso(ny.next_after(_t("2026-03-07 08:00:00"))) == "2026-03-09 06:30"  # 02:30 EDT, the 9th
    assert _iso(cron.parse("TZ=Asia/Kolkata 0 9 * * *").next_after(_t("2026-03-01 00:00:00"))) == "2026-03-01 03:30"
    assert cron.parse("0 0 30 2 *").next_after(_t("2026-01-01 00:00:00")) is None  # never


@pytest.mark.parametrize("expr, words", [
    ("* * * *", "4 fields"), ("61 * * * *", "outside the minute"), ("* * * * MOO", "not a number"),
    ("*/0 * * * *", "step"), ("5-1 * * * *", "backwards"), ("TZ=Mars/Base * * * * *", "IANA"), ("", "required"),
])
def test_cron_errors_name_what_is_wrong(expr, words):
    with pytest.raises(ApiError, match=words) as err:
        cron.parse(expr)
    assert err.value.status == "INVALID_ARGUMENT"


# ---- the scheduler, on a real store, with the test's clock ------------------------------------------------------

class Clock:
    def __init__(self, now: str) -> None:
        self.now = _t(now)

    def __call__(self) -> float:
        return self.now

    def at(self, now: str) -> None:
        self.now = _t(now)


class Runs:
    """What the platform's create does for a run, as far as the scheduler sees it: ids taken, runs active."""

    def __init__(self) -> None:
        self.made: dict[str, dict] = {}
        self.active: set[str] = set()

    async def start(self, parent: str, run_id: str, job: dict, schedule: str) -> str:
        if run_id in self.made:
            raise ApiError("ALREADY_EXISTS", f"PipelineJob {run_id} already exists.")
        self.made[run_id] = {"job": job, "schedule": schedule}
        self.active.add(run_id)
        return f"{parent}/pipelineJobs/{run_id}"

    async def count(self, parent: str, schedule_id: str) -> int:
        return sum(1 for r in self.active if self.made[r]["job"]["labels"][pipeline_schedules.LABEL] == schedule_id)


ROUTE = Route("local", "us-central1", "schedules")


async def _accept(_route, _job) -> None:
    return None


@pytest.fixture
def world(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'store.db'}")
    schema.migrate(engine)
    clock, runs = Clock("2026-03-01 10:00:30"), Runs()
    api = pipeline_schedules.Schedules(engine, _accept)
    scheduler = pipeline_schedules.Scheduler(engine, runs.start, runs.count, clock)
    yield engine, clock, runs, api, scheduler
    engine.dispose()


def _body(**extra) -> dict:
    return {"displayName": "nightly", "cron": "*/10 * * * *", "maxConcurrentRunCount": "1",
            "createPipelineJobRequest": {"parent": ROUTE.parent, "pipelineJob": {"displayName": "p", "labels": {"a": "b"}}},
            **extra}


def _create(api, clock, **extra) -> dict:
    return run(api.create(ROUTE, _body(**extra), now=clock()))


def _route(made: dict) -> Route:
    return Route("local", "us-central1", "schedules", made["name"].rsplit("/", 1)[-1])


def test_runs_start_at_their_times_and_the_schedule_completes_at_max_run_count(world):
    engine, clock, runs, api, scheduler = world
    made = _create(api, clock, maxRunCount="2", maxConcurrentRunCount="5")
    assert made["state"] == "ACTIVE" and made["nextRunTime"] == "2026-03-01T10:10:00.000000Z"
    assert made["startTime"] == "2026-03-01T10:00:30.000000Z" and made["startedRunCount"] == "0"
    assert run(scheduler.tick()) == 0  # not yet
    clock.at("2026-03-01 10:10:01")
    assert run(scheduler.tick()) == 1 and run(scheduler.tick()) == 0  # once per time
    sid = made["name"].rsplit("/", 1)[-1]
    (first,) = runs.made
    assert first == f"s{sid}-20260301101000"
    assert runs.made[first]["schedule"] == made["name"]
    assert runs.made[first]["job"]["labels"] == {"a": "b", pipeline_schedules.LABEL: sid}  # its own labels kept
    got = api.get(_route(made))
    assert got["startedRunCount"] == "1" and got["nextRunTime"] == "2026-03-01T10:20:00.000000Z"
    assert got["lastScheduledRunResponse"] == {"scheduledRunTime": "2026-03-01T10:10:00.000000Z",
                                               "runResponse": f"{ROUTE.parent}/pipelineJobs/{first}"}
    clock.at("2026-03-01 10:20:00")
    assert run(scheduler.tick()) == 1
    got = api.get(_route(made))
    assert got["state"] == "COMPLETED" and got["startedRunCount"] == "2" and "nextRunTime" not in got
    clock.at("2026-03-01 11:00:00")
    assert run(scheduler.tick()) == 0


def test_a_time_over_the_concurrency_limit_is_skipped_or_queued(world):
    engine, clock, runs, api, scheduler = world
    skip = _create(api, clock)
    queue = _create(api, clock, displayName="queued", allowQueueing=True)
    clock.at("2026-03-01 10:10:00")
    assert run(scheduler.tick()) == 2
    clock.at("2026-03-01 10:20:00")  # both still have a run going (limit 1)
    assert run(scheduler.tick()) == 0
    assert api.get(_route(skip))["nextRunTime"] == "2026-03-01T10:30:00.000000Z"  # skipped: on to the next time
    assert api.get(_route(queue))["nextRunTime"] == "2026-03-01T10:20:00.000000Z"  # queued: still due
    runs.active.clear()  # the runs end
    clock.at("2026-03-01 10:21:00")
    assert run(scheduler.tick()) == 1  # the queued time runs now
    assert sorted(r.rsplit("-", 1)[1] for r in runs.made) == ["20260301101000", "20260301101000", "20260301102000"]
    assert api.get(_route(queue))["nextRunTime"] == "2026-03-01T10:30:00.000000Z"


def test_pause_resume_catch_up_end_time_and_a_restart(world):
    engine, clock, runs, api, scheduler = world
    made = _create(api, clock, endTime="2026-03-01T11:00:00Z", maxConcurrentRunCount="10")
    route = _route(made)
    api.pause(route, now=clock())
    with pytest.raises(ApiError, match="only an ACTIVE schedule") as err:
        api.pause(route)
    assert err.value.status == "FAILED_PRECONDITION"
    clock.at("2026-03-01 10:35:00")
    assert run(scheduler.tick()) == 0  # paused: nothing starts
    api.resume(route, now=clock())  # no catch-up: from the next time after now
    got = api.get(route)
    assert got["state"] == "ACTIVE" and got["nextRunTime"] == "2026-03-01T10:40:00.000000Z" and got["lastPauseTime"]
    api.pause(route, now=clock())
    clock.at("2026-03-01 10:55:00")
    api.resume(route, catch_up=True, now=clock())  # 10:40 and 10:50 were missed: both run, one per tick
    assert run(scheduler.tick()) == 1 and run(scheduler.tick()) == 1
    assert run(scheduler.tick()) == 0
    # A platform restarted on the same store: a new scheduler over it goes on from what the store says.
    again = pipeline_schedules.Scheduler(engine, runs.start, runs.count, clock)
    clock.at("2026-03-01 11:00:00")
    assert run(again.tick()) == 1  # 11:00 is its end time: the last run, then COMPLETED
    got = api.get(route)
    assert got["state"] == "COMPLETED" and got["startedRunCount"] == "3"
    assert sorted(r.rsplit("-", 1)[1][8:12] for r in runs.made) == ["1040", "1050", "1100"]
    with pytest.raises(ApiError, match="only a PAUSED schedule"):
        api.resume(route)


def test_a_run_made_before_a_crash_is_counted_not_made_again(world):
    engine, clock, runs, api, scheduler = world
    made = _create(api, clock, maxConcurrentRunCount="3")
    sid = made["name"].rsplit("/", 1)[-1]
    run(runs.start(ROUTE.parent, f"s{sid}-20260301101000", {"labels": {pipeline_schedules.LABEL: sid}}, ""))
    clock.at("2026-03-01 10:10:05")
    assert run(scheduler.tick()) == 1
    assert len(runs.made) == 1 and api.get(_route(made))["startedRunCount"] == "1"


def test_bad_schedules_are_refused_in_googles_words(world):
    engine, clock, runs, api, scheduler = world
    for extra, words in (({"cron": "* * *"}, "cron"), ({"maxConcurrentRunCount": None}, "max_concurrent_run_count"),
                         ({"maxRunCount": "0"}, "max_run_count"), ({"displayName": ""}, "display_name"),
                         ({"startTime": "2026-03-02T00:00:00Z", "endTime": "2026-03-01T00:00:00Z"}, "end_time"),
                         ({"createPipelineJobRequest": {}}, "pipeline_job is required"),
                         ({"createPipelineJobRequest": {"pipelineJob": {}, "pipelineJobId": "x"}}, "pipeline_job_id")):
        with pytest.raises(ApiError, match=words) as err:
            _create(api, clock, **extra)
        assert err.value.status == "INVALID_ARGUMENT"
    with pytest.raises(ApiError) as err:
        api.get(Route("local", "us-central1", "schedules", "404"))
    assert err.value.status == "NOT_FOUND"
    made = _create(api, clock)
    patched = run(api.patch(_route(made), {"cron": "0 * * * *", "displayName": "hourly"}, "cron,display_name",
                                    now=clock()))
    assert patched["displayName"] == "hourly" and patched["nextRunTime"] == "2026-03-01T11:00:00.000000Z"
    with pytest.raises(ApiError, match="cannot be updated"):
        run(api.patch(_route(made), {"state": "PAUSED"}, "state"))
    listed = api.list(ROUTE, {"filter": 'display_name="hourly"'})
    assert [s["name"] for s in listed["schedules"]] == [made["name"]]
    assert schedule_schema.get(engine, made["name"].rsplit("/", 1)[-1])["spec"]["cron"] == "0 * * * *"


def check_schedules_store(url: str) -> None:
    """The schedules' table and the scheduler's compare-and-set on one database (SQLite here, PostgreSQL from
    test_postgres.py), without a platform process: times, a restart's second scheduler, pause, the list filter."""
    from modelyard.platform.state.store import Store

    store = Store(url)
    try:
        clock, runs = Clock("2026-03-01 10:00:30"), Runs()
        api = pipeline_schedules.Schedules(store.engine, _accept)
        made = _create(api, clock, displayName="on-this-store", maxRunCount="3", maxConcurrentRunCount="9")
        first = pipeline_schedules.Scheduler(store.engine, runs.start, runs.count, clock)
        second = pipeline_schedules.Scheduler(store.engine, runs.start, runs.count, clock)  # a restarted platform's
        clock.at("2026-03-01 10:10:00")
        assert run(first.tick()) == 1 and run(second.tick()) == 0
        clock.at("2026-03-01 10:20:00")
        assert run(second.tick()) == 1 and run(first.tick()) == 0
        api.pause(_route(made), now=clock())
        listed = api.list(ROUTE, {"filter": 'display_name="on-this-store" AND state="PAUSED"'})
        assert [(s["name"], s["startedRunCount"]) for s in listed["schedules"]] == [(made["name"], "2")]
        assert len(runs.made) == 2
        api.delete(_route(made))
        assert api.list(ROUTE, {"filter": 'display_name="on-this-store"'}) == {}
    finally:
        store.engine.dispose()


def test_schedules_store_on_sqlite(tmp_path):
    check_schedules_store(f"sqlite:///{tmp_path / 'store.db'}")


def test_the_run_list_filter_schedule_name_is_the_runs_label():
    assert pipeline_routes._schedule_filter("schedule_name=projects/p/locations/l/schedules/123 AND state=1") == \
        f'labels.{pipeline_schedules.LABEL}="123" AND state=1'
    assert pipeline_routes._schedule_filter('scheduleName="projects/p/locations/l/schedules/9"') == \
        f'labels.{pipeline_schedules.LABEL}="9"'


# ---- end to end: the stock SDK, the session platform's scheduler -------------------------------------------------

def test_the_sdks_schedule_starts_a_run_at_its_cron_time(sdk, platform, tmp_path):
    require("kfp", "pip install -e '.[test]' (installs kfp, the Kubeflow Pipelines SDK)")
    from kfp import compiler

    from tests.platform.job_scripts import kfp_two_step

    path = str(tmp_path / "two_step.yaml")
    compiler.Compiler().compile(kfp_two_step.two_step, path)
    job = sdk.PipelineJob(display_name="scheduled", template_path=path, pipeline_root=ROOT,
                          parameter_values={"rows": 2}, enable_caching=False)
    schedule = job.create_schedule(cron="* * * * *", display_name="every-minute", max_run_count=1)
    assert schedule.state.name == "ACTIVE" and schedule.cron == "* * * * *" and schedule.max_run_count == 1
    other = job.create_schedule(cron="0 3 * * *", display_name="nightly")
    other.pause()
    assert sdk.PipelineJobSchedule.get(other.resource_name).state.name == "PAUSED"
    other.resume()
    other.update(display_name="nightly-2", cron="0 4 * * *")
    got = sdk.PipelineJobSchedule.get(other.resource_name)
    assert got.display_name == "nightly-2" and got.cron == "0 4 * * *" and got.state.name == "ACTIVE"
    listed = {s.resource_name for s in sdk.PipelineJobSchedule.list(filter='display_name="nightly-2"')}
    assert listed == {other.resource_name}
    other.delete()
    assert other.resource_name not in {s.resource_name for s in sdk.PipelineJobSchedule.list()}

    # The platform's scheduler starts the run at the next minute (the cron's), then the schedule is done.
    deadline = time.monotonic() + 90
    while not (runs := schedule.list_jobs()):
        assert time.monotonic() < deadline, "the schedule started no run"
        time.sleep(0.5)
    (scheduled,) = runs  # list_jobs asks for the SDK's simple view: the run's own fields are read with get
    ran = sdk.PipelineJob.get(scheduled.resource_name)
    assert ran.gca_resource.schedule_name == schedule.resource_name
    # Started for a cron time (a whole minute: its id is the time's), and not before that time; how late
    # after it depends on the machine's load, so it is not asserted.
    stamp = datetime.strptime(ran.name.rsplit("-", 1)[1], "%Y%m%d%H%M%S").replace(tzinfo=timezone.utc)
    assert stamp.second == 0 and ran.gca_resource.create_time >= stamp
    # max_run_count reached: COMPLETED (written just after the run was made, so maybe a moment later)
    body = wait_state(platform, schedule.resource_name, ("COMPLETED",), timeout=30)
    assert schedule.state.name == "COMPLETED"
    assert body["startedRunCount"] == "1" and body["lastScheduledRunResponse"]["runResponse"] == scheduled.resource_name
    # It is a run like any other (the same create path): cancelled here (its tasks' processes stopped),
    # its running to the end is test_pipeline_jobs.py's. Its tasks are small and warm, so it may have
    # ended before the cancel: then Vertex's answer is FAILED_PRECONDITION naming the state, as here.
    try:
        ran.cancel()
    except BadRequest as refused:
        assert "PIPELINE_STATE_SUCCEEDED" in str(refused) and "cannot be cancelled" in str(refused)
    ended = wait_state(platform, scheduled.resource_name, ("PIPELINE_STATE_CANCELLED", "PIPELINE_STATE_SUCCEEDED"))
    assert ended["runtimeConfig"]["parameterValues"] == {"rows": 2}  # what the schedule's request said
    bad = requests.post(f"{platform.url}/v1/projects/local/locations/us-central1/schedules",
                        json={"displayName": "x", "cron": "every day", "maxConcurrentRunCount": 1,
                              "createPipelineJobRequest": {"pipelineJob": {}}}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert "'every day'" in bad.json()["error"]["message"]
