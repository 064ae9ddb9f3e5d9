"""Google Cloud Pipeline Components (``google_cloud_pipeline_components``) run against this platform.

Their container ops (``CustomTrainingJobOp``, ``ModelUploadOp``, ``EndpointCreateOp``, ``ModelDeployOp``,
``ModelBatchPredictOp``) run ``python3 -u -m google_cloud_pipeline_components.container.v1....launcher``
in Google's image; the launcher calls ``{location}-aiplatform.googleapis.com`` over gRPC with Google's
credentials and cannot be pointed at another endpoint. So the platform runs their spec itself: ``TABLE``
maps each launcher module (one entry per op) to a handler of this module, and the task's command becomes
``python3 -m modelyard.platform.jobs.pipeline_gcpc <launcher> <the op's own args>`` -- the same
``--type``, ``--payload`` (its placeholders filled by ``pipeline_spec.fill``), ``--project``,
``--location``, ``--gcp_resources`` and ``--executor_input`` the launcher gets. It runs as the task's
custom job (its log, limits, cancel) and makes the same call against the platform's REST API
(``MODELYARD_PLATFORM``, the job's token from its metadata server), waits for it as the launcher waits,
and writes what the launcher writes: ``gcp_resources`` and the output artifacts (``google.VertexModel``,
``google.VertexEndpoint``, ``google.VertexBatchPredictionJob``) with their ``resourceName`` metadata.

May import: the standard library (the platform side); ``requests`` and ``google.auth`` in the job.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any, Callable

PREFIX = "google_cloud_pipeline_components.container.v1."
# launcher module (after PREFIX) -> the handler below (by name: the platform side imports nothing else)
TABLE = {
    "custom_job.launcher": "custom_job",
    "model.upload_model.launcher": "upload_model",
    "endpoint.create_endpoint.launcher": "create_endpoint",
    "endpoint.deploy_model.launcher": "deploy_model",
    "batch_prediction_job.launcher": "batch_prediction_job",
}
POLL_S = 0.5
_OPAQUE = ("labels", "model_parameters", "parameters", "metadata", "traffic_split", "env")


def mapped(command: list[str]) -> list[str] | None:
    """The command that runs a Google Cloud Pipeline Components launcher here, None for any other."""
    if len(command) >= 2 and command[0].startswith("python") and command[-2] == "-m" \
            and command[-1].startswith(PREFIX) and command[-1][len(PREFIX):] in TABLE:
        return ["python3", "-u", "-m", __name__, command[-1][len(PREFIX):]]
    return None


def unmapped_op(command: list[str]) -> str | None:
    """The launcher a command runs when it is a Google Cloud Pipeline Components op this module does not
    run (so the task fails at create saying which), else None."""
    if command and command[-1].startswith("google_cloud_pipeline_components.") and mapped(command) is None:
        return command[-1]
    return None


# ---- the job side --------------------------------------------------------------------------------
def _camel(key: str) -> str:
    return re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), key)


def _clean(value: Any, key: str = "") -> Any:
    """The op's payload (snake_case, every optional field present as "" or 0) as a REST body: camelCase
    keys, empty strings, lists and objects left out (unset, as the launcher's proto parsing leaves them);
    the keys of maps a user wrote (labels, parameters, ...) kept as they are."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            v = v if key in _OPAQUE else _clean(v, k)
            if v in ("", None, [], {}):
                continue
            out[k if key in _OPAQUE else _camel(k)] = v
        return out
    if isinstance(value, list):
        return [_clean(v, key) for v in value]
    return value


class Api:
    """The platform's REST API as the job sees it (``MODELYARD_PLATFORM``), with the job's token."""

    def __init__(self, project: str, location: str) -> None:
        import requests

        self.base = os.environ["MODELYARD_PLATFORM"].rstrip("/") + "/v1/"
        self.parent = f"projects/{project}/locations/{location}"
        self.session = requests.Session()
        token = _token()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        r = self.session.request(method, self.base + path, json=body, timeout=60)
        if r.status_code >= 400:
            raise SystemExit(f"{method} {path}: HTTP {r.status_code}: {r.text[:2000]}")
        return r.json() if r.content else {}

    def wait_operation(self, op: dict) -> dict:
        while not op.get("done"):
            time.sleep(POLL_S)
            op = self.call("GET", op["name"])
        if op.get("error"):
            raise SystemExit(f"operation {op['name']} failed: {op['error'].get('message')}")
        return op.get("response") or {}

    def wait_job(self, name: str) -> dict:
        while True:
            job = self.call("GET", name)
            if job.get("state") in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED",
                                    "JOB_STATE_EXPIRED", "JOB_STATE_PARTIALLY_SUCCEEDED"):
                return job
            time.sleep(POLL_S)


def _token() -> str | None:
    """The job's own token (its metadata server hands it to google.auth); None where there is none."""
    try:
        import google.auth
        import google.auth.transport.requests

        creds, _ = google.auth.default()
        creds.refresh(google.auth.transport.requests.Request())
        return creds.token
    except Exception:  # no metadata server (a job on a Ray node): the platform is then unguarded
        return None


def _resources(kind: str, name: str, location: str) -> str:
    """The ``gcp_resources`` JSON the launchers write (its URI in Vertex's form)."""
    return json.dumps({"resources": [{"resourceType": kind,
                                      "resourceUri": f"https://{location}-aiplatform.googleapis.com/v1/{name}"}]})


def _artifact(title: str, name: str, location: str, **metadata: Any) -> dict:
    return {"uri": f"https://{location}-aiplatform.googleapis.com/v1/{name}",
            "metadata": {"resourceName": name, **metadata}, "type": {"schemaTitle": title}}


