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
import logging
import os
import time
from pathlib import Path

from modelyard import objstore
from modelyard.platform.api import names
from modelyard.platform.api.errors import ApiError, invalid
from modelyard.platform.api.names import Route
from modelyard.platform.api.project_numbers import project_number
from modelyard.platform.api.timefmt import rfc3339
from modelyard.platform.jobs import jobs, pipeline_gcpc, pipeline_metadata, pipeline_spec, warm_jobs
from modelyard.platform.jobs.job_runner import CANCELLED, CANCELLING, FAILED, PENDING, RUNNING, SUCCEEDED
from modelyard.platform.storage.errors import StorageApiError
from modelyard.platform.storage.names import check_bucket

log = logging.getLogger(__name__)
TASKS = "_tasks"
RUN_EXECUTION = "_run_execution"  # the run's system.Run execution (pipeline_metadata.run_execution)
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
    try:  # storage's one rule for bucket names: a bad one fails here, not as every task's unreadable outputs
        check_bucket(root[len("gs://"):].split("/", 1)[0])
    except StorageApiError as exc:
        raise invalid(f"PipelineJob.runtime_config.gcs_output_directory {root!r}: {exc.message}") from None
    if runtime.get("parameters"):
        raise invalid("runtime_config.parameters (the v1 form) is not supported: use parameter_values.")
    if runtime.get("inputArtifacts"):
        raise invalid("runtime_config.input_artifacts is not supported by modelyard yet.")
    pipeline_spec.run_parameters(spec, runtime.get("parameterValues"))  # refused now, nothing made
    stored = {k: v for k, v in body.items() if k not in ("displayName", "labels", "name", "state", "jobDetail")}
    stored["runtimeConfig"] = {**runtime, "gcsOutputDirectory": root}
    # Vertex runs a pipeline without a service account as the project's Compute Engine default one, and
    # says so in the resource (Google's test_pipeline_job reads it back).
    stored["serviceAccount"] = body.get("serviceAccount") or default_service_account(route.project)
    return stored, {}


def default_service_account(project: str) -> str:
    """The project's Compute Engine default service account, as Vertex names it."""
    return f"{project_number(project)}-compute@developer.gserviceaccount.com"


def with_current_context(p, job: dict) -> dict:
    """A rendered run whose ``jobDetail.pipelineRunContext`` is read again from ML Metadata: its parents
    change when a client adds the run to an experiment (``submit(experiment=...)``), which the SDK's
    ``get_associated_experiment`` reads there."""
    ctx = (job.get("jobDetail") or {}).get("pipelineRunContext")
    if ctx and ctx.get("name"):
        parent = job["name"].split("/pipelineJobs/")[0]
        job["jobDetail"] = {**job["jobDetail"],
                            "pipelineRunContext": pipeline_metadata.current_context(p.store.engine, parent, ctx)}
    return job


def render(out: dict, enum_ints: bool) -> None:
    if not enum_ints:  # PipelineState's numbers are JobState's
        out["state"] = out["state"].replace("JOB_STATE_", "PIPELINE_STATE_")


def cancel(p, route: Route, row: dict) -> dict:
    """The run moves to CANCELLING; ``follow`` cancels its running tasks' jobs and ends it CANCELLED."""
    return jobs.follow_to_cancelled(p, row, "PipelineJob")


# ---- the runner side (the leading platform's job runner, in its worker thread) ------------------
# A run's tasks are instances: a task of a loop's body runs once per item, so an instance is keyed by
# its qualified name with each enclosing loop's iteration index after the loop, e.g. for-loop-2/3/square
# (task for-loop-2/square, item 3). Its group's instance is the key's head (for-loop-2/3, an iteration,
# whose head for-loop-2 is the loop); its siblings share the head. Kinds: "job" (a container task, run
# as a custom job), "importer", "group" (dsl.If branch, ExitHandler, nested pipeline), "loop", "iteration".
_GROUPS = ("group", "loop", "iteration")


