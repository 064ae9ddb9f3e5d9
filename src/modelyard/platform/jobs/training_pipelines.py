"""Vertex AI ``TrainingPipeline``s of the custom task: a CustomJob to run, then the model to upload.

What ``CustomTrainingJob``, ``CustomContainerTrainingJob`` and ``CustomPythonPackageTrainingJob``
create. On create the pipeline's ``trainingTaskInputs`` (a CustomJobSpec as a Struct, so in the
SDK's snake_case) become a real ``customJobs`` resource, checked and run by the custom job code
(reported as ``trainingTaskMetadata.backingCustomJob``, as Vertex does). The pipeline runs no
process of its own: on each tick of the job runner it follows its custom job (``follow``), and
when that succeeds and ``modelToUpload`` names a serving container, uploads what the job wrote to
``AIP_MODEL_DIR`` (``{baseOutputDirectory}/model/``) through ``models.upload`` (with the pipeline's
``modelId`` / ``parentModel``), and reports it as ``modelToUpload.name`` / ``versionId``.
Cancelling the pipeline cancels its custom job. A platform restart loses nothing: the custom job is
adopted as any other, and following is stateless. States are Vertex's ``PIPELINE_STATE_*``
(stored as the runner's ``JOB_STATE_*``, whose numbers are the same).
"""
from __future__ import annotations

import re
import time

from modelyard.objstore import StorageError
from modelyard.platform.jobs import jobs
from modelyard.platform.api import names
from modelyard.platform.api.errors import ApiError, invalid
from modelyard.platform.jobs.job_runner import CANCELLED, CANCELLING, FAILED, PENDING, RUNNING, SUCCEEDED
from modelyard.platform.jobs.jobs import PRIVATE
from modelyard.platform.api.names import Route

CUSTOM_TASK = "gs://google-cloud-aiplatform/schema/trainingjob/definition/custom_task_1.0.0.yaml"
UPLOAD_TIMEOUT_S = 600.0


def _camel(value):
    """A Struct written in proto field names (as the SDK sends trainingTaskInputs) -> JSON names."""
    if isinstance(value, list):
        return [_camel(v) for v in value]
    if isinstance(value, dict):
        return {re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), k): _camel(v) for k, v in value.items()}
    return value


async def validate(p, route: Route, body: dict) -> tuple[dict, dict]:
    definition = body.get("trainingTaskDefinition")
    if definition != CUSTOM_TASK:
        raise invalid(f"TrainingPipeline.training_task_definition {definition!r} is not supported: modelyard runs "
                      f"the custom task ({CUSTOM_TASK}) only.")
    inputs = body.get("trainingTaskInputs")
    if not isinstance(inputs, dict):
        raise invalid("TrainingPipeline.training_task_inputs is required (a CustomJobSpec).")
    if body.get("inputDataConfig"):
        raise invalid("TrainingPipeline.input_data_config (a managed dataset) is not supported by modelyard.")
    model = body.get("modelToUpload")
    if model is not None and not isinstance(model, dict):
        raise invalid("TrainingPipeline.model_to_upload must be a Model.")
    if _uploads(body) and not (model.get("displayName") or "").strip():
        raise invalid("TrainingPipeline.model_to_upload.display_name is required.")
    job_spec = _camel(inputs)
    if _uploads(body) and not (job_spec.get("baseOutputDirectory") or {}).get("outputUriPrefix"):
        raise invalid("training_task_inputs.base_output_directory is required to upload a model "
                      "(the model is read from its model/ directory).")
    # The backing CustomJob: checked (and refused, nothing made) as any CustomJob is.
    custom = await jobs.create(p, Route(route.project, route.location, "customJobs"), {
        "displayName": body["displayName"], "labels": body.get("labels") or {}, "jobSpec": job_spec})
    spec = {k: v for k, v in body.items() if k not in ("displayName", "labels", "name", "state")}
    spec[PRIVATE] = {"backing": custom["name"].rsplit("/", 1)[-1]}
    return spec, {"trainingTaskMetadata": {"backingCustomJob": custom["name"]}}


