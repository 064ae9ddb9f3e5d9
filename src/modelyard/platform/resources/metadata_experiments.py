"""Vertex AI Experiments as the platform itself writes them into ML Metadata (docs/metadata.md): an
experiment is a ``system.Experiment`` context, a run a ``system.ExperimentRun`` context ``{experiment}-{run}``
that is the experiment's child and holds ``_params``, ``_metrics`` and ``_state`` in its metadata -- the
records the stock SDK's ``ExperimentRun.create`` / ``log_params`` / ``log_metrics`` / ``end_run`` write, so
``get_experiment_df`` and the console read a run made here like one a user made.

Used where the platform records on a user's behalf: a CustomJob's ``jobSpec.experiment`` /
``experimentRun`` (checked, the run made when only the experiment is named, as Vertex does) and a
HyperparameterTuningJob's ``trialJobSpec.experiment`` (checked; its trials are recorded by ``modelyard tune
--experiment``, tuning/experiment.py)."""
from __future__ import annotations

import re
import secrets
import time

from modelyard.platform.api.errors import ApiError, invalid
from modelyard.platform.resources import metadata_lineage as lineage, metadata_nodes as nodes
from modelyard.platform.resources import metadata_store as stores
from modelyard.platform.state.metadata_db import MetadataDB

EXPERIMENT, RUN = "system.Experiment", "system.ExperimentRun"
PARAMS, METRICS, STATE = "_params", "_metrics", "_state"
# The SDK's rule for an experiment run's context id ({experiment}-{run}; ExperimentRun._validate_run_id).
_RUN_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")
_CONTEXT = re.compile(r"(projects/[^/]+/locations/[^/]+)/metadataStores/([^/]+)/contexts/([^/]+)")


def _context(db: MetadataDB, name: object, field: str) -> tuple[str, dict]:
    """``(store, row)`` of a context named by its full resource name in ``field``."""
    m = _CONTEXT.fullmatch(name) if isinstance(name, str) else None
    if m is None:
        raise invalid(f"{field} must be a context's resource name "
                      "(projects/{{p}}/locations/{{l}}/metadataStores/{{s}}/contexts/{{id}}), got {name!r}.")
    store = stores.resolve(db, m.group(1), m.group(2))
    try:
        return store, db.get_node(store, "contexts", m.group(3))
    except ApiError as exc:
        if exc.status == "NOT_FOUND":
            raise ApiError("NOT_FOUND", f"{field}: {name} does not exist.") from None
        raise


def experiment(db: MetadataDB, name: str, field: str = "experiment") -> tuple[str, dict]:
    """``(store, row)`` of an existing experiment context; NOT_FOUND / INVALID_ARGUMENT naming ``field``."""
    store, row = _context(db, name, field)
    if row["schema_title"] != EXPERIMENT:
        raise invalid(f"{field}: {name} is a {row['schema_title']} context, not an experiment ({EXPERIMENT}).")
    return store, row


def start_run(db: MetadataDB, store: str, experiment_id: str, run_name: str, params: dict | None = None) -> dict:
    """A new RUNNING run of the experiment (its context, made a child of the experiment's), as the SDK's
    ``start_run`` makes it; ALREADY_EXISTS if the name is taken."""
    run_id = f"{experiment_id}-{run_name}"
    if not _RUN_ID.fullmatch(run_id):
        raise invalid(f"experiment run id {run_id!r} must match [a-z0-9][a-z0-9-]{{0,127}}.")
    row = nodes.create(db, store, "contexts", {
        "displayName": run_name, "schemaTitle": RUN,
        "metadata": {PARAMS: dict(params or {}), METRICS: {}, STATE: "RUNNING"}}, run_id)
    lineage.add_context_children(db, store, experiment_id, {"childContexts": [row["name"]]})
    return db.get_node(store, "contexts", run_id)


def auto_run_name(prefix: str) -> str:
    """A run name in the shape the SDK gives runs it makes itself (``{prefix}-{timestamp}-{uid}``)."""
    return f"{prefix}-{time.strftime('%Y-%m-%d-%H-%M-%S', time.gmtime())}-{secrets.token_hex(3)[:5]}"


def job_experiment(db: MetadataDB, job_spec: dict, run_prefix: str = "custom-job") -> dict:
    """A CustomJobSpec's ``experiment`` and ``experimentRun`` checked (both existing, the run the
    experiment's), the run made RUNNING when only the experiment is named (Vertex auto-generates it);
    the fields to store on the job (empty when the job names no experiment)."""
    exp_name, run_name = job_spec.get("experiment"), job_spec.get("experimentRun")
    if not exp_name:
        if run_name:
            raise invalid("job_spec.experiment_run can only be set with job_spec.experiment.")
        return {}
    store, exp = experiment(db, exp_name, "job_spec.experiment")
    if run_name:
        _store, run = _context(db, run_name, "job_spec.experiment_run")
        if run["schema_title"] != RUN or _store != store or not any(
                child == run["id"] and parent == exp["id"] for child, parent in db.parent_links(store)):
            raise invalid(f"job_spec.experiment_run {run_name} is not a run of experiment {exp_name}.")
    else:
        run = start_run(db, store, exp["id"], auto_run_name(run_prefix))
    return {"experiment": f"{store}/contexts/{exp['id']}", "experimentRun": f"{store}/contexts/{run['id']}"}