def _spec_name(key: str) -> str:
    """The task (qualified name) an instance runs: its key without the iteration indexes."""
    return "/".join(part for part in key.split("/") if not part.isdigit())


def _head(key: str) -> str | None:
    """The instance a task instance runs inside (None at the root)."""
    return key.rsplit("/", 1)[0] if "/" in key else None


_BROKEN: dict[str, int] = {}  # run id -> ticks in a row that raised (a bug or a store that keeps failing)
MAX_BROKEN_TICKS = 5


def follow(runner, row: dict) -> None:
    """One step of a run (``_follow``); a run whose steps keep raising ends FAILED saying why rather than
    staying RUNNING."""
    try:
        _follow(runner, row)
        _BROKEN.pop(row["id"], None)
    except Exception as exc:
        _BROKEN[row["id"]] = _BROKEN.get(row["id"], 0) + 1
        if _BROKEN[row["id"]] < MAX_BROKEN_TICKS:
            raise
        for job in task_log_jobs(row):  # its tasks' jobs stop with it
            if not runner.store.update_job(job, (PENDING,), state=CANCELLED, ended=time.time()):
                runner.store.update_job(job, (RUNNING,), state=CANCELLING)
        runner.wake()
        _end(runner.store, row, FAILED, ApiError("INTERNAL", f"the pipeline's executor failed {MAX_BROKEN_TICKS} "
                                                 f"times in a row: {type(exc).__name__}: {exc}").to_rpc_status(),
             dict(row["result"] or {}))
        _BROKEN.pop(row["id"], None)


def _follow(runner, row: dict) -> None:
    """Settle ended tasks, start the tasks that can start, end the run when done."""
    store = runner.store
    spec = row["spec"]["pipelineSpec"]
    result = dict(row["result"] or {})
    tasks = {k: dict(v) for k, v in (result.get(TASKS) or {}).items()}
    changed = False
    if row["state"] == PENDING:
        if (runner.engine or {}).get("name") != "ray":  # its tasks' processes fork from it: importing meanwhile
            runner.tasks.start()
        detail = result.get("jobDetail") or {}
        ctx, pipeline_ctx = (detail["pipelineRunContext"], detail["pipelineContext"]) \
            if detail.get("pipelineRunContext") else pipeline_metadata.run_context(store.engine, row)
        params = pipeline_spec.run_parameters(spec, row["spec"]["runtimeConfig"].get("parameterValues"))
        result[RUN_EXECUTION] = pipeline_metadata.run_execution(store.engine, row, ctx, params)
        result["jobDetail"] = {"pipelineRunContext": ctx, "pipelineContext": pipeline_ctx}
        store.update_job(row["id"], (PENDING,), state=RUNNING, started=time.time(), result=result)
        row = {**row, "state": RUNNING, "result": result, "started": time.time()}

    def save() -> None:  # before what must not happen twice (a job made, ML Metadata written) is done
        store.update_job(row["id"], (RUNNING, CANCELLING), result={**result, TASKS: tasks})

    for key, t in tasks.items():  # tasks whose job ended since the last tick, and retries due
        if t["state"] in ENDED or t.get("kind", "job") != "job":
            continue
        if not t.get("job"):  # queued for a slot, or waiting for its next attempt (set_retry's backoff)
            if row["state"] == CANCELLING:
                t.update(state="CANCELLED", ended=time.time())
                changed = True
            continue
        changed |= _poll(runner, row, spec, key, t)
    while True:  # a group that ends may let an exit task start, whose cache hit may end a group...
        moved = _settle_groups(row, spec, tasks)
        moved |= row["state"] == RUNNING and _start_ready(runner, row, spec, tasks, save)
        changed |= moved
        if not moved:
            break
    if row["state"] == RUNNING:
        changed |= _launch_queued(runner, row, spec, tasks, save)
    active = [n for n, t in tasks.items() if t["state"] not in ENDED]
    if changed:
        result[TASKS] = tasks
        result["jobDetail"] = _job_detail(row, tasks, result.get("jobDetail") or {})
        store.update_job(row["id"], (RUNNING, CANCELLING), result=result)
    if active:
        return
    # Any failed task ends the run once nothing runs: a group failing at entry (its inputs unreadable) has
    # no failed task inside it, and nothing after it can start. Named: the failed tasks, else the groups.
    failed_tasks = [(k, t) for k, t in tasks.items() if t["state"] == "FAILED"]
    failed = sorted({pipeline_spec.local(k) for k, t in failed_tasks if t.get("kind", "job") not in _GROUPS}
                    or {pipeline_spec.local(_spec_name(k)) for k, _ in failed_tasks})  # a loop's, not "3"
    if row["state"] == CANCELLING:
        _end(store, row, CANCELLED, ApiError("CANCELLED", "CANCELED").to_rpc_status(), result)
    elif failed:
        _end(store, row, FAILED, ApiError("FAILED_PRECONDITION", "The DAG failed because some tasks failed. The failed "
                                          f"tasks are: [{', '.join(failed)}].").to_rpc_status(), result)
    elif all(tasks.get(n, {}).get("state") in DONE for n in pipeline_spec.root_names(spec)):
        _end(store, row, SUCCEEDED, None, result)


