"""Issue 46: Vertex AI Pipelines. A pipeline of lightweight Python components written with the stock
Kubeflow Pipelines SDK (kfp v2), compiled with ``kfp.compiler`` and run with the stock SDK's
``PipelineJob(...).run()`` on the session platform: each task a CustomJob of the platform's job runner,
the Dataset artifact in the bucket, task details and ML Metadata records as Vertex reports them; a
failing step fails the run naming the task. The IR's variants are tested one layer down, without a
process (test_pipeline_spec.py's cases live here too: they are cheap).
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
import requests

from modelyard.platform.api.errors import ApiError
from modelyard.platform.jobs import pipeline_spec
from tests.platform.conftest import STAGING_BUCKET, require
from tests.platform.jobs_helpers import aiplatform, no_stray_jobs, pipeline_sdk  # noqa: F401

ROOT = f"gs://{STAGING_BUCKET}/pipeline-root"


def _compile(tmp_path) -> str:
    """The two-step pipeline compiled to its IR (YAML): make_data writes a Dataset, count reads it."""
    require("kfp", "pip install -e '.[test]' (installs kfp, the Kubeflow Pipelines SDK)")
    from kfp import compiler

    from tests.platform.job_scripts import kfp_two_step

    path = str(tmp_path / "two_step.yaml")
    compiler.Compiler().compile(kfp_two_step.two_step, path)
    return path


def test_two_step_pipeline_passes_a_dataset_and_reports_its_tasks(sdk, platform, gcs_emulator, tmp_path):
    from google.cloud import storage

    job = sdk.PipelineJob(display_name="two-step", template_path=_compile(tmp_path), pipeline_root=ROOT,
                          parameter_values={"rows": 4}, job_id="two-step-ok", enable_caching=False)
    job.run()
    assert job.state.name == "PIPELINE_STATE_SUCCEEDED"
    assert job.resource_name == "projects/local/locations/us-central1/pipelineJobs/two-step-ok"

    tasks = {t.task_name: t for t in job.task_details}
    assert set(tasks) == {"two-step", "make-data", "count"}
    made, counted = tasks["make-data"], tasks["count"]
    assert made.state.name == counted.state.name == "SUCCEEDED"
    assert made.start_time and made.end_time and made.end_time <= counted.start_time  # DAG order
    dataset = made.outputs["data"].artifacts[0]
    assert dataset.schema_title == "system.Dataset" and dataset.metadata["rows"] == 4
    assert dataset.uri == f"{ROOT}/two-step-ok/make-data/data"
    assert counted.inputs["data"].artifacts[0].name == dataset.name  # the same ML Metadata artifact
    assert counted.execution.metadata["output:Output"] == 4 and counted.execution.metadata["input:fail"] is False
    assert counted.executor_detail.custom_job_detail.job.startswith("projects/local/locations/us-central1/customJobs/")
    # Each step forked from its job's process (the task server's), in the job's own Python: its venv's
    # interpreter and prefix, as `python3` from the job's PATH gives a cold step.
    made_job = made.executor_detail.custom_job_detail.job.rsplit("/", 1)[-1]
    log = requests.get(f"{platform.url}/modelyard/v1/jobs/{made_job}/logs", timeout=10).text
    assert re.search(r"^chief:0 \| \[modelyard\] warm start: pid \d+ forked from pid \d+", log, re.M), log
    executable, prefix = dataset.metadata["python"]
    assert prefix.endswith(f"/jobs/{made_job}/venv") and executable == f"{prefix}/bin/python3"

    # The artifact is an object in the bucket (written by the task through its /gcs/ path).
    blob = storage.Blob.from_uri(dataset.uri, client=gcs_emulator["client"])
    assert blob.download_as_text().splitlines() == ["row0", "row1", "row2", "row3"]

    # Lineage: the run's context holds both executions; the dataset is make-data's OUTPUT and count's INPUT.
    run_ctx = job.gca_resource.job_detail.pipeline_run_context
    assert run_ctx.schema_title == "system.PipelineRun"
    graph = requests.get(f"{platform.url}/v1/{run_ctx.name}:queryContextLineageSubgraph", timeout=10).json()
    executions = {e["name"]: e["displayName"] for e in graph["executions"]}
    assert sorted((e["displayName"], e["schemaTitle"]) for e in graph["executions"]) == [
        ("count", "system.ContainerExecution"), ("make-data", "system.ContainerExecution"),
        ("two-step-ok", "system.Run")]  # the run's own execution (its parameters, its state)
    kinds = {(executions[e["execution"]], e["type"]) for e in graph["events"] if e["artifact"] == dataset.name}
    assert kinds == {("make-data", "OUTPUT"), ("count", "INPUT")}

    assert job.resource_name in [j.resource_name for j in sdk.PipelineJob.list(filter='display_name="two-step"')]
    listed = requests.get(platform.api("pipelineJobs"), params={"filter": 'display_name="two-step" AND '
                                                                          'state="PIPELINE_STATE_SUCCEEDED"'},
                          timeout=10).json()
    assert "projects/local/locations/us-central1/pipelineJobs/two-step-ok" in [j["name"] for j in listed["pipelineJobs"]]


def test_a_failing_step_fails_the_run_naming_the_task(sdk, platform, tmp_path):
    job = sdk.PipelineJob(display_name="two-step-fails", template_path=_compile(tmp_path), pipeline_root=ROOT,
                          parameter_values={"fail": True}, job_id="two-step-fails", enable_caching=False)
    with pytest.raises(RuntimeError, match=r"The failed tasks are: \[count\]"):
        job.run()
    assert job.state.name == "PIPELINE_STATE_FAILED"
    tasks = {t.task_name: t for t in job.task_details}
    assert tasks["make-data"].state.name == "SUCCEEDED" and tasks["count"].state.name == "FAILED"
    assert "count was told to fail" in tasks["count"].error.message

    # Bad input, in Google's format: the id taken, an unknown parameter, no output directory.
    spec = yaml.safe_load(open(_compile(tmp_path)))
    taken = requests.post(platform.api("pipelineJobs"), params={"pipelineJobId": "two-step-fails"},
                          json={"pipelineSpec": spec, "runtimeConfig": {"gcsOutputDirectory": ROOT}}, timeout=10)
    assert taken.status_code == 409 and taken.json()["error"]["status"] == "ALREADY_EXISTS"
    unknown = requests.post(platform.api("pipelineJobs"), json={
        "pipelineSpec": spec, "runtimeConfig": {"gcsOutputDirectory": ROOT, "parameterValues": {"nope": 1}}}, timeout=10)
    assert unknown.status_code == 400 and "'nope'" in unknown.json()["error"]["message"]
    no_root = requests.post(platform.api("pipelineJobs"), json={"pipelineSpec": spec}, timeout=10)
    assert no_root.status_code == 400 and "gcs_output_directory" in no_root.json()["error"]["message"]
    # A bucket name storage refuses (here 1 character): refused now, not a run whose tasks' outputs are unreadable.
    bad_bucket = requests.post(platform.api("pipelineJobs"), params={"pipelineJobId": "bad-bucket"}, json={
        "pipelineSpec": spec, "runtimeConfig": {"gcsOutputDirectory": "gs://b"}}, timeout=10)
    error = bad_bucket.json()["error"]
    assert bad_bucket.status_code == 400 and error["status"] == "INVALID_ARGUMENT", error
    assert "PipelineJob.runtime_config.gcs_output_directory 'gs://b'" in error["message"]
    assert "Invalid bucket name: 'b'" in error["message"]
    assert requests.get(platform.api("pipelineJobs/bad-bucket"), timeout=10).status_code == 404  # nothing made


def test_a_second_identical_run_reuses_every_task_and_a_changed_input_reruns_only_what_depends_on_it(
        sdk, platform, tmp_path):
    template = _compile(tmp_path)

    def run(job_id: str, **params) -> dict:
        job = sdk.PipelineJob(display_name="cached", template_path=template, pipeline_root=ROOT, job_id=job_id,
                              parameter_values={"rows": 5, **params}, enable_caching=True)
        try:
            job.run()
        except RuntimeError:  # a failed run: its tasks say which
            pass
        return {t.task_name: t for t in job.task_details}

    first = run("cached-1")
    assert first["make-data"].state.name == first["count"].state.name == "SUCCEEDED"
    second = run("cached-2")
    assert second["make-data"].state.name == second["count"].state.name == "SKIPPED", second["count"].error
    assert not second["count"].executor_detail.custom_job_detail.job  # no job, so no process
    assert second["make-data"].outputs["data"].artifacts[0].name == first["make-data"].outputs["data"].artifacts[0].name
    assert second["count"].execution.state.name == "CACHED" and second["count"].execution.metadata["output:Output"] == 5
    third = run("cached-3", fail=True)  # count's input changed: it runs (and fails); make-data is reused
    assert third["make-data"].state.name == "SKIPPED" and third["count"].state.name == "FAILED"


def test_dsl_if_else_runs_only_the_branch_whose_condition_holds(sdk, platform, tmp_path):
    from kfp import compiler

    from tests.platform.job_scripts import kfp_branches

    template = str(tmp_path / "branches.yaml")
    compiler.Compiler().compile(kfp_branches.branches, template)
    job = sdk.PipelineJob(display_name="branches", template_path=template, pipeline_root=ROOT, job_id="branches",
                          parameter_values={"n": 7}, enable_caching=False)
    job.run()
    assert job.state.name == "PIPELINE_STATE_SUCCEEDED"
    tasks = {t.task_name: t for t in job.task_details}
    assert {n: t.state.name for n, t in tasks.items()} == {
        "branches": "SUCCEEDED", "flip": "SUCCEEDED", "condition-branches-1": "SUCCEEDED",
        "condition-2": "SUCCEEDED", "say": "SUCCEEDED", "condition-3": "NOT_TRIGGERED"}  # say-2 never started
    assert tasks["say"].execution.metadata["output:Output"] == "heads won"
    assert tasks["say"].parent_task_id == tasks["condition-2"].task_id
    assert tasks["condition-2"].parent_task_id == tasks["condition-branches-1"].task_id


def test_an_exit_handler_runs_after_a_failing_step_and_the_run_fails_naming_it(sdk, platform, tmp_path):
    from kfp import compiler

    from tests.platform.job_scripts import kfp_exit

    template = str(tmp_path / "exits.yaml")
    compiler.Compiler().compile(kfp_exit.exits, template)
    job = sdk.PipelineJob(display_name="exits", template_path=template, pipeline_root=ROOT, job_id="exits",
                          enable_caching=False)
    with pytest.raises(RuntimeError, match=r"The failed tasks are: \[boom\]"):
        job.run()
    tasks = {t.task_name: t for t in job.task_details}
    assert tasks["boom"].state.name == "FAILED" and tasks["exit-handler-1"].state.name == "FAILED"
    assert tasks["cleanup"].state.name == "SUCCEEDED" and tasks["cleanup"].start_time >= tasks["boom"].end_time
    assert tasks["cleanup"].execution.metadata["output:Output"] == "FAILED exit-handler-1 13"


def _by_name(job) -> dict[str, list]:
    """The run's task details by task name (a loop's task runs once per item: a list each)."""
    out: dict = {}
    for t in job.task_details:
        out.setdefault(t.task_name, []).append(t)
    return out


def test_parallel_for_runs_six_items_two_at_a_time_into_collected_steps(sdk, platform, gcs_emulator, tmp_path):
    from kfp import compiler

    from tests.platform.job_scripts import kfp_loops

    template = str(tmp_path / "fan.yaml")
    compiler.Compiler().compile(kfp_loops.fan, template)
    job = sdk.PipelineJob(display_name="fan", template_path=template, pipeline_root=ROOT, job_id="fan",
                          enable_caching=False)
    job.run()
    assert job.state.name == "PIPELINE_STATE_SUCCEEDED"
    tasks = _by_name(job)
    assert tasks["total"][0].execution.metadata["output:Output"] == 1 + 4 + 9 + 16 + 25 + 36
    assert tasks["count-files"][0].execution.metadata["output:Output"] == "1,4,9,16,25,36"  # item order
    assert len(tasks["count-files"][0].inputs["files"].artifacts) == 6
    squares = tasks["square"]
    assert len(squares) == 6 and {t.state.name for t in squares} == {"SUCCEEDED"}
    assert len({t.outputs["out"].artifacts[0].uri for t in squares}) == 6  # one object per iteration
    # The loop, then its six iterations (DAG tasks named after it, under it), each the parent of one square.
    loop, *iterations = tasks["for-loop-2"]
    assert [t.parent_task_id for t in iterations] == [loop.task_id] * 6
    assert sorted(t.execution.metadata["iteration_index"] for t in iterations) == list(range(6))
    assert {t.parent_task_id for t in squares} == {t.task_id for t in iterations}
    # parallelism=2: never more than two iterations at once.
    spans = [(t.start_time, t.end_time) for t in iterations]
    assert max(sum(1 for s, e in spans if s <= at < e) for at, _ in spans) == 2


def test_nested_loops_over_a_task_output_a_retried_step_and_an_importer(sdk, platform, tmp_path):
    from kfp import compiler

    from tests.platform.job_scripts import kfp_loops

    template = str(tmp_path / "nested.yaml")
    compiler.Compiler().compile(kfp_loops.nested, template)
    job = sdk.PipelineJob(display_name="nested", template_path=template, pipeline_root=ROOT, job_id="nested",
                          enable_caching=False, parameter_values={
                              "marker": str(tmp_path / "flaky-marker"), "model_uri": f"{ROOT}/nested/shapes/model"})
    job.run()
    assert job.state.name == "PIPELINE_STATE_SUCCEEDED"
    tasks = _by_name(job)
    assert sorted(t.execution.metadata["output:Output"] for t in tasks["label"]) == ["a1", "b2"]
    assert sorted(t.execution.metadata["output:Output"] for t in tasks["label-2"]) == ["k10", "k10", "k20", "k20"]
    assert len(tasks["for-loop-1"]) == 1 + 2 and len(tasks["for-loop-3"]) == 2 * (1 + 2)  # loops and iterations
    flaky = tasks["flaky"][0]
    assert flaky.state.name == "SUCCEEDED" and flaky.execution.metadata["output:Output"] == "second time lucky"
    assert [s.state.name for s in flaky.pipeline_task_status] == ["FAILED"]  # the first attempt
    assert "flaky fails its first attempt" in flaky.pipeline_task_status[0].error.message
    model = tasks["importer"][0].outputs["artifact"].artifacts[0]
    assert model.uri == f"{ROOT}/nested/shapes/model" and model.schema_title == "system.Model"
    assert tasks["importer"][0].execution.schema_title == "system.ImporterExecution"
    assert tasks["read-model"][0].execution.metadata["output:Output"] == "importer:weights"
    assert tasks["read-model"][0].inputs["model"].artifacts[0].name == model.name


def test_a_platform_killed_mid_run_resumes_it_without_repeating_finished_tasks(sdk, platform, tmp_path):
    """kill -9 of the platform while two tasks run: one task's processes live on and the next platform
    adopts them; the other's are killed too, so its job is lost and the task's retry runs it again. The
    finished task is not run again, and the run completes."""
    import os
    import signal

    from kfp import compiler

    from tests.platform.job_scripts import kfp_resume
    from tests.platform.jobs_helpers import wait_state

    template = str(tmp_path / "resume.yaml")
    compiler.Compiler().compile(kfp_resume.resume, template)
    stamps, done = tmp_path / "stamps", tmp_path / "done"
    job = sdk.PipelineJob(display_name="resume", template_path=template, pipeline_root=ROOT, job_id="resume",
                          enable_caching=False, parameter_values={"stamp_path": str(stamps), "done_path": str(done)})
    job.submit()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # both waiting tasks' jobs are running
        got = requests.get(f"{platform.url}/v1/{job.resource_name}", timeout=10).json()
        tasks = {t["taskName"]: t for t in got.get("jobDetail", {}).get("taskDetails", [])}
        if all(tasks.get(n, {}).get("state") == "RUNNING" for n in ("wait-for", "wait-for-2")):
            break
        time.sleep(0.1)
    assert [tasks.get(n, {}).get("state") for n in ("wait-for", "wait-for-2")] == ["RUNNING"] * 2, got
    jobs_before = {n: tasks[n]["executorDetail"]["customJobDetail"]["job"] for n in ("stamp", "wait-for", "wait-for-2")}
    lost = (platform.workdir / "state" / "jobs" / jobs_before["wait-for-2"].rsplit("/", 1)[-1]).as_posix().encode()

    platform.stop(signal.SIGKILL)
    from tests.platform.conftest import live_processes

    for pid, cmdline, cwd in live_processes():  # the second task's processes die with the platform
        if lost in cmdline or cwd.startswith(lost):
            os.kill(pid, signal.SIGKILL)
    platform.start()
    done.touch()
    got = wait_state(platform, job.resource_name, ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED"))
    assert got["state"] == "PIPELINE_STATE_SUCCEEDED", got.get("error")
    tasks = {t["taskName"]: t for t in got["jobDetail"]["taskDetails"]}
    assert stamps.read_text() == "ran\n"  # the finished task did not run again
    assert tasks["stamp"]["executorDetail"]["customJobDetail"]["job"] == jobs_before["stamp"]
    assert tasks["wait-for"]["executorDetail"]["customJobDetail"]["job"] == jobs_before["wait-for"]  # adopted
    retried = tasks["wait-for-2"]
    assert retried["executorDetail"]["customJobDetail"]["job"] != jobs_before["wait-for-2"]  # a second attempt
    assert "lost while the platform was stopped" in retried["pipelineTaskStatus"][0]["error"]["message"]
    assert retried["execution"]["metadata"]["output:Output"] == "again"


def test_a_run_submitted_with_an_experiment_shows_in_its_data_frame(sdk, platform, tmp_path):
    from kfp import compiler

    from tests.platform.job_scripts import kfp_scored

    template = str(tmp_path / "scored.yaml")
    compiler.Compiler().compile(kfp_scored.scored, template)
    job = sdk.PipelineJob(display_name="scored", template_path=template, pipeline_root=ROOT, job_id="scored-1",
                          parameter_values={"rows": 4}, enable_caching=False)
    job.submit(experiment="pipeline-exp")
    job.wait()
    assert job.state.name == "PIPELINE_STATE_SUCCEEDED"
    again = job.clone(job_id="scored-2")  # made from the run as the platform returned it, not submitted
    assert again.job_id == "scored-2" and again.runtime_config.gcs_output_directory == ROOT
    assert job.get_associated_experiment().name == "pipeline-exp"
    root = job.task_details[0]
    assert root.execution.schema_title == "system.Run" and root.execution.state.name == "COMPLETE"
    df = sdk.get_experiment_df("pipeline-exp")
    row = df[df.run_name == "scored-1"].iloc[0]
    assert row.run_type == "system.PipelineRun" and row.state == "COMPLETE"
    assert row["param.rows"] == 4 and row["param.note"] == "first"  # given, and the default
    assert row["metric.accuracy"] == 0.5
    # No service account given: the project's Compute Engine default one, as Vertex fills it (Google's
    # test_pipeline_job reads it in the full view and not in the simple one).
    assert job.gca_resource.service_account.endswith("-compute@developer.gserviceaccount.com")
    simple = [j for j in sdk.PipelineJob.list(enable_simple_view=True) if j.resource_name == job.resource_name]
    assert simple and not simple[0].gca_resource.runtime_config.gcs_output_directory  # the read mask's fields only
    assert not simple[0].gca_resource.service_account
    assert simple[0].gca_resource.pipeline_spec["pipelineInfo"]["name"] == "scored"


def test_the_textbook_as_a_pipeline_of_google_cloud_pipeline_components(sdk, platform, gcs_emulator, tiny_models,
                                                                       tmp_path):
    """Train (CustomTrainingJobOp) -> upload (ModelUploadOp) -> endpoint (EndpointCreateOp) -> deploy
    (ModelDeployOp) -> batch predict (ModelBatchPredictOp), each op run by the platform's own launcher of
    it; the endpoint answers afterwards."""
    from google.cloud import storage
    from kfp import compiler

    from tests.platform.job_scripts import kfp_textbook

    tiny = tiny_models["models"]["tiny1"]
    base = f"gs://{STAGING_BUCKET}/textbook-pipeline"
    bucket = gcs_emulator["client"].bucket(STAGING_BUCKET)
    bucket.blob("textbook-pipeline/instances.jsonl").upload_from_string(
        "\n".join(json.dumps(i) for i in tiny_models["instances"]))
    template = str(tmp_path / "textbook.yaml")
    compiler.Compiler().compile(kfp_textbook.textbook(tiny["path"], f"{base}/train", f"{base}/instances.jsonl",
                                                      f"{base}/predictions"), template)
    job = sdk.PipelineJob(display_name="textbook", template_path=template, pipeline_root=ROOT, job_id="textbook",
                          enable_caching=False)
    endpoint = None
    try:
        try:
            job.run()
        except RuntimeError:  # the failed tasks' errors below say why
            pass
        tasks = {t.task_name: t for t in job.task_details}
        assert job.state.name == "PIPELINE_STATE_SUCCEEDED", [(n, t.state.name, t.error.message[-1500:])
                                                              for n, t in tasks.items() if t.state.name == "FAILED"]
        model = tasks["model-upload"].outputs["model"].artifacts[0]
        assert model.schema_title == "google.VertexModel" and model.metadata["resourceName"].startswith(
            "projects/local/locations/us-central1/models/")
        endpoint = sdk.Endpoint(tasks["endpoint-create"].outputs["endpoint"].artifacts[0].metadata["resourceName"])
        assert [m.model for m in endpoint.list_models()] == [model.metadata["resourceName"].split("@")[0]]
        got = endpoint.predict(instances=tiny_models["instances"]).predictions
        np.testing.assert_allclose(got, tiny["predictions"], atol=1e-5)  # the endpoint answers afterwards
        batch = sdk.BatchPredictionJob(tasks["model-batch-predict"].outputs["batchpredictionjob"].artifacts[0]
                                       .metadata["resourceName"])
        assert batch.state.name == "JOB_STATE_SUCCEEDED"
        lines = [json.loads(line) for blob in batch.iter_outputs() if "prediction.results" in blob.name
                 for line in blob.download_as_text().splitlines()]
        np.testing.assert_allclose(sorted(r["prediction"] for r in lines), sorted(tiny["predictions"]), atol=1e-5)
        assert json.loads(tasks["custom-training-job"].execution.metadata["output:gcp_resources"])["resources"][0][
            "resourceType"] == "CustomJob"
        assert storage.Blob.from_uri(f"{base}/train/model/saved_model.pb", client=gcs_emulator["client"]).exists()
    finally:
        if endpoint is not None:  # its replica is a process: gone with the test
            endpoint.undeploy_all()
            endpoint.delete()


# ---- the IR, one layer down (no process) -----------------------------------------------------------
def _spec(tasks: dict, components: dict | None = None, params: dict | None = None) -> dict:
    comps = components or {"comp-a": {"executorLabel": "exec-a"}}
    return {"schemaVersion": "2.1.0", "pipelineInfo": {"name": "p"},
            "root": {"dag": {"tasks": tasks}, "inputDefinitions": {"parameters": params or {}}},
            "components": comps,
            "deploymentSpec": {"executors": {"exec-a": {"container": {"image": "python:3.11", "command": ["sh"]}}}}}


def _task(*deps: str, **extra) -> dict:
    return {"componentRef": {"name": "comp-a"}, "dependentTasks": list(deps), "taskInfo": {"name": "t"}, **extra}


def test_ir_order_puts_every_task_after_its_upstream_and_refuses_cycles():
    spec = _spec({"c": _task("b"), "b": _task("a"), "a": _task()})
    assert pipeline_spec.order(pipeline_spec.check(spec)) == ["a", "b", "c"]
    with pytest.raises(ApiError, match="cycle"):
        pipeline_spec.check(_spec({"a": _task("b"), "b": _task("a")}))


@pytest.mark.parametrize("task, words", [
    (_task(triggerPolicy={"condition": "x"}), "conditions on groups"),
    (_task(parameterIterator={"items": {"raw": "[1]"}, "itemInput": "i"}), "loop's component must be a DAG"),
    (_task(iteratorPolicy={"parallelismLimit": 2}), "not a loop"),
    (_task(triggerPolicy={"strategy": "ANY_UPSTREAM"}), "strategy 'ANY_UPSTREAM'"),
    (_task("ghost"), "'ghost', not a task"),
])
def test_ir_features_not_run_yet_are_refused_naming_them(task, words):
    with pytest.raises(ApiError, match=words):
        pipeline_spec.check(_spec({"a": task}))


def test_ir_run_parameters_take_defaults_and_type_them():
    spec = _spec({"a": _task()}, params={"n": {"parameterType": "NUMBER_INTEGER", "defaultValue": 3.0},
                                         "s": {"parameterType": "STRING"}})
    assert pipeline_spec.run_parameters(spec, {"s": "x"}) == {"n": 3, "s": "x"}
    with pytest.raises(ApiError, match="'s'.* is required"):
        pipeline_spec.run_parameters(spec, {})
    with pytest.raises(ApiError, match="must be an integer"):
        pipeline_spec.run_parameters(spec, {"s": "x", "n": 2.5})


@pytest.mark.parametrize("expr, params, holds", [
    ("inputs.parameter_values['c'] == 'heads'", {"c": "heads"}, True),
    ("!(inputs.parameter_values['c'] == 'heads')", {"c": "heads"}, False),
    ("int(inputs.parameter_values['n']) > 3 && inputs.parameter_values['b'] == true", {"n": 5, "b": True}, True),
    ("inputs.parameter_values['x'] <= 0.5 || inputs.parameter_values['s'] != \"a\"", {"x": 0.7, "s": "a"}, False),
])
def test_ir_conditions_are_evaluated_as_cel_says(expr, params, holds):
    assert pipeline_spec.condition_holds(expr, params) is holds


@pytest.mark.parametrize("expr", ["__import__('os').system('true')", "inputs.parameter_values['nope'] == 1",
                                  "inputs.parameter_values['c'].size() > 1"])
def test_ir_conditions_it_cannot_read_are_refused(expr):
    with pytest.raises(ApiError):
        pipeline_spec.condition_holds(expr, {"c": "x"})


def test_ir_placeholders_are_filled_from_the_executor_input():
    ex = {"inputs": {"parameterValues": {"n": 3, "s": "hi"}, "artifacts": {"d": {"artifacts": [{"uri": "/gcs/b/d"}]}}},
          "outputs": {"parameters": {"o": {"outputFile": "/gcs/b/o"}}, "artifacts": {"m": {"artifacts": [{"uri": "/gcs/b/m"}]}},
                      "outputFile": "/gcs/b/x.json"}}
    got = pipeline_spec.fill(["{{$}}", "{{$.inputs.parameters['n']}}", "{{$.inputs.parameters['s']}}",
                              "{{$.inputs.artifacts['d'].path}}", "{{$.outputs.artifacts['m'].uri}}",
                              "{{$.outputs.parameters['o'].output_file}}"], ex)
    assert json.loads(got[0]) == ex and got[1:] == ["3", "hi", "/gcs/b/d", "/gcs/b/m", "/gcs/b/o"]


def test_ir_a_satisfied_pip_install_step_is_left_out_and_any_other_kept():
    import kfp

    def command(packages: str) -> list[str]:
        return ["sh", "-c", "\nif ! [ -x \"$(command -v pip)\" ]; then\n    python3 -m ensurepip\nfi\n\n"
                f"PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip install --quiet --no-warn-script-location {packages} "
                "&& \"$0\" \"$@\"\n", "sh", "-ec", "program", "source"]

    here = command(f"'kfp=={kfp.__version__}' '--no-deps' 'typing-extensions>=3.7.4,<5; python_version<\"3.9\"'")
    assert pipeline_spec.without_satisfied_install(here) == ["sh", "-ec", "program", "source"]
    for other in ("'kfp==2.0.0' '--no-deps'", "'no-such-package-here'", "'kfp' '--index-url' 'http://x'"):
        assert pipeline_spec.without_satisfied_install(command(other)) == command(other)


def test_ir_a_lightweight_components_step_is_forked_in_the_python_form_its_script_runs(tmp_path):
    """One layer down (warm_jobs.kfp_form): KFP's shell script for a lightweight component, compiled by the
    stock SDK, becomes the command it runs (``python3 -m kfp.dsl.executor_main`` through kfp_task) with its
    program written to a new folder under the replica's TMPDIR; anything else is left to the shell."""
    require("kfp", "pip install -e '.[test]'")
    from kfp import compiler

    from modelyard.platform.jobs import warm_jobs
    from tests.platform.job_scripts import kfp_two_step

    path = tmp_path / "two_step.yaml"
    compiler.Compiler().compile(kfp_two_step.two_step, str(path))
    spec = yaml.safe_load(path.read_text())
    container = spec["deploymentSpec"]["executors"]["exec-count"]["container"]
    command = pipeline_spec.without_satisfied_install(container["command"]) + ["--executor_input", "{}"]
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").symlink_to(sys.executable)
    env = {"PATH": str(tmp_path / "bin"), "TMPDIR": str(tmp_path)}
    argv, got_env = warm_jobs.kfp_form(command, env)
    program = Path(argv[5])
    assert argv[:6] == [str(tmp_path / "bin" / "python3"), "-m", "modelyard.platform.jobs.kfp_task",
                        "kfp.dsl.executor_main", "--component_module_path", str(program)]
    assert argv[6:] == ["--executor_input", "{}"] and got_env == {**env, "_KFP_RUNTIME": "true"}
    assert program.name == "ephemeral_component.py" and program.parent.parent == tmp_path
    assert program.read_text() == command[3] and "def count(" in command[3]
    assert warm_jobs.kfp_form(container["command"], env) is None  # its pip install still to run: the shell's
    assert warm_jobs.kfp_form(["sh", "-ec", "echo $0", "x"], env) is None
    assert warm_jobs.kfp_form(command, {"PATH": str(tmp_path / "nowhere")}) is None
    own = tmp_path / "own-python"  # a Python of the job's own (job_python), not seeing the platform's packages
    own.mkdir()
    (own / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    assert warm_jobs.kfp_form(command, {**env, "VIRTUAL_ENV": str(own)}) is None
    (own / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = true\n")
    assert warm_jobs.kfp_form(command, {**env, "VIRTUAL_ENV": str(own)}) is not None


def test_independent_tasks_run_together_and_cancel_mid_run_leaves_no_process(platform):
    """Two independent container components (the IR written by hand: no kfp needed) that would sleep a
    minute: both run at once; cancelling the run cancels both tasks' jobs."""
    from tests.platform.jobs_helpers import wait_gone, wait_state

    nap = {"componentRef": {"name": "comp-a"}, "taskInfo": {"name": "nap"}}
    spec = _spec({"nap-1": nap, "nap-2": nap})
    spec["deploymentSpec"]["executors"]["exec-a"]["container"] = {"image": "alpine", "command": ["sleep"],
                                                                  "args": ["60"]}
    made = requests.post(platform.api("pipelineJobs"), params={"pipelineJobId": "napping"}, timeout=10,
                         json={"displayName": "napping", "pipelineSpec": spec,
                               "runtimeConfig": {"gcsOutputDirectory": ROOT}})
    assert made.status_code == 200, made.text
    name = made.json()["name"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # both tasks' jobs are running
        got = requests.get(f"{platform.url}/v1/{name}", timeout=10).json()
        tasks = {t["taskName"]: t for t in got.get("jobDetail", {}).get("taskDetails", [])}
        if all(tasks.get(n, {}).get("state") == "RUNNING" for n in ("nap-1", "nap-2")):
            break
        time.sleep(0.1)
    assert [tasks.get(n, {}).get("state") for n in ("nap-1", "nap-2")] == ["RUNNING"] * 2, got
    jobs = [tasks[n]["executorDetail"]["customJobDetail"]["job"] for n in ("nap-1", "nap-2")]
    assert requests.post(f"{platform.url}/v1/{name}:cancel", timeout=10).status_code == 200
    got = wait_state(platform, name, ("PIPELINE_STATE_CANCELLED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_SUCCEEDED"))
    assert got["state"] == "PIPELINE_STATE_CANCELLED" and got["error"]["code"] == 1
    assert [requests.get(f"{platform.url}/v1/{j}", timeout=10).json()["state"] for j in jobs] == ["JOB_STATE_CANCELLED"] * 2
    assert wait_gone(platform) == []  # the sleep, its launcher and its job's process
    again = requests.post(f"{platform.url}/v1/{name}:cancel", timeout=10)
    assert again.status_code == 400 and again.json()["error"]["status"] == "FAILED_PRECONDITION"
    assert requests.delete(f"{platform.url}/v1/{name}", timeout=10).status_code == 200
    assert requests.get(f"{platform.url}/v1/{name}", timeout=10).status_code == 404


def test_ir_cache_key_follows_what_the_task_runs_and_is_given_not_where_it_writes():
    spec = _spec({"a": _task(cachingOptions={"enableCache": True}), "b": _task()})
    given = {"parameters": {"n": 1}, "artifacts": {"d": [{"uri": "gs://b/r1/x/d", "name": "one",
                                                          "type": {"schemaTitle": "system.Dataset"}}]}}
    key = pipeline_spec.cache_key(spec, "a", given)
    assert key and key == pipeline_spec.cache_key(spec, "a", {**given, "artifacts": {"d": [
        {**given["artifacts"]["d"][0], "name": "another name, same object"}]}})
    assert key != pipeline_spec.cache_key(spec, "a", {**given, "parameters": {"n": 2}})
    spec["deploymentSpec"]["executors"]["exec-a"]["container"]["command"] = ["bash"]
    assert key != pipeline_spec.cache_key(spec, "a", given)
    assert pipeline_spec.cache_key(spec, "b", given) is None  # its caching is off


def _loop_spec(items: dict, outputs: dict | None = None) -> dict:
    """A root loop 'loop' whose body runs 'a' (comp-a) on each item, its outputs as given."""
    spec = _spec({"loop": {"componentRef": {"name": "comp-loop"}, "taskInfo": {"name": "loop"},
                           "parameterIterator": {"itemInput": "item", "items": items}}})
    spec["components"]["comp-loop"] = {"dag": {"tasks": {"a": _task()}, **({"outputs": outputs} if outputs else {})}}
    return spec


def test_ir_loops_items_and_collected_outputs():
    spec = pipeline_spec.check(_loop_spec({"raw": "[1, 2]"}, {"parameters": {"xs": {"valueFromParameter": {
        "producerSubtask": "a", "outputParameterKey": "Output"}}}}))
    assert pipeline_spec.order(spec) == ["loop", "loop/a"] and pipeline_spec.is_loop(spec, "loop")
    empty = {"parameters": {}, "artifacts": {}}
    assert pipeline_spec.loop_items(spec, "loop", empty) == [1, 2]
    assert pipeline_spec.iteration_inputs(spec, "loop", empty, 2)["parameters"] == {"item": 2}
    # one iteration's share, then all of them in item order (an iteration that gave none adds nothing)
    share = pipeline_spec.dag_outputs(spec, "loop", {"a": {"parameters": {"Output": 7}}})
    assert share == {"parameters": {"xs": 7}, "artifacts": {}}
    assert pipeline_spec.collected(spec, "loop", [share, {}, {"parameters": {"xs": 9}}])["parameters"] == {"xs": [7, 9]}
    assert pipeline_spec.collected(spec, "loop", [])["parameters"] == {"xs": []}  # no items: an empty list
    given = pipeline_spec.check(_loop_spec({"inputParameter": "things"}))
    assert pipeline_spec.loop_items(given, "loop", {"parameters": {"things": '["x"]'}, "artifacts": {}}) == ["x"]
    with pytest.raises(ApiError, match="must be a list"):
        pipeline_spec.loop_items(given, "loop", {"parameters": {"things": 3}, "artifacts": {}})
    with pytest.raises(ApiError, match="must be a JSON list"):
        pipeline_spec.check(_loop_spec({"raw": "{}"}))
    with pytest.raises(ApiError, match="'ghost', not a task of its DAG"):
        pipeline_spec.check(_loop_spec({"raw": "[1]"}, {"parameters": {"xs": {"valueFromParameter": {
            "producerSubtask": "ghost", "outputParameterKey": "Output"}}}}))


def test_ir_a_oneof_takes_the_branch_that_ran_and_a_loop_item_field_is_selected():
    spec = _spec({"g": {"componentRef": {"name": "comp-g"}, "taskInfo": {"name": "g"}}})
    spec["components"]["comp-g"] = {"dag": {"tasks": {"c1": _task(), "c2": _task()}, "outputs": {"parameters": {
        "o": {"valueFromOneof": {"parameterSelectors": [{"producerSubtask": "c1", "outputParameterKey": "Output"},
                                                        {"producerSubtask": "c2", "outputParameterKey": "Output"}]}}}}}}
    pipeline_spec.check(spec)
    assert pipeline_spec.dag_outputs(spec, "g", {"c2": {"parameters": {"Output": "two"}}})["parameters"] == {"o": "two"}
    assert pipeline_spec.select('{"a": {"b": 1}}', 'parseJson(string_value)["a"]', "f") == {"b": 1}
    assert pipeline_spec.select({"n": 3}, 'parseJson(string_value)["n"]', "f") == 3
    with pytest.raises(ApiError, match="selects nothing"):
        pipeline_spec.select({"n": 3}, 'parseJson(string_value)["m"]', "f")
    with pytest.raises(ApiError, match="not one modelyard runs"):
        pipeline_spec.select({"n": 3}, "size(string_value)", "f")


def test_ir_tasks_are_named_in_their_dag_so_a_nested_pipeline_may_reuse_a_name():
    spec = _spec({"a": _task(), "inner": {"componentRef": {"name": "comp-inner"}, "taskInfo": {"name": "inner"}},
                  "inner-2": {"componentRef": {"name": "comp-inner"}, "taskInfo": {"name": "inner-2"}}})
    spec["components"]["comp-inner"] = {"dag": {"tasks": {"a": _task()}}}
    assert sorted(pipeline_spec.order(pipeline_spec.check(spec))) == ["a", "inner", "inner-2", "inner-2/a", "inner/a"]
    assert pipeline_spec.children(spec, "inner-2") == ["inner-2/a"] and pipeline_spec.local("inner-2/a") == "a"


def test_a_read_mask_keeps_only_the_fields_it_names():
    from modelyard.platform.jobs.pipeline_routes import _masked

    job = {"name": "n", "state": "S", "pipelineSpec": {"pipelineInfo": {"name": "p"}, "root": {}},
           "runtimeConfig": {"gcsOutputDirectory": "gs://b"}, "jobDetail": {"pipelineRunContext": {"name": "c"}}}
    assert _masked(job, "name,pipeline_spec.pipeline_info,job_detail.pipeline_run_context,start_time") == {
        "name": "n", "pipelineSpec": {"pipelineInfo": {"name": "p"}}, "jobDetail": {"pipelineRunContext": {"name": "c"}}}


def test_ir_retry_policy_and_importer():
    spec = _spec({"a": _task(retryPolicy={"maxRetryCount": 3, "backoffDuration": "2s", "backoffFactor": 3,
                                          "backoffMaxDuration": "5s"}), "b": _task()})
    assert pipeline_spec.retry_policy(spec, "a") == (3, 2.0, 3.0, 5.0)
    assert pipeline_spec.retry_policy(spec, "b")[0] == 0
    spec = _spec({"imp": {"componentRef": {"name": "comp-imp"}, "taskInfo": {"name": "imp"},
                          "inputs": {"parameters": {"uri": {"componentInputParameter": "where"}}}}},
                 {"comp-imp": {"executorLabel": "exec-imp", "outputDefinitions": {"artifacts": {"artifact": {}}}}})
    spec["deploymentSpec"]["executors"]["exec-imp"] = {"importer": {
        "artifactUri": {"runtimeParameter": "uri"}, "typeSchema": {"schemaTitle": "system.Model"},
        "metadata": {"from": "{{$.inputs.parameters['uri']}}"}}}
    pipeline_spec.check(spec)
    got = pipeline_spec.imported(spec, "imp", {"parameters": {"uri": "gs://b/m"}, "artifacts": {}})
    assert got["artifacts"]["artifact"][0] == {"name": "artifact", "type": {"schemaTitle": "system.Model"},
                                               "uri": "gs://b/m", "metadata": {"from": "gs://b/m"}, "reimport": False}
    with pytest.raises(ApiError, match="non-empty string"):
        pipeline_spec.imported(spec, "imp", {"parameters": {}, "artifacts": {}})
    spec["deploymentSpec"]["executors"]["exec-imp"]["importer"]["artifactUri"] = {"runtimeParameter": "nope"}
    with pytest.raises(ApiError, match="'nope' is not one of its inputs"):
        pipeline_spec.check(spec)


def test_ir_structured_placeholders_of_google_ops_are_evaluated():
    ex = {"inputs": {"parameterValues": {"name": "m", "labels": {"a": "b"}},
                     "artifacts": {"model": {"artifacts": [{"uri": "gs://b/m", "metadata": {"resourceName": "r/1"}}]}}},
          "outputs": {"parameters": {}, "artifacts": {}, "outputFile": "/gcs/b/o.json"}}
    args = ["--payload", json.dumps({"Concat": ["{\"n\": \"", "{{$.inputs.parameters['name']}}", "\", \"labels\": ",
                                                "{{$.inputs.parameters['labels']}}", {"IfPresent": {
                                                    "InputName": "model", "Then": {"Concat": [
                                                        ", \"model\": \"", "{{$.inputs.artifacts['model'].metadata"
                                                        "['resourceName']}}", "\""]}}}, "}"]}),
            json.dumps({"IfPresent": {"InputName": "parent", "Then": ["--parent", "x"]}}),
            json.dumps({"IfPresent": {"InputName": "model", "Then": ["--model", "{{$.inputs.artifacts['model'].uri}}"]}}),
            "projects/p/pipelineJobs/{{$.pipeline_job_uuid}}"]
    got = pipeline_spec.fill(args, ex, {"pipeline_job_uuid": "run-1"})
    assert json.loads(got[1]) == {"n": "m", "labels": {"a": "b"}, "model": "r/1"}
    assert got[2:] == ["--model", "gs://b/m", "projects/p/pipelineJobs/run-1"]  # an absent input's IfPresent: gone
    with pytest.raises(ApiError, match="not one modelyard runs"):
        pipeline_spec.fill([json.dumps({"Concat": [{"Unknown": 1}]})], ex)


def test_google_ops_map_to_the_platforms_launcher_and_others_are_refused():
    from modelyard.platform.jobs import pipeline_gcpc

    launcher = ["python3", "-u", "-m", "google_cloud_pipeline_components.container.v1.model.upload_model.launcher"]
    assert pipeline_gcpc.mapped(launcher) == ["python3", "-u", "-m", "modelyard.platform.jobs.pipeline_gcpc",
                                              "model.upload_model.launcher"]
    assert pipeline_gcpc.mapped(["python3", "-m", "kfp.dsl.executor_main"]) is None
    spec = _spec({"a": _task()})
    spec["deploymentSpec"]["executors"]["exec-a"]["container"]["command"] = [
        "python3", "-u", "-m", "google_cloud_pipeline_components.container.v1.dataflow.dataflow_launcher"]
    with pytest.raises(ApiError, match="dataflow_launcher is a Google Cloud Pipeline Components op modelyard does not"):
        pipeline_spec.check(spec)
    # the op's payload as a REST body: camelCase, unset ("" / [] / {}) fields left out, a user's map kept
    assert pipeline_gcpc._clean({"display_name": "x", "service_account": "", "labels": {"my_key": "v"},
                                 "job_spec": {"worker_pool_specs": [{"machine_spec": {"machine_type": "n"}}],
                                              "reserved_ip_ranges": [], "enable_web_access": False}}) == {
        "displayName": "x", "labels": {"my_key": "v"},
        "jobSpec": {"workerPoolSpecs": [{"machineSpec": {"machineType": "n"}}], "enableWebAccess": False}}


class _RecordingStore:
    """The store calls ``pipeline_jobs.follow`` makes, recorded: (job id, the values it set)."""

    def __init__(self) -> None:
        self.calls: list = []

    def update_job(self, job_id, from_states=None, **values):
        self.calls.append((job_id, values))
        return True


class _RecordingRunner:
    """A job runner stand-in for ``pipeline_jobs.follow`` without processes: its store records, wake does nothing."""

    def __init__(self) -> None:
        self.store = _RecordingStore()

    def wake(self) -> None:
        pass


def test_a_run_whose_steps_keep_failing_ends_failed_saying_why_not_running_forever():
    from modelyard.platform.jobs import pipeline_jobs
    from modelyard.platform.jobs.job_runner import FAILED, RUNNING

    runner = _RecordingRunner()
    row = {"id": "broken", "state": RUNNING, "spec": {}, "started": 1.0,  # no pipelineSpec: every step raises
           "result": {pipeline_jobs.TASKS: {"t": {"kind": "job", "state": "RUNNING", "job": "task-job"}}}}
    for _ in range(pipeline_jobs.MAX_BROKEN_TICKS - 1):
        with pytest.raises(KeyError):
            pipeline_jobs.follow(runner, row)
    assert runner.store.calls == []
    pipeline_jobs.follow(runner, row)
    ended = {job: values for job, values in runner.store.calls}
    assert ended["task-job"]["state"] == "JOB_STATE_CANCELLED"  # its tasks' jobs stop with it
    assert ended["broken"]["state"] == FAILED and "failed 5 times in a row: KeyError" in ended["broken"]["error"]["message"]


def test_a_run_whose_only_failure_is_a_group_failing_at_entry_ends_failed_naming_it():
    """A group whose condition's input its upstream task never wrote fails at entry, with no failed task
    inside it: the run ends FAILED naming the group once nothing runs (it stayed RUNNING forever)."""
    from modelyard.platform.jobs import pipeline_jobs
    from modelyard.platform.jobs.job_runner import FAILED, RUNNING

    out = {"parameters": {"Output": {"parameterType": "STRING"}}}
    spec = _spec({"a": _task(taskInfo={"name": "a"}),
                  "g": {"componentRef": {"name": "comp-g"}, "dependentTasks": ["a"], "taskInfo": {"name": "g"},
                        "inputs": {"parameters": {"coin": {"taskOutputParameter": {
                            "producerTask": "a", "outputParameterKey": "Output"}}}},
                        "triggerPolicy": {"condition": "inputs.parameter_values['coin'] == 'heads'"}}},
                 {"comp-a": {"executorLabel": "exec-a", "outputDefinitions": out},
                  "comp-g": {"dag": {"tasks": {"b": _task(taskInfo={"name": "b"})}},
                             "inputDefinitions": {"parameters": {"coin": {"parameterType": "STRING"}}}}})
    spec = pipeline_spec.check(spec)
    runner = _RecordingRunner()
    row = {"id": "run", "state": RUNNING, "created": 1.0, "started": 1.0, "display_name": "run",
           "parent": "projects/local/locations/us-central1",
           "spec": {"pipelineSpec": spec, "runtimeConfig": {"gcsOutputDirectory": "gs://b0/root"}},
           "result": {pipeline_jobs.TASKS: {"a": {  # succeeded, but its outputs were unreadable: none
               "kind": "job", "state": "SUCCEEDED", "id": 1, "created": 1.0, "ended": 2.0, "job": "a-job",
               "outputs": {"parameters": {}, "artifacts": {}}}}}}
    pipeline_jobs.follow(runner, row)
    ended = [values for job, values in runner.store.calls if job == "run" and "state" in values]
    assert len(ended) == 1 and ended[0]["state"] == FAILED, runner.store.calls
    assert "The failed tasks are: [g]" in ended[0]["error"]["message"]
    tasks = ended[0]["result"][pipeline_jobs.TASKS]
    assert tasks["g"]["state"] == "FAILED" and "coin" in tasks["g"]["error"]["message"]


def test_a_task_whose_outputs_cannot_be_read_fails_saying_why_not_succeeds_with_none(tmp_path, monkeypatch):
    """A task's job SUCCEEDED but storage refuses its output directory (here its bucket is a symlink out of
    the storage root): the task FAILED with storage's reason, not SUCCEEDED with empty outputs."""
    from types import SimpleNamespace

    from modelyard.platform.jobs import pipeline_jobs, pipeline_metadata
    from modelyard.platform.jobs.job_runner import RUNNING, SUCCEEDED

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "bkt").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setattr(pipeline_metadata, "task_execution", lambda *a: {"state": a[-1]})  # no ML Metadata here

    class Store:
        engine = None

        def get_job(self, job_id):
            return {"state": SUCCEEDED, "started": 1.0, "ended": 2.0}

    runner = SimpleNamespace(store=Store(), platform=SimpleNamespace(config=SimpleNamespace(
        storage_root=tmp_path / "root")))
    spec = pipeline_spec.check(_spec({"a": _task(taskInfo={"name": "a"})}))
    t = {"kind": "job", "state": "RUNNING", "job": "a-job", "root": "gs://bkt/root/run/a", "planned": {}}
    assert pipeline_jobs._poll(runner, {"id": "run", "state": RUNNING}, spec, "a", t)
    assert t["state"] == "FAILED" and "outputs" not in t, t
    assert t["error"]["message"].startswith("task a: its outputs could not be read:") and "symlink" in t["error"]["message"]
    assert t["execution"] == {"state": "FAILED"}


def test_a_gcs_path_whose_bucket_name_storage_refuses_is_refused_not_made_a_host_folder(tmp_path):
    """/gcs/b/... (a bucket name of 2 characters) was left as it stood, so a job wrote the host's /gcs/b:
    refused at create (check_storage) and, for a job made before, failed when its paths are mapped."""
    from modelyard.platform.jobs import job_env
    from modelyard.platform.jobs.job_runner import JobFailed

    with pytest.raises(ApiError, match=r"/gcs/b/: Invalid bucket name: 'b'") as refused:
        job_env.check_storage({"workerPoolSpecs": [{"containerSpec": {"imageUri": "i", "args": ["--out=/gcs/b/o"]}}]})
    assert refused.value.status == "INVALID_ARGUMENT"
    with pytest.raises(ApiError, match="Invalid bucket name: 'Up'"):
        job_env.gcs_buckets(["x", "/gcs/Up/k"])
    (tmp_path / "root" / "bkt").mkdir(parents=True)
    mount = job_env.GcsMount(tmp_path / "work", str(tmp_path / "root"))
    assert mount.rewrite("--out=/gcs/bkt/o") == f"--out={tmp_path}/root/bkt/o"  # a served bucket: its own file
    for bad in (["--out=/gcs/b/o"], ["sh", "-c", "echo 1 > /gcs/a_/x"]):
        with pytest.raises(JobFailed, match="Invalid bucket name"):
            mount.stage_in(bad)
        with pytest.raises(JobFailed, match="Invalid bucket name"):
            [mount.rewrite(s) for s in bad]
    assert not (tmp_path / "work").exists()  # nothing made for it
