"""Vertex AI ``PipelineJob``: a compiled KFP v2 pipeline whose tasks run as the platform's CustomJobs.

A pipeline job runs no process of its own. On each tick of the job runner (``follow``) it looks at
its tasks: a task whose upstream tasks all succeeded becomes a ``customJobs`` resource (its
container's command and args, placeholders filled with its KFP executor input: ``pipeline_spec``),
so it runs under the one job runner with every job's environment, limits, logs and cancel; independent
tasks are created together and run side by side. When a task's job ends, its executor output is read
from ``{gcsOutputDirectory}/{job id}/{task}/executor_output.json`` and its artifacts (planned under the
same directory) recorded; the run ends SUCCEEDED when every task did, FAILED (naming the failed
tasks, as Vertex words it) when none can run any more. Each run is a ``system.PipelineRun`` context
in ML Metadata with one execution per task and its artifacts as events (``pipeline_metadata``).
States are Vertex's ``PIPELINE_STATE_*`` (stored as the runner's ``JOB_STATE_*``: same numbers).
What follow keeps between ticks is in the row's result (``_tasks``), so a restarted platform goes on.
"""
from __future__ import annotations

import json
import time

from modelyard import objstore
from modelyard.platform.api.errors import ApiError, invalid
from modelyard.platform.api.names import Route
from modelyard.platform.api.timefmt import rfc3339
from modelyard.platform.jobs import jobs, pipeline_metadata, pipeline_spec
from modelyard.platform.jobs.job_runner import CANCELLED, CANCELLING, FAILED, PENDING, RUNNING, SUCCEEDED

TASKS = "_tasks"
# SKIPPED: Vertex's state of a task whose outputs came from the cache; NOT_TRIGGERED: a dsl.If group whose
# condition did not hold (what depends on it still runs).
DONE = ("SUCCEEDED", "SKIPPED", "NOT_TRIGGERED")
ENDED = DONE + ("FAILED", "CANCELLED")
_TASK_STATE = {PENDING: "PENDING", RUNNING: "RUNNING", SUCCEEDED: "SUCCEEDED", FAILED: "FAILED",
               CANCELLING: "CANCELLING", CANCELLED: "CANCELLED"}
_EXECUTION_STATE = {"SUCCEEDED": "COMPLETE", "FAILED": "FAILED", "CANCELLED": "CANCELLED", "RUNNING": "RUNNING",
                    "PENDING": "NEW", "CANCELLING": "RUNNING"}


async def validate(p, route: Route, body: dict) -> tuple[dict, dict]:
    spec = pipeline_spec.check(body.get("pipelineSpec"))
    runtime = body.get("runtimeConfig") or {}
    if not isinstance(runtime, dict):
        raise invalid("PipelineJob.runtime_config must be an object.")
    root = runtime.get("gcsOutputDirectory") or spec.get("defaultPipelineRoot")
    if not isinstance(root, str) or not root.startswith("gs://") or len(root.rstrip("/")) <= len("gs://"):
        raise invalid("PipelineJob.runtime_config.gcs_output_directory is required: a gs:// URI under which "
                      f"the run's artifacts are written (got {root!r}).")
    if runtime.get("parameters"):
        raise invalid("runtime_config.parameters (the v1 form) is not supported: use parameter_values.")
    if runtime.get("inputArtifacts"):
        raise invalid("runtime_config.input_artifacts is not supported by modelyard yet.")
    pipeline_spec.run_parameters(spec, runtime.get("parameterValues"))  # refused now, nothing made
    stored = {k: v for k, v in body.items() if k not in ("displayName", "labels", "name", "state", "jobDetail")}
    stored["runtimeConfig"] = {**runtime, "gcsOutputDirectory": root}
    return stored, {}


def render(out: dict, enum_ints: bool) -> None:
    if not enum_ints:  # PipelineState's numbers are JobState's
        out["state"] = out["state"].replace("JOB_STATE_", "PIPELINE_STATE_")


def cancel(p, route: Route, row: dict) -> dict:
    """The run moves to CANCELLING; ``follow`` cancels its running tasks' jobs and ends it CANCELLED."""
    return jobs.follow_to_cancelled(p, row, "PipelineJob")