def _poll(runner, row: dict, spec: dict, key: str, t: dict) -> bool:
    """A container task's custom job looked at: its state taken over, its outputs read when it succeeded,
    another attempt planned when it failed and its retries allow; True if the task changed."""
    store = runner.store
    try:
        job = store.get_job(t["job"])
    except ApiError:
        if t.get("creating"):  # the platform stopped between saving the job's id and making the job
            if row["state"] == RUNNING:
                _launch(runner, row, spec, key, t, lambda: None)
            else:
                t.update(state="CANCELLED", ended=time.time())
            return True
        job = {"state": FAILED, "error": {"code": 13, "message": "the task's custom job is gone"},
               "started": None, "ended": time.time()}
    if row["state"] == CANCELLING and job["state"] in (PENDING, RUNNING):
        if not store.update_job(t["job"], (PENDING,), state=CANCELLED, ended=time.time()):
            if store.update_job(t["job"], (RUNNING,), state=CANCELLING):
                runner.wake()
        return False
    state = _TASK_STATE[job["state"]]
    changed = False
    if job["started"] and not t.get("started"):
        t["started"], changed = job["started"], True
    if state == t["state"] or state not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        if state != t["state"]:
            t["state"], changed = state, True
        return changed
    ended = job["ended"] or time.time()
    retries, backoff, factor, longest = pipeline_spec.retry_policy(spec, _spec_name(key))
    attempts = t.setdefault("attempts", [])
    if state == "FAILED" and row["state"] == RUNNING and len(attempts) < retries:
        # Vertex's set_retry: the task runs again after its backoff; each attempt stays in its status list.
        attempts.append({"job": t["job"], "state": "FAILED", "ended": ended, "error": job.get("error") or {}})
        t.update(state="PENDING", job=None, retry_at=ended + min(backoff * factor ** (len(attempts) - 1), longest))
        return True
    t.update(state=state, ended=ended)
    if state == "SUCCEEDED":
        try:
            written = _written(runner, spec, _spec_name(key), t["root"])
        except objstore.StorageError as exc:  # its outputs exist but cannot be read: not a success with none
            state = "FAILED"
            t.update(state=state, error=ApiError(exc.status, f"task {pipeline_spec.local(key)}: its outputs "
                                                 f"could not be read: {exc.message}").to_rpc_status())
        else:
            t["outputs"] = pipeline_spec.task_outputs(spec, _spec_name(key), written, t["planned"])
    elif job.get("error"):
        t["error"] = job["error"]
    t["execution"] = pipeline_metadata.task_execution(store.engine, row, pipeline_spec.local(key), t,
                                                      _EXECUTION_STATE[state])
    return True


