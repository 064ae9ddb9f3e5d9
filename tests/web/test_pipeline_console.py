"""The console's Pipelines pages in a real browser (the session's Chromium): a run of the two-step pipeline
whose second step fails is listed, its graph drawn with that task red and the other green, and the failed
task's log shown (its custom job's, with the component's error). A platform of this module's own, as the
other console pages' tests have (the session platform's tests run in the other worker). The graph's
scopes (groups, loops, iterations) and the layout are tested one layer down, without a process."""
from __future__ import annotations

import time

import pytest
import requests
import yaml

from modelyard.web.console import dag_layout, platform_pipelines
from tests.platform.conftest import PARENT, _env, require, start_platform
from tests.web.conftest import DESKTOP

RUN = "console-fails"


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory):
    """A platform with one finished run of the two-step pipeline told to fail in its second step."""
    require("kfp", "pip install -e '.[test]' (installs kfp, the Kubeflow Pipelines SDK)")
    from kfp import compiler

    from tests.platform.job_scripts import kfp_two_step

    folder = tmp_path_factory.mktemp("pipeline-console")
    compiler.Compiler().compile(kfp_two_step.two_step, str(folder / "two_step.yaml"))
    p = start_platform(tmp_path_factory, "pipeline-console-platform", _env(), [])
    try:
        bucket = requests.post(f"{p.storage_url}/storage/v1/b", params={"project": "local"},
                               json={"name": "console-bucket"}, timeout=10)  # the run's artifacts go there
        assert bucket.status_code == 200, bucket.text
        body = {"displayName": "console <b>run</b>", "pipelineSpec": yaml.safe_load((folder / "two_step.yaml").read_text()),
                "runtimeConfig": {"gcsOutputDirectory": "gs://console-bucket/root", "parameterValues": {"fail": True}}}
        made = requests.post(p.api("pipelineJobs"), params={"pipelineJobId": RUN}, json=body, timeout=30)
        assert made.status_code == 200, made.text
        deadline = time.monotonic() + 180
        while (job := requests.get(p.api(f"pipelineJobs/{RUN}"), timeout=10).json())["state"] not in (
                "PIPELINE_STATE_FAILED", "PIPELINE_STATE_SUCCEEDED"):
            assert time.monotonic() < deadline, f"the run did not end: {job['state']}"
            time.sleep(0.2)
        yield p, job
    finally:
        p.cleanup()


def test_a_failed_run_is_listed_and_drawn_with_its_failed_task_red_and_its_log(failed_run, browser):
    p, job = failed_run
    assert job["state"] == "PIPELINE_STATE_FAILED"
    page = browser.new_page(viewport=DESKTOP)
    try:
        page.goto(f"{p.url}/console")
        page.locator('header a[href="/console/pipelines"]').click()  # the console's way there
        row = page.locator(f'tr.pipeline-run[data-run="{RUN}"]')
        assert row.locator("td.state").inner_text() == "failed"
        assert row.locator("a").inner_text() == "console <b>run</b>"  # a name is text, never markup
        row.locator("a").click()

        page.wait_for_selector("svg.dag")
        nodes = page.locator("svg.dag .task")
        assert sorted(nodes.nth(i).get_attribute("data-task") for i in range(nodes.count())) == ["count", "make-data"]
        fill = "(el) => getComputedStyle(el.querySelector('rect')).stroke"
        failed, made = page.locator('svg.dag .task[data-task="count"]'), page.locator('svg.dag .task[data-task="make-data"]')
        assert failed.get_attribute("data-state") == "FAILED" and failed.evaluate(fill) == "rgb(217, 48, 37)"
        assert made.get_attribute("data-state") == "SUCCEEDED" and made.evaluate(fill) == "rgb(24, 128, 56)"
        assert page.locator("svg.dag path.edge").count() == 1  # make-data -> count: count reads its Dataset
        made_box, failed_box = made.bounding_box(), failed.bounding_box()
        assert made_box["y"] + made_box["height"] <= failed_box["y"]  # the producer above its consumer

        made.click()  # another task's details and log, then back to the failed one
        page.wait_for_selector('section.task-detail[data-task="make-data"]')
        assert "SUCCEEDED" in page.locator("section.task-detail").inner_text()
        page.locator('svg.dag .task[data-task="count"]').click()
        detail = page.locator('section.task-detail[data-task="count"]')
        detail.wait_for()
        assert "count was told to fail" in detail.locator(".error").inner_text()
        log = detail.locator("pre.log").inner_text()
        assert "RuntimeError: count was told to fail" in log  # the task's own log: its custom job's
        assert page.evaluate("() => [...document.scripts].every((s) => !s.src || s.src.startsWith(location.origin))")
    finally:
        page.close()