# ---- the runner side (the leading platform's job runner, in its worker thread) ------------------
def follow(runner, row: dict) -> None:
    """One step of a run: settle ended tasks, start the tasks that can start, end the run when done."""
    store = runner.store
    spec = row["spec"]["pipelineSpec"]
    result = dict(row["result"] or {})
    tasks = {k: dict(v) for k, v in (result.get(TASKS) or {}).items()}
    changed = False
    if row["state"] == PENDING:
        ctx = pipeline_metadata.run_context(store.engine, row)
        result["jobDetail"] = {"pipelineRunContext": ctx, "pipelineContext": ctx}
        store.update_job(row["id"], (PENDING,), state=RUNNING, started=time.time(), result=result)
        row = {**row, "state": RUNNING, "result": result, "started": time.time()}
    for name, t in tasks.items():  # tasks whose job ended since the last tick
        if t["state"] in ENDED or not t.get("job"):  # ended, or a group (it runs no job: _settle_groups)
            continue
        try:
            job = store.get_job(t["job"])
        except ApiError:
            job = {"state": FAILED, "error": {"code": 13, "message": "the task's custom job is gone"},
                   "started": None, "ended": time.time()}
        if row["state"] == CANCELLING and job["state"] in (PENDING, RUNNING):
            if not store.update_job(t["job"], (PENDING,), state=CANCELLED, ended=time.time()):
                if store.update_job(t["job"], (RUNNING,), state=CANCELLING):
                    runner.wake()
            continue
        state = _TASK_STATE[job["state"]]
        if job["started"] and not t.get("started"):
            t["started"], changed = job["started"], True
        if state != t["state"] and state in ("SUCCEEDED", "FAILED", "CANCELLED"):
            t.update(state=state, ended=job["ended"] or time.time())
            if state == "SUCCEEDED":
                t["outputs"] = pipeline_spec.task_outputs(spec, name, _executor_output(t["root"]), t["planned"])
            elif job.get("error"):
                t["error"] = job["error"]
            t["execution"] = pipeline_metadata.task_execution(store.engine, row, name, t, _EXECUTION_STATE[state])
            changed = True
        elif state != t["state"]:
            t["state"], changed = state, True
        tasks[name] = t
    def save() -> None:  # each started task at once: a tick cut short never starts a task twice
        store.update_job(row["id"], (RUNNING, CANCELLING), result={**result, TASKS: tasks})

    while True:  # a group that ends may let an exit task start, whose cache hit may end a group...
        moved = _settle_groups(row, spec, tasks)
        moved |= row["state"] == RUNNING and _start_ready(runner, row, spec, tasks, save)
        changed |= moved
        if not moved:
            break
    active = [n for n, t in tasks.items() if t["state"] not in ENDED]
    if changed:
        result[TASKS] = tasks
        result["jobDetail"] = _job_detail(row, spec, tasks, result.get("jobDetail") or {})
        store.update_job(row["id"], (RUNNING, CANCELLING), result=result)
    if active:
        return
    failed = sorted(n for n, t in tasks.items() if t["state"] == "FAILED" and not pipeline_spec.is_group(spec, n))
    if row["state"] == CANCELLING:
        _end(store, row, CANCELLED, ApiError("CANCELLED", "CANCELED").to_rpc_status(), result)
    elif failed:
        _end(store, row, FAILED, ApiError("FAILED_PRECONDITION", "The DAG failed because some tasks failed. The failed "
                                          f"tasks are: [{', '.join(failed)}].").to_rpc_status(), result)
    elif all(tasks.get(n, {}).get("state") in DONE for n in pipeline_spec.root_names(spec)):
        _end(store, row, SUCCEEDED, None, result)


def _start_ready(runner, row: dict, spec: dict, tasks: dict, save) -> bool:
    """Create the custom job of every task whose upstream tasks all succeeded (fail-slow, as Vertex's
    default: a failed task stops only what depends on it); True if any started."""
    started = False
    params = pipeline_spec.run_parameters(spec, row["spec"]["runtimeConfig"].get("parameterValues"))
    for name in pipeline_spec.order(spec):
        if name in tasks:
            continue
        group = pipeline_spec.parent_of(spec, name)
        if group is not None and tasks.get(group, {}).get("state") != "RUNNING":
            continue  # its group has not started, or did not hold, or ended
        task = pipeline_spec.tasks(spec)[name]
        ready = ENDED if (task.get("triggerPolicy") or {}).get("strategy") == pipeline_spec.ALL_COMPLETED else DONE
        if not all(tasks.get(u, {}).get("state") in ready for u in pipeline_spec.upstream(task)):
            continue
        # read now: an upstream task may have been taken from the cache earlier in this pass
        outputs = {n: {**(t.get("outputs") or {}), "status": {
            "state": t["state"], "error": t.get("error") or {},
            "pipelineJobResourceName": f"{row['parent']}/pipelineJobs/{row['id']}"}} for n, t in tasks.items()}
        scope = tasks[group]["inputs"] if group is not None else {"parameters": params, "artifacts": {}}
        if pipeline_spec.is_group(spec, name):
            tasks[name] = _enter_group(spec, name, scope, outputs)
        else:
            tasks[name] = _start(runner, row, spec, name, scope, outputs)
        save()
        started = True
    return started