def _start_ready(runner, row: dict, spec: dict, tasks: dict, save) -> bool:
    """Start every task instance whose upstream tasks all succeeded (fail-slow, as Vertex's default: a
    failed task stops only what depends on it), in the root DAG and in every running group or loop
    iteration; and a running loop's next iterations up to its parallelism. True if any started."""
    started = False
    params = pipeline_spec.run_parameters(spec, row["spec"]["runtimeConfig"].get("parameterValues"))
    scopes = [(None, {"parameters": params, "artifacts": {}})] + [
        (k, t["inputs"]) for k, t in tasks.items() if t.get("kind") in ("group", "iteration") and t["state"] == "RUNNING"]
    for head, scope in scopes:
        for qname in pipeline_spec.children(spec, _spec_name(head) if head else None):
            key = pipeline_spec.qualify(head, pipeline_spec.local(qname))
            if key in tasks:
                continue
            task = pipeline_spec.tasks(spec)[qname]
            ready = ENDED if (task.get("triggerPolicy") or {}).get("strategy") == pipeline_spec.ALL_COMPLETED else DONE
            ups = {u: tasks.get(pipeline_spec.qualify(head, u)) for u in pipeline_spec.upstream(task)}
            if not all(u is not None and u["state"] in ready for u in ups.values()):
                continue
            # read now: an upstream task may have been taken from the cache earlier in this pass
            outputs = {n: {**(u.get("outputs") or {}), "status": {
                "state": u["state"], "error": u.get("error") or {},
                "pipelineJobResourceName": f"{row['parent']}/pipelineJobs/{row['id']}"}} for n, u in ups.items()}
            if pipeline_spec.is_group(spec, qname):
                tasks[key] = _enter_group(spec, qname, scope, outputs)
            elif pipeline_spec.importer(spec, qname) is not None:
                tasks[key] = _import(runner, row, spec, key, scope, outputs)
            else:
                tasks[key] = _start(runner, row, spec, key, scope, outputs)
            tasks[key]["id"] = len(tasks)
            if tasks[key].get("execution"):  # recorded in ML Metadata (an importer, a cache hit): kept at once
                save()
            # Else nothing outside the run's row changed: the pass's tasks are saved together (a container
            # task waits in the queue for a slot; _launch saves its job's id before it makes the job).
            started = True
    for key, t in list(tasks.items()):  # loops: their next iterations
        if t.get("kind") != "loop" or t["state"] != "RUNNING":
            continue
        limit = pipeline_spec.parallelism(spec, _spec_name(key))
        running = sum(1 for i in range(len(t["items"])) if tasks.get(f"{key}/{i}", {}).get("state") not in (None,) + ENDED)
        for i, item in enumerate(t["items"]):
            if f"{key}/{i}" in tasks:
                continue
            if limit and running >= limit:
                break
            now = time.time()
            tasks[f"{key}/{i}"] = {"kind": "iteration", "iteration": i, "state": "RUNNING", "created": now,
                                   "started": now, "id": len(tasks) + 1,
                                   "inputs": pipeline_spec.iteration_inputs(spec, _spec_name(key), t["inputs"], item)}
            running += 1
            started = True
    if started:
        save()
    return started


def slots() -> int:
    """How many of a run's container tasks run at once: ``MODELYARD_PIPELINE_SLOTS``, else the machine's
    CPUs (at least 2). Tasks past it wait, in the order they became ready."""
    try:
        return max(1, int(os.environ.get("MODELYARD_PIPELINE_SLOTS", "")))
    except ValueError:
        return max(2, os.cpu_count() or 1)