# ---- one layer down: the graph of a run's scopes, and the layout ----------------------------------------------

SPEC = {
    "root": {"dag": {"tasks": {
        "prep": {"taskInfo": {"name": "prep"}, "componentRef": {"name": "comp-prep"}},
        "for-loop-2": {"taskInfo": {"name": "for-loop-2"}, "componentRef": {"name": "comp-for-loop-2"},
                       "dependentTasks": ["prep"], "parameterIterator": {"itemInput": "x"}},
        "sum": {"taskInfo": {"name": "sum"}, "componentRef": {"name": "comp-sum"},
                "inputs": {"parameters": {"xs": {"taskOutputParameter": {"producerTask": "for-loop-2"}},
                                          "k": {"componentInputParameter": "k"}}}},
    }}},
    "components": {
        "comp-for-loop-2": {"dag": {"tasks": {
            "square": {"taskInfo": {"name": "square"}, "componentRef": {"name": "comp-square"}},
            "condition-3": {"taskInfo": {"name": "condition-3"}, "componentRef": {"name": "comp-condition-3"},
                            "inputs": {"parameters": {"v": {"taskOutputParameter": {"producerTask": "square"}}}}},
        }}},
        "comp-condition-3": {"dag": {"tasks": {"shout": {"taskInfo": {"name": "shout"},
                                                         "componentRef": {"name": "comp-shout"}}}}},
        "comp-prep": {"executorLabel": "exec-prep"}, "comp-square": {"executorLabel": "exec-square"},
        "comp-sum": {"executorLabel": "exec-sum"}, "comp-shout": {"executorLabel": "exec-shout"},
    },
}


def _detail(task_id, parent, name, state, iteration=None):
    d = {"taskId": task_id, "parentTaskId": parent, "taskName": name, "state": state}
    if iteration is not None:
        d["execution"] = {"metadata": {"iteration_index": iteration}}
    return d


JOB = {"name": f"{PARENT}/pipelineJobs/r", "pipelineSpec": SPEC, "jobDetail": {"taskDetails": [
    {"taskId": "1000", "taskName": "loops", "state": "RUNNING"},
    _detail("1001", "1000", "prep", "SUCCEEDED"),
    _detail("1002", "1000", "for-loop-2", "RUNNING"),
    _detail("1004", "1002", "for-loop-2", "SUCCEEDED", 1),
    _detail("1003", "1002", "for-loop-2", "RUNNING", 0),
    _detail("1005", "1003", "square", "FAILED"),
    _detail("1006", "1004", "square", "SUCCEEDED"),
    _detail("1007", "1004", "condition-3", "SUCCEEDED"),
    _detail("1008", "1007", "shout", "SUCCEEDED"),
]}}