def _enter_group(spec: dict, name: str, scope: dict, outputs: dict) -> dict:
    """A group task (dsl.If branch, nested pipeline): its inputs resolved, its condition evaluated over
    them: RUNNING (its tasks may start) or NOT_TRIGGERED; FAILED saying why when it cannot be read."""
    now = time.time()
    try:
        inputs = pipeline_spec.task_inputs(spec, name, scope["parameters"], outputs, scope["artifacts"])
        condition = (pipeline_spec.tasks(spec)[name].get("triggerPolicy") or {}).get("condition")
        holds = pipeline_spec.condition_holds(condition, inputs["parameters"]) if condition else True
    except ApiError as exc:
        return {"state": "FAILED", "created": now, "ended": now, "inputs": {"parameters": {}, "artifacts": {}},
                "error": ApiError(exc.status, f"task {name}: {exc.message}").to_rpc_status()}
    return {"state": "RUNNING" if holds else "NOT_TRIGGERED", "created": now, "started": now,
            **({} if holds else {"ended": now}), "inputs": inputs}


def _settle_groups(row: dict, spec: dict, tasks: dict) -> bool:
    """A running group ends when its tasks have: SUCCEEDED when each is done; FAILED (or CANCELLED) when
    none is running any more and one failed (or the run is being cancelled). Inner groups first."""
    changed = False
    for name in reversed(pipeline_spec.order(spec)):
        t = tasks.get(name)
        if t is None or t["state"] != "RUNNING" or t.get("job"):
            continue
        children = [n for n in pipeline_spec.order(spec) if pipeline_spec.parent_of(spec, n) == name]
        states = [tasks[n]["state"] if n in tasks else None for n in children]
        if any(s is not None and s not in ENDED for s in states):
            continue
        if all(s in DONE for s in states):
            end = "SUCCEEDED"
        elif row["state"] == CANCELLING:
            end = "CANCELLED"
        elif any(s in ("FAILED", "CANCELLED") for s in states):
            end = "FAILED"
        else:
            continue
        t.update(state=end, ended=time.time())
        failed = [tasks[n] for n in children if n in tasks and tasks[n].get("error")]
        if end != "SUCCEEDED" and failed:  # its first failed task's error (what an exit task is told)
            t["error"] = failed[0]["error"]
        changed = True
    return changed


def _start(runner, row: dict, spec: dict, name: str, scope: dict, outputs: dict) -> dict:
    root = row["spec"]["runtimeConfig"]["gcsOutputDirectory"].rstrip("/")
    task_root = f"{root}/{row['id']}/{name}"
    now = time.time()
    try:
        inputs = pipeline_spec.task_inputs(spec, name, scope["parameters"], outputs, scope["artifacts"])
        key = pipeline_spec.cache_key(spec, name, inputs)
        hit = pipeline_metadata.cached(runner.store.engine, row, key) if key else None
        if hit is not None:  # no job: the outputs of the same task run before
            t = {"state": "SKIPPED", "created": now, "started": now, "ended": now, "root": task_root,
                 "inputs": inputs, "planned": {}, "outputs": hit, "cache_key": key}
            t["execution"] = pipeline_metadata.task_execution(runner.store.engine, row, name, t, "CACHED")
            return t
        planned = pipeline_spec.output_artifacts(spec, name, task_root)
        ex_input = pipeline_spec.executor_input(spec, name, inputs, planned, task_root, _gcs_path)
        container = pipeline_spec.container(spec, pipeline_spec.tasks(spec)[name])
        body = {"displayName": f"{row['display_name']}-{name}"[:128], "labels": {"modelyard-pipeline-job": row["id"]},
                "jobSpec": {"workerPoolSpecs": [{"replicaCount": 1, "machineSpec": {"machineType": "e2-standard-4"},
                                                 "containerSpec": {
                    "imageUri": container.get("image", ""),
                    "command": pipeline_spec.without_satisfied_install(
                        pipeline_spec.fill(list(container.get("command") or []), ex_input)),
                    "args": pipeline_spec.fill(list(container.get("args") or []), ex_input),
                    "env": [{"name": e["name"], "value": str(e.get("value", ""))} for e in container.get("env") or []]}}]}}
        parent = row["parent"].split("/")
        job = runner.call_platform(lambda p: jobs.create(p, Route(parent[1], parent[3], "customJobs"), body))
    except (ApiError, objstore.StorageError) as exc:  # the task fails saying why; the run goes on (fail-slow)
        return {"state": "FAILED", "created": now, "ended": now, "root": task_root, "planned": {},
                "inputs": {"parameters": {}, "artifacts": {}},
                "error": ApiError(exc.status, f"task {name}: {exc.message}").to_rpc_status()}
    runner.wake()
    return {"state": "PENDING", "job": job["name"].rsplit("/", 1)[-1], "created": now, "root": task_root,
            "inputs": inputs, "planned": planned, "cache_key": key}