def _launch_queued(runner, row: dict, spec: dict, tasks: dict, save) -> bool:
    """Start the custom jobs of the tasks waiting for a slot (ready, not taken from the cache, their
    retry's backoff over), oldest first, while the run has fewer than ``slots()`` running."""
    busy = sum(1 for t in tasks.values() if t.get("job") and t["state"] not in ENDED)
    free = slots() - busy
    now = time.time()
    launched = False
    for key, t in tasks.items():
        if free <= 0:
            break
        if t.get("kind", "job") == "job" and t["state"] == "PENDING" and not t.get("job") \
                and now >= t.get("retry_at", 0):
            _launch(runner, row, spec, key, t, save)
            free -= 1
            launched = True
    return launched


def _enter_group(spec: dict, name: str, scope: dict, outputs: dict) -> dict:
    """A group task (dsl.If branch, nested pipeline, loop): its inputs resolved, its condition evaluated
    over them: RUNNING (its tasks, or a loop's iterations, may start) or NOT_TRIGGERED; FAILED saying why
    when it cannot be read."""
    now = time.time()
    loop = pipeline_spec.is_loop(spec, name)
    try:
        inputs = pipeline_spec.task_inputs(spec, name, scope["parameters"], outputs, scope["artifacts"])
        condition = (pipeline_spec.tasks(spec)[name].get("triggerPolicy") or {}).get("condition")
        holds = pipeline_spec.condition_holds(condition, inputs["parameters"]) if condition else True
        items = pipeline_spec.loop_items(spec, name, inputs) if loop and holds else None
    except ApiError as exc:
        return {"kind": "loop" if loop else "group", "state": "FAILED", "created": now, "ended": now,
                "inputs": {"parameters": {}, "artifacts": {}},
                "error": ApiError(exc.status, f"task {pipeline_spec.local(name)}: {exc.message}").to_rpc_status()}
    t = {"kind": "loop" if loop else "group", "state": "RUNNING" if holds else "NOT_TRIGGERED", "created": now,
         "started": now, **({} if holds else {"ended": now}), "inputs": inputs}
    if items is not None:
        t["items"] = items
    return t


def _settle_groups(row: dict, spec: dict, tasks: dict) -> bool:
    """A running group ends when its tasks have: SUCCEEDED when each is done (its outputs then gathered:
    a loop's collected over its iterations); FAILED (or CANCELLED) when none is running any more and one
    failed (or the run is being cancelled). A loop waits for all its iterations. Inner groups first."""
    changed = False
    for key in reversed(list(tasks)):  # an instance is made after the group it is in
        t = tasks[key]
        if t.get("kind") not in _GROUPS or t["state"] != "RUNNING":
            continue
        name = _spec_name(key)
        if t["kind"] == "loop":
            kids = [f"{key}/{i}" for i in range(len(t["items"]))]
        else:
            kids = [pipeline_spec.qualify(key, pipeline_spec.local(c)) for c in pipeline_spec.children(spec, name)]
        states = [tasks[k]["state"] if k in tasks else None for k in kids]
        if any(s is not None and s not in ENDED for s in states):
            continue
        if all(s in DONE for s in states):
            end = "SUCCEEDED"
            if t["kind"] == "loop":
                t["outputs"] = pipeline_spec.collected(spec, name, [tasks[k].get("outputs") or {} for k in kids])
            else:
                t["outputs"] = pipeline_spec.dag_outputs(spec, name, {pipeline_spec.local(k): tasks[k].get("outputs")
                                                                      or {} for k in kids})
        elif row["state"] == CANCELLING:
            end = "CANCELLED"
        elif t["kind"] == "loop" and None in states:
            continue  # iterations still to start (fail-slow: a failed one stops none of the others)
        elif any(s in ("FAILED", "CANCELLED") for s in states):
            end = "FAILED"
        else:
            continue
        t.update(state=end, ended=time.time())
        failed = [tasks[k] for k in kids if k in tasks and tasks[k].get("error")]
        if end != "SUCCEEDED" and failed:  # its first failed task's error (what an exit task is told)
            t["error"] = failed[0]["error"]
        changed = True
    return changed