def test_a_runs_scopes_root_loop_iteration_and_group():
    graph = platform_pipelines.RunGraph(JOB)
    nodes, edges = graph.scope(None)  # the root DAG: every task of the spec, started or not
    assert [(n["key"], n["state"], n["taskId"], n["opens"]) for n in nodes] == [
        ("prep", "SUCCEEDED", "1001", False), ("for-loop-2", "RUNNING", "1002", True), ("sum", "", None, False)]
    assert sorted(edges) == [("for-loop-2", "sum"), ("prep", "for-loop-2")]  # k is the pipeline's, no edge
    nodes, edges = graph.scope("1002")  # the loop: its iterations in item order
    assert [(n["label"], n["state"], n["taskId"]) for n in nodes] == [
        ("for-loop-2 #0", "RUNNING", "1003"), ("for-loop-2 #1", "SUCCEEDED", "1004")] and edges == []
    nodes, edges = graph.scope("1003")  # iteration 0: the body, with that iteration's states
    assert [(n["key"], n["state"], n["opens"]) for n in nodes] == [("square", "FAILED", False),
                                                                  ("condition-3", "", True)]
    assert edges == [("square", "condition-3")]
    assert [(n["key"], n["state"]) for n in graph.scope("1007")[0]] == [("shout", "SUCCEEDED")]  # a dsl.If group
    assert [d["taskId"] for d in graph.path("1007")] == ["1002", "1004", "1007"]
    assert platform_pipelines.first_failed(JOB) == "1005"

    html = platform_pipelines.render_run(JOB, "1005", "Traceback\nValueError: <bad>\n")
    assert 'data-task="square" data-state="FAILED"' in html and "ValueError: &lt;bad&gt;" in html
    assert "for-loop-2 #0" in html  # the breadcrumb down to the iteration shown


def test_the_runs_list_shows_runs_and_schedules():
    run = {**JOB, "displayName": "<i>loops</i>", "state": "PIPELINE_STATE_RUNNING", "createTime": "t",
           "scheduleName": f"{PARENT}/schedules/77"}
    sched = {"name": f"{PARENT}/schedules/77", "displayName": "nightly", "cron": "0 3 * * *", "state": "ACTIVE",
             "startedRunCount": "4", "maxRunCount": "10", "nextRunTime": "2026-03-02T03:00:00Z"}
    html = platform_pipelines.render_list([run], [sched])
    assert 'data-running="1"' in html and "&lt;i&gt;loops&lt;/i&gt;" in html  # followed while running; escaped
    assert "1 failed, 2 running, 5 succeeded" in html  # its tasks' states, counted
    assert '<tr class="schedule" data-schedule="77">' in html and "4 of 10" in html and "<code>0 3 * * *</code>" in html
    assert platform_pipelines.render_list([], []).count("No pipeline runs yet") == 1


def test_layered_layout_puts_each_task_below_what_it_waits_for_and_wraps_wide_layers():
    edges = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("a", "d")]
    assert dag_layout.layers(["a", "b", "c", "d"], edges) == {"a": 0, "b": 1, "c": 1, "d": 2}
    placed = dag_layout.layout(["a", "b", "c", "d"], edges)
    y = {n: p[1] for n, p in placed.positions.items()}
    assert y["a"] < y["b"] == y["c"] < y["d"]
    fan = [f"t{i}" for i in range(14)]
    wide = dag_layout.layout(["src", *fan], [("src", t) for t in fan])  # rows of 5: the console's column
    assert len({p[1] for p in wide.positions.values()}) == 4  # the source, then 14 tasks on rows of 5, 5, 4
    assert wide.width == 5 * dag_layout.NODE_W + 4 * dag_layout.H_GAP + 2 * dag_layout.MARGIN <= 1000
    assert len(set(wide.positions.values())) == 15  # no two nodes at one place


def test_a_schedule_that_started_no_run_yet_names_its_parent(tmp_path):
    # The runs page lists the parents that platform_state.parents finds: a schedule's alone counts too.
    from types import SimpleNamespace

    from sqlalchemy import create_engine

    from modelyard.platform.state import schedule_schema, schema
    from modelyard.web.console import platform_state

    engine = create_engine(f"sqlite:///{tmp_path / 'store.db'}")
    schema.migrate(engine)
    store = SimpleNamespace(engine=engine)
    assert platform_state.parents(store) == []
    schedule_schema.add(engine, {"id": "1", "parent": "projects/p/locations/l", "display_name": "s", "spec": {},
                                 "state": "ACTIVE", "created": 0.0, "updated": 0.0})
    assert platform_state.parents(store) == ["projects/p/locations/l"]
    engine.dispose()