def custom_job(api: Api, payload: dict, ex: dict, args) -> tuple[str, str, dict]:
    job = api.call("POST", f"{api.parent}/customJobs", _clean(payload))
    print(f"custom job {job['name']} created", flush=True)
    ended = api.wait_job(job["name"])
    if ended["state"] != "JOB_STATE_SUCCEEDED":
        raise SystemExit(f"custom job {job['name']} ended {ended['state']}: {(ended.get('error') or {}).get('message')}")
    return "CustomJob", job["name"], {}


def upload_model(api: Api, payload: dict, ex: dict, args) -> tuple[str, str, dict]:
    source = ((ex["inputs"]["artifacts"].get("unmanaged_container_model") or {}).get("artifacts") or [{}])[0]
    meta = source.get("metadata") or {}
    model = _clean({k: v for k, v in payload.items() if k not in ("pipeline_job", "encryption_spec")})
    model["artifactUri"] = _gs(source.get("uri", ""))
    for key in ("containerSpec", "predictSchemata"):
        if meta.get(key):
            model[key] = meta[key]
    body: dict = {"model": model}
    if args.parent_model_name:
        body["parentModel"] = args.parent_model_name
    done = api.wait_operation(api.call("POST", f"{api.parent}/models:upload", body))
    name = done["model"] + (f"@{done['modelVersionId']}" if done.get("modelVersionId") else "")
    print(f"model {name} uploaded", flush=True)
    return "Model", done["model"], {"model": _artifact("google.VertexModel", name, args.location)}


def create_endpoint(api: Api, payload: dict, ex: dict, args) -> tuple[str, str, dict]:
    done = api.wait_operation(api.call("POST", f"{api.parent}/endpoints", _clean(payload)))
    print(f"endpoint {done['name']} created", flush=True)
    return "Endpoint", done["name"], {"endpoint": _artifact("google.VertexEndpoint", done["name"], args.location)}


def deploy_model(api: Api, payload: dict, ex: dict, args) -> tuple[str, str, dict]:
    body = _clean(payload)
    deployed = body.get("deployedModel") or {}
    # The op sends both kinds of resources; one is all zeros (what the launcher's proto leaves unset).
    if (deployed.get("dedicatedResources") or {}).get("machineSpec", {}).get("machineType"):
        deployed.pop("automaticResources", None)
    else:
        deployed.pop("dedicatedResources", None)
    endpoint = body.pop("endpoint")
    api.wait_operation(api.call("POST", f"{endpoint}:deployModel", body))
    print(f"model {deployed.get('model')} deployed to {endpoint}", flush=True)
    return "DeployModel", endpoint, {}


def batch_prediction_job(api: Api, payload: dict, ex: dict, args) -> tuple[str, str, dict]:
    job = api.call("POST", f"{api.parent}/batchPredictionJobs", _clean(payload))
    print(f"batch prediction job {job['name']} created", flush=True)
    ended = api.wait_job(job["name"])
    if ended["state"] != "JOB_STATE_SUCCEEDED":
        raise SystemExit(f"batch prediction job {job['name']} ended {ended['state']}: "
                         f"{(ended.get('error') or {}).get('message')}")
    out_dir = (ended.get("outputInfo") or {}).get("gcsOutputDirectory", "")
    arts = {"batchpredictionjob": _artifact("google.VertexBatchPredictionJob", job["name"], args.location,
                                            gcsOutputDirectory=out_dir)}
    if out_dir:
        arts["gcs_output_directory"] = {"uri": out_dir, "metadata": {}, "type": {"schemaTitle": "system.Artifact"}}
    return "BatchPredictionJob", job["name"], arts


def _gs(path: str) -> str:
    """An artifact's URI as the platform takes it: /gcs/b/k (what a task is handed) is gs://b/k."""
    return "gs://" + path[len("/gcs/"):] if path.startswith("/gcs/") else path


def main(argv: list[str] | None = None) -> None:
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    op = argv.pop(0)
    parser = argparse.ArgumentParser(prog=f"{__name__} {op}")
    for flag in ("--type", "--payload", "--project", "--location", "--gcp_resources", "--executor_input",
                 "--parent_model_name"):
        parser.add_argument(flag, default="")
    args, _unknown = parser.parse_known_args(argv)  # the launchers' other flags change nothing here
    handler: Callable = globals()[TABLE[op]]
    ex = json.loads(args.executor_input) if args.executor_input else {"inputs": {"artifacts": {}}, "outputs": {}}
    payload = json.loads(args.payload) if args.payload else {}
    kind, name, artifacts = handler(Api(args.project, args.location), payload, ex, args)
    resources = _resources(kind, name, args.location)
    if args.gcp_resources:
        os.makedirs(os.path.dirname(args.gcp_resources) or ".", exist_ok=True)
        with open(args.gcp_resources, "w") as f:
            f.write(resources)
    out_file = (ex.get("outputs") or {}).get("outputFile")
    if out_file:  # the executor output: the artifacts' URIs and metadata, as the launchers write it
        planned = (ex.get("outputs") or {}).get("artifacts") or {}
        written = {k: {"artifacts": [{**(planned.get(k, {}).get("artifacts") or [{}])[0], **a}]}
                   for k, a in artifacts.items()}
        os.makedirs(os.path.dirname(out_file) or ".", exist_ok=True)
        with open(out_file, "w") as f:
            json.dump({"artifacts": written, "parameterValues": {"gcp_resources": resources}}, f)


if __name__ == "__main__":
    main()