def _import(runner, row: dict, spec: dict, key: str, scope: dict, outputs: dict) -> dict:
    """A ``dsl.importer`` task: no job; its artifact (an existing object's URI) is recorded in ML Metadata,
    or, unless it says ``reimport``, the artifact already recorded for that URI and type is reused."""
    now = time.time()
    name = _spec_name(key)
    t = {"kind": "importer", "created": now, "started": now, "ended": now, "planned": {}}
    try:
        t["inputs"] = pipeline_spec.task_inputs(spec, name, scope["parameters"], outputs, scope["artifacts"])
        t["outputs"] = pipeline_spec.imported(spec, name, t["inputs"])
        for arts in t["outputs"]["artifacts"].values():
            for a in arts:
                found = None if a.pop("reimport") else pipeline_metadata.artifact_by_uri(runner.store.engine, row, a)
                if found:
                    a["name"] = found
        t["state"] = "SUCCEEDED"
        t["execution"] = pipeline_metadata.task_execution(runner.store.engine, row, pipeline_spec.local(key), t,
                                                          "COMPLETE", "system.ImporterExecution")
    except ApiError as exc:
        t.update(state="FAILED", inputs=t.get("inputs") or {"parameters": {}, "artifacts": {}}, outputs={},
                 error=ApiError(exc.status, f"task {pipeline_spec.local(key)}: {exc.message}").to_rpc_status())
    return t


def _start(runner, row: dict, spec: dict, key: str, scope: dict, outputs: dict) -> dict:
    """A container task instance: taken from the cache, or its custom job created (``_launch``)."""
    root = row["spec"]["runtimeConfig"]["gcsOutputDirectory"].rstrip("/")
    name = _spec_name(key)
    now = time.time()
    t = {"kind": "job", "created": now, "root": f"{root}/{row['id']}/{key}", "planned": {}}
    try:
        t["inputs"] = inputs = pipeline_spec.task_inputs(spec, name, scope["parameters"], outputs, scope["artifacts"])
        t["cache_key"] = pipeline_spec.cache_key(spec, name, inputs)
        hit = pipeline_metadata.cached(runner.store.engine, row, t["cache_key"]) if t["cache_key"] else None
        if hit is not None:  # no job: the outputs of the same task run before
            t.update(state="SKIPPED", started=now, ended=now, outputs=hit)
            t["execution"] = pipeline_metadata.task_execution(runner.store.engine, row, pipeline_spec.local(key), t,
                                                              "CACHED")
            return t
        t["planned"] = pipeline_spec.output_artifacts(spec, name, t["root"])
    except (ApiError, objstore.StorageError) as exc:  # the task fails saying why; the run goes on (fail-slow)
        t.setdefault("inputs", {"parameters": {}, "artifacts": {}})
        return _failed_to_start(t, key, exc)
    t["state"] = "PENDING"  # its job is made next (_launch)
    return t