def _gcs_path(uri: str) -> str:
    """gs://b/k as the task sees it: /gcs/b/k (the job code maps it to the platform's storage)."""
    return "/gcs/" + uri[len("gs://"):] if uri.startswith("gs://") else uri


def _executor_output(task_root: str) -> dict | None:
    uri = f"{task_root}/executor_output.json"
    try:
        objstore.filesystem("gs").invalidate_cache()  # written by the task, not through this client
        text = objstore.read_text(uri)
        return json.loads(text) if text else None
    except (objstore.StorageError, ValueError):
        return None


def _job_detail(row: dict, spec: dict, tasks: dict, detail: dict) -> dict:
    """``jobDetail`` as Vertex reports it: the root DAG's task, then one per task that was started."""
    names = pipeline_spec.order(spec)
    root_id = str(1000 + len(names))
    pipeline_name = spec["pipelineInfo"]["name"]
    states = [t["state"] for t in tasks.values()]
    root_state = ("FAILED" if "FAILED" in states else "SUCCEEDED" if all(
        tasks.get(n, {}).get("state") in DONE for n in pipeline_spec.root_names(spec)) else "RUNNING")
    ids = {name: str(1000 + i) for i, name in enumerate(names)}
    out = [{"taskId": root_id, "taskName": pipeline_name, "state": root_state,
            "createTime": rfc3339(row["created"]), **({"startTime": rfc3339(row["started"])} if row["started"] else {}),
            "execution": {"displayName": pipeline_name, "schemaTitle": "system.DAGExecution"}}]
    parent = row["parent"]
    for name in names:
        t = tasks.get(name)
        if t is None:
            continue
        group = pipeline_spec.parent_of(spec, name)
        entry = {"taskId": ids[name], "parentTaskId": ids[group] if group else root_id, "taskName": name,
                 "state": t["state"], "createTime": rfc3339(t["created"])}
        if pipeline_spec.is_group(spec, name):
            entry["execution"] = {"displayName": name, "schemaTitle": "system.DAGExecution"}
        if t.get("started"):
            entry["startTime"] = rfc3339(t["started"])
        if t.get("ended"):
            entry["endTime"] = rfc3339(t["ended"])
        if t.get("job"):
            entry["executorDetail"] = {"customJobDetail": {"job": f"{parent}/customJobs/{t['job']}"}}
        if t.get("error"):
            entry["error"] = t["error"]
        if t.get("execution"):
            entry["execution"] = t["execution"]
        entry["inputs"] = {k: {"artifacts": [pipeline_metadata.artifact_resource(a) for a in v]}
                           for k, v in (t.get("inputs") or {}).get("artifacts", {}).items()}
        arts = (t.get("outputs") or {}).get("artifacts") or (t.get("planned") if t["state"] not in DONE else {})
        entry["outputs"] = {k: {"artifacts": [pipeline_metadata.artifact_resource(a) for a in v]}
                            for k, v in (arts or {}).items()}
        out.append(entry)
    return {**detail, "taskDetails": out}


def _end(store, row: dict, state: str, error, result: dict) -> None:
    store.update_job(row["id"], (PENDING, RUNNING, CANCELLING), state=state, error=error, result=result,
                     ended=time.time(), started=row["started"] or time.time())


def task_log_jobs(row: dict) -> list[str]:
    """The custom jobs a run's tasks ran as (their logs are the tasks')."""
    return [t["job"] for t in ((row.get("result") or {}).get(TASKS) or {}).values() if t.get("job")]