def _uploads(spec: dict) -> bool:
    return bool(((spec.get("modelToUpload") or {}).get("containerSpec") or {}).get("imageUri"))


def render(out: dict, enum_ints: bool) -> None:
    if not enum_ints:  # the numbers of PipelineState are JobState's
        out["state"] = out["state"].replace("JOB_STATE_", "PIPELINE_STATE_")


def cancel(p, route: Route, row: dict) -> dict:
    """Cancel the custom job, then the pipeline ends CANCELLED when it does (``follow``)."""
    backing = row["spec"][PRIVATE]["backing"]
    try:
        jobs.cancel(p, Route(route.project, route.location, "customJobs", backing))
    except ApiError:  # already over (or deleted): following settles the pipeline
        pass
    return jobs.follow_to_cancelled(p, row, "TrainingPipeline")


# ---- the runner side (the leading platform's job runner, in its worker thread) ------------------
def follow(runner, row: dict) -> None:
    """One step of a pipeline: mirror its custom job's state; upload the model once it succeeded."""
    store = runner.store
    try:
        job = store.get_job(row["spec"][PRIVATE]["backing"])
    except ApiError:
        _end(store, row, FAILED, ApiError("INTERNAL", "the pipeline's custom job is gone"))
        return
    if row["state"] == CANCELLING and job["state"] in (PENDING, RUNNING):
        store.update_job(job["id"], (PENDING,), state=CANCELLED, ended=time.time(), error=_cancelled())
        if store.update_job(job["id"], (RUNNING,), state=CANCELLING):
            runner.wake()
        return
    if job["state"] in (PENDING,):
        return
    if job["state"] in (RUNNING, CANCELLING):
        if row["state"] == PENDING:
            store.update_job(row["id"], (PENDING,), state=RUNNING, started=job["started"] or time.time())
        return
    if row["state"] == CANCELLING or job["state"] == CANCELLED:
        _end(store, row, CANCELLED, _cancelled())
    elif job["state"] == FAILED:
        _end(store, row, FAILED, job["error"] or ApiError("INTERNAL", "the custom job failed").to_rpc_status())
    elif not _uploads(row["spec"]):
        _end(store, row, SUCCEEDED, None)
    else:
        try:
            model = runner.call_platform(lambda p: _upload(p, row))
        except (ApiError, StorageError) as exc:
            _end(store, row, FAILED, ApiError(exc.status, f"the model could not be uploaded: {exc.message}"))
            return
        except Exception as exc:  # the pipeline fails saying why; the runner goes on
            _end(store, row, FAILED, ApiError("INTERNAL", f"the model could not be uploaded: {type(exc).__name__}: {exc}"))
            return
        _end(store, row, SUCCEEDED, None, {"modelToUpload": model})


async def _upload(p, row: dict) -> dict:
    """``models.upload`` of the job's AIP_MODEL_DIR as ``modelToUpload`` says; the reported Model."""
    from modelyard.platform.resources import models

    spec = row["spec"]
    base = _camel(spec["trainingTaskInputs"])["baseOutputDirectory"]["outputUriPrefix"].rstrip("/")
    model = {**spec["modelToUpload"], "artifactUri": f"{base}/model/"}
    body = {"model": model, **{k: spec[k] for k in ("modelId", "parentModel") if spec.get(k)}}
    op = await models.upload(p, names.parse_path(f"{row['parent']}/models:upload"), body)
    response = op.get("response") or {}
    return {**model, "name": response.get("model", ""), "versionId": response.get("modelVersionId", "")}


def _cancelled() -> dict:
    return ApiError("CANCELLED", "CANCELED").to_rpc_status()


def _end(store, row: dict, state: str, error, result: dict | None = None) -> None:
    if isinstance(error, ApiError):
        error = error.to_rpc_status()
    store.update_job(row["id"], (PENDING, RUNNING, CANCELLING), state=state, error=error,
                     result={**(row["result"] or {}), **(result or {})}, ended=time.time(),
                     started=row["started"] or time.time())