def _launch(runner, row: dict, spec: dict, key: str, t: dict, save) -> None:
    """Create the custom job of a task instance (its first attempt or a retry) from its resolved inputs.
    The job's id is saved in the run first, so a platform killed in between makes the job on its next
    tick (``_poll``) rather than losing it or making a second one."""
    name = _spec_name(key)
    t.pop("retry_at", None)
    t.update(state="PENDING", job=names.new_id(), creating=True)
    save()
    try:
        container = pipeline_spec.container(spec, pipeline_spec.tasks(spec)[name])
        gcpc = pipeline_gcpc.mapped(list(container.get("command") or []))
        # Artifacts as /gcs/ paths (the job's files) for kfp's executor; a Google op gets their gs:// URIs, as
        # on Vertex (it hands them to the API; its output files stay /gcs/ paths).
        ex_input = pipeline_spec.executor_input(spec, name, t["inputs"], t["planned"], t["root"], _gcs_path,
                                                (lambda uri: uri) if gcpc else None)
        run = {"pipeline_job_name": row["id"], "pipeline_job_uuid": row["id"], "pipeline_task_name": key,
               "pipeline_task_uuid": f"{row['id']}-{t['id']}", "pipeline_job_resource_name":
               f"{row['parent']}/pipelineJobs/{row['id']}",
               "pipeline_root": row["spec"]["runtimeConfig"]["gcsOutputDirectory"]}
        # A Google Cloud Pipeline Components op: the platform's own launcher of the same op (pipeline_gcpc).
        command = gcpc or pipeline_spec.without_satisfied_install(
            pipeline_spec.fill(list(container.get("command") or []), ex_input, run))
        body = {"displayName": f"{row['display_name']}-{key.replace('/', '-')}"[:128],
                "labels": {warm_jobs.PIPELINE_LABEL: row["id"]},
                "jobSpec": {"workerPoolSpecs": [{"replicaCount": 1, "machineSpec": {"machineType": "e2-standard-4"},
                                                 "containerSpec": {
                    "imageUri": container.get("image", ""),
                    "command": command,
                    "args": pipeline_spec.fill(list(container.get("args") or []), ex_input, run),
                    "env": [{"name": e["name"], "value": str(e.get("value", ""))} for e in container.get("env") or []]}}]}}
        parent = row["parent"].split("/")
        runner.call_platform(lambda p: jobs.create(p, Route(parent[1], parent[3], "customJobs"), body, t["job"]))
    except (ApiError, objstore.StorageError) as exc:
        _failed_to_start(t, key, exc)
        return
    t.pop("creating", None)
    runner.wake()


def _failed_to_start(t: dict, key: str, exc) -> dict:
    t.pop("creating", None)
    t.update(state="FAILED", ended=time.time(), job=None,
             error=ApiError(exc.status, f"task {pipeline_spec.local(key)}: {exc.message}").to_rpc_status())
    return t


def _gcs_path(uri: str) -> str:
    """gs://b/k as the task sees it: /gcs/b/k (the job code maps it to the platform's storage)."""
    return "/gcs/" + uri[len("gs://"):] if uri.startswith("gs://") else uri


def _written(runner, spec: dict, name: str, task_root: str) -> dict:
    """What a finished task wrote: its executor output (a lightweight component's, kfp's executor writes
    it) and each output parameter it wrote to its ``output_file`` instead (a container component's)."""
    written = dict(_executor_output(runner, task_root) or {})
    params = dict(written.get("parameterValues") or {})
    defs = (pipeline_spec.component(spec, pipeline_spec.tasks(spec)[name]).get("outputDefinitions") or {}).get(
        "parameters") or {}
    for key, d in defs.items():
        if key in params:
            continue
        text = _read_text(runner, f"{task_root}/{key}")
        if text is None:
            continue
        if d.get("parameterType") == "STRING":
            params[key] = text
        else:
            try:
                params[key] = json.loads(text)
            except ValueError:
                continue
    written["parameterValues"] = params
    return written


def _executor_output(runner, task_root: str) -> dict | None:
    text = _read_text(runner, f"{task_root}/executor_output.json")
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _read_text(runner, uri: str) -> str | None:
    """An object a task wrote: its own file when the platform serves its bucket (what the task wrote
    through its /gcs/ path; no request to itself), else through the storage; None when there is none.
    Any other failure (a bucket name storage refuses, storage unreachable) is a StorageError: the task
    that wrote it then fails saying so (``_poll``) rather than passing with no outputs."""
    from modelyard.platform.storage import StorageApiError, local_file

    root = getattr(getattr(runner.platform, "config", None), "storage_root", None)
    if root is not None and uri.startswith("gs://") and (Path(root) / uri[len("gs://"):].split("/", 1)[0]).is_dir():
        try:
            path = local_file(uri, root)
        except StorageApiError as exc:
            raise objstore.StorageError("INVALID_ARGUMENT", f"{uri}: {exc}") from None
        try:
            return path.read_text()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
    objstore.filesystem("gs").invalidate_cache()  # written by the task, not through this client
    try:
        return objstore.read_text(uri)
    except objstore.StorageError as exc:
        if exc.status == "NOT_FOUND":  # no such bucket: nothing was written there
            return None
        raise


