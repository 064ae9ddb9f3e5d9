"""Vertex AI ``BatchPredictionJob``: the request checked on the platform, the job run in its child.

``validate`` (platform side) resolves the model version to its local SavedModel, checks the
formats and ``instanceConfig``, and expands ``gcsSource.uris`` (so a missing source fails the
create and nothing is made). ``execute`` (child side) stages remote inputs in the job's work dir,
runs ``modelyard.batch`` on them into the work dir (resumable: a re-run finishes the same job)
and publishes the result shards and the error file to
``<outputUriPrefix>/prediction-<model>-<timestamp>/``, as Vertex AI lays them out.
"""
from __future__ import annotations

import asyncio
import re
from pathlib import Path

from modelyard import objstore
from modelyard.platform.api import names
from modelyard.platform.api.errors import invalid, not_found
from modelyard.platform.api.names import Route

RESUMABLE = True  # the batch package resumes a job from its committed parts
INSTANCE_FORMATS = ("jsonl", "csv", "tf-record", "file-list")
PRIVATE = "_modelyard"


async def validate(p, route: Route, body: dict) -> tuple[dict, dict]:
    """(spec to store, initial result fields); ApiError for a request that cannot run."""
    model_ref = body.get("model")
    if not isinstance(model_ref, str) or not model_ref:
        raise invalid("BatchPredictionJob.model is required.")
    model_id, version_id = names.parse_resource(model_ref, "models")
    model = p.store.get_model(model_id)
    if model["parent"] != route.parent:
        raise not_found("Model", model_id)
    version = p.store.get_version(model_id, version_id)

    source = body.get("inputConfig")
    if not isinstance(source, dict):
        raise invalid("BatchPredictionJob.input_config is required.")
    fmt = source.get("instancesFormat")
    if fmt not in INSTANCE_FORMATS:
        raise invalid(f"input_config.instances_format {fmt!r} is not supported: use one of "
                      f"{', '.join(INSTANCE_FORMATS)}.")
    uris = (source.get("gcsSource") or {}).get("uris")
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) and u for u in uris):
        raise invalid("input_config.gcs_source.uris is required: one or more file URIs or globs "
                      "(gs://, s3://, or local paths).")

    sink = body.get("outputConfig")
    if not isinstance(sink, dict):
        raise invalid("BatchPredictionJob.output_config is required.")
    if sink.get("predictionsFormat", "jsonl") != "jsonl":
        raise invalid(f"output_config.predictions_format {sink.get('predictionsFormat')!r} is not supported: "
                      "modelyard writes jsonl.")
    prefix = (sink.get("gcsDestination") or {}).get("outputUriPrefix")
    if not isinstance(prefix, str) or not prefix:
        raise invalid("output_config.gcs_destination.output_uri_prefix is required (BigQuery is not supported).")
    objstore.scheme_of(prefix)

    cfg = body.get("instanceConfig") or {}
    if not isinstance(cfg, dict):
        raise invalid("instance_config must be an object.")
    if cfg.get("instanceType") not in (None, "", "object", "array"):
        raise invalid(f"instance_config.instance_type {cfg['instanceType']!r}: expected object or array.")
    for field in ("includedFields", "excludedFields"):
        if not isinstance(cfg.get(field, []), list) or not all(isinstance(f, str) for f in cfg.get(field, [])):
            raise invalid(f"instance_config.{field} must be a list of field names.")
    if cfg.get("includedFields") and cfg.get("excludedFields"):
        raise invalid("instance_config.included_fields and excluded_fields cannot both be set.")
    if cfg.get("keyField") is not None and not isinstance(cfg["keyField"], str):
        raise invalid("instance_config.key_field must be a field name.")

    batch_size = (body.get("manualBatchTuningParameters") or {}).get("batchSize") or 64
    workers = (body.get("dedicatedResources") or {}).get("startingReplicaCount")
    for label, value in (("manual_batch_tuning_parameters.batch_size", batch_size),
                         ("dedicated_resources.starting_replica_count", workers)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise invalid(f"{label} must be a positive integer, got {value!r}.")

    # Off the event loop: a gs:// glob is listed here.
    files = await asyncio.to_thread(objstore.expand, uris)
    from modelyard.batch.job import job_dir_name

    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model["display_name"]).strip("_") or "model"
    out_dir = f"{prefix.rstrip('/')}/{job_dir_name(safe)}"
    spec = {k: v for k, v in body.items() if k not in ("displayName", "labels", "name", "state")}
    spec["model"] = names.model_name(route.parent, model_id)
    spec["modelVersionId"] = version["version_id"]
    spec[PRIVATE] = {"modelPath": version["local_path"], "inputs": files, "outputDirectory": out_dir,
                     "batchSize": batch_size, "workers": workers}
    return spec, {"outputInfo": {"gcsOutputDirectory": out_dir}}


# ---- the child side -----------------------------------------------------------------------------
def execute(work_dir: Path, job: dict) -> dict:
    from modelyard.batch import batch_predict
    from modelyard.batch.shards import ERRORS_FILE, result_shards
    from modelyard.batch.spec import BatchError
    from modelyard.platform.jobs.job_runner import JobFailed

    spec = job["spec"]
    ctx = spec[PRIVATE]
    cfg = spec.get("instanceConfig") or {}
    try:
        inputs = objstore.stage_in(ctx["inputs"], work_dir / "inputs")
        result = batch_predict(
            ctx["modelPath"], inputs, work_dir / "output", format=spec["inputConfig"]["instancesFormat"],
            batch_size=ctx["batchSize"], workers=ctx["workers"], key_field=cfg.get("keyField") or None,
            included_fields=cfg.get("includedFields") or (), excluded_fields=cfg.get("excludedFields") or (),
            instance_type=cfg.get("instanceType") or None, progress=False, log=lambda m: print(m, flush=True),
            json_numbers="vertex")  # integral numbers reach integer inputs as integers, as on Vertex AI
    except BatchError as exc:
        raise JobFailed(str(exc), "INVALID_ARGUMENT") from None
    except objstore.StorageError as exc:
        raise JobFailed(exc.message, exc.status) from None
    if result.state != "JOB_STATE_SUCCEEDED":
        raise JobFailed(result.error or f"batch prediction ended {result.state}")
    files = result_shards(result.job_dir) + [result.job_dir / ERRORS_FILE]
    try:
        objstore.publish([f for f in files if f.exists()], ctx["outputDirectory"])
    except objstore.StorageError as exc:
        raise JobFailed(exc.message, exc.status) from None
    stats = result.completion_stats
    print(f"published {len(files)} file(s) to {ctx['outputDirectory']}: {stats}", flush=True)
    return {"completionStats": _stats(stats["successful_count"], stats["failed_count"], 0)}


def progress(work_dir: Path, row: dict) -> dict | None:
    """Counts of the committed parts while the job runs (the batch package's own progress record);
    while the job is still being planned, the rows not done are those planned so far."""
    from modelyard.batch.job_plan import planned_rows
    from modelyard.batch.shards import committed

    for job_dir in (work_dir / "output").glob("prediction-*"):
        try:
            total = planned_rows(job_dir)
        except (OSError, ValueError):
            return None
        if total is None:  # nothing planned yet
            return None
        done = committed(job_dir).values()
        ok, err = sum(d[0] for d in done), sum(d[1] for d in done)
        return {"completionStats": _stats(ok, err, max(total - ok - err, 0))}
    return None


def _stats(ok: int, failed: int, incomplete: int) -> dict:
    # int64 fields are strings in proto3 JSON.
    return {"successfulCount": str(ok), "failedCount": str(failed), "incompleteCount": str(incomplete)}