def _job_detail(row: dict, tasks: dict, detail: dict) -> dict:
    """``jobDetail`` as Vertex reports it: the root DAG's task, then one per task instance that started
    (a loop's iterations are DAG tasks named after the loop, their index in their execution's metadata)."""
    spec = row["spec"]["pipelineSpec"]
    root_id = "1000"
    pipeline_name = spec["pipelineInfo"]["name"]
    states = [t["state"] for t in tasks.values()]
    root_state = ("FAILED" if "FAILED" in states else "SUCCEEDED" if all(
        tasks.get(n, {}).get("state") in DONE for n in pipeline_spec.root_names(spec)) else "RUNNING")
    ids = {key: str(1000 + int(t.get("id") or i + 1)) for i, (key, t) in enumerate(tasks.items())}
    out = [{"taskId": root_id, "taskName": pipeline_name, "state": root_state,
            "createTime": rfc3339(row["created"]), **({"startTime": rfc3339(row["started"])} if row["started"] else {}),
            "execution": (row.get("result") or {}).get(RUN_EXECUTION) or {"displayName": pipeline_name,
                                                                           "schemaTitle": "system.Run"}}]
    parent = row["parent"]
    for key, t in tasks.items():
        head = _head(key)
        name = pipeline_spec.local(_spec_name(key))
        entry = {"taskId": ids[key], "parentTaskId": ids.get(head, root_id) if head else root_id, "taskName": name,
                 "state": t["state"], "createTime": rfc3339(t["created"])}
        if t.get("kind") in _GROUPS:
            entry["execution"] = {"displayName": name, "schemaTitle": "system.DAGExecution",
                                  **({"metadata": {"iteration_index": t["iteration"]}} if "iteration" in t else {})}
        if t.get("started"):
            entry["startTime"] = rfc3339(t["started"])
        if t.get("ended"):
            entry["endTime"] = rfc3339(t["ended"])
        job = t.get("job") or (t.get("attempts") or [{}])[-1].get("job")
        if job:
            entry["executorDetail"] = {"customJobDetail": {"job": f"{parent}/customJobs/{job}"}}
        if t.get("attempts"):  # set_retry: each failed attempt, then where the task is now
            entry["pipelineTaskStatus"] = [{"updateTime": rfc3339(a["ended"]), "state": "FAILED",
                                            **({"error": a["error"]} if a.get("error") else {})} for a in t["attempts"]]
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
    if result.get(RUN_EXECUTION):
        try:
            ended = pipeline_metadata.end_run_execution(store.engine, row, result[RUN_EXECUTION], _EXECUTION_STATE[
                _TASK_STATE[state]])
        except Exception:  # the run ends all the same; its system.Run execution keeps its last state
            log.exception("pipeline job %s: its system.Run execution could not be ended", row["id"])
            ended = None
        if ended:
            result[RUN_EXECUTION] = ended
            detail = result.get("jobDetail") or {}
            if detail.get("taskDetails"):
                detail["taskDetails"][0] = {**detail["taskDetails"][0], "execution": ended,
                                            "state": _TASK_STATE[state], "endTime": rfc3339(time.time())}
    store.update_job(row["id"], (PENDING, RUNNING, CANCELLING), state=state, error=error, result=result,
                     ended=time.time(), started=row["started"] or time.time())


def task_log_jobs(row: dict) -> list[str]:
    """The custom jobs a run's tasks ran as (their logs are the tasks')."""
    return [j for t in ((row.get("result") or {}).get(TASKS) or {}).values()
            for j in [a["job"] for a in t.get("attempts") or []] + [t.get("job")] if j]

