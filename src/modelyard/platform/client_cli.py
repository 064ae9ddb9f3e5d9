"""``modelyard models|endpoints|jobs ...``: the platform's CLI, a thin client of its
Vertex AI REST API (the same calls the SDK makes). Prints JSON; errors print Google's message and
exit 1. Mutations wait for their operation unless ``--no-wait``."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from modelyard.json_http import json_request

DEFAULT_URL = "http://127.0.0.1:8600"


class CliError(Exception):
    pass


class Client:
    def __init__(self, args: argparse.Namespace) -> None:
        self.base = args.platform.rstrip("/")
        self.parent = f"projects/{args.project}/locations/{args.location}"
        self.token = args.token
        self.wait_ops = not getattr(args, "no_wait", False)
        self.timeout_s = float(getattr(args, "timeout", None) or 900.0)  # how long a wait may last

    def call(self, method: str, path: str, body: dict | None = None, absolute: bool = False) -> dict:
        url = f"{self.base}/v1/{path if absolute else f'{self.parent}/{path}'}"
        try:
            return json_request(method, url, body, self.token, timeout=600)
        except urllib.error.HTTPError as exc:
            try:
                err = json.loads(exc.read())["error"]
                raise CliError(f"{err['status']}: {err['message']}") from None
            except (ValueError, KeyError):
                raise CliError(f"HTTP {exc.code} from {url}") from None
        except urllib.error.URLError as exc:
            raise CliError(f"cannot reach the platform at {self.base} ({exc.reason}): is `modelyard platform` "
                           "running? (--platform / $MODELYARD_PLATFORM)") from None

    def list(self, path: str, key: str) -> list[dict]:
        """Every item of a list, its pages followed (the platform answers at most 1,000 per page)."""
        out, token = [], None
        while True:
            page = self.call("GET", path + (f"?pageToken={urllib.parse.quote(token, safe='')}" if token else ""))
            out += page.get(key, [])
            token = page.get("nextPageToken")
            if not token:
                return out

    def raw(self, path: str) -> str:
        """A modelyard (non-Vertex) GET under the platform's root, as text."""
        req = urllib.request.Request(f"{self.base}{path}")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            raise CliError(f"HTTP {exc.code} from {path}") from None
        except urllib.error.URLError as exc:
            raise CliError(f"cannot reach the platform at {self.base} ({exc.reason})") from None

    def operation(self, op: dict) -> dict:
        deadline = time.monotonic() + self.timeout_s
        while self.wait_ops and not op.get("done"):
            if time.monotonic() > deadline:
                raise CliError(f"gave up after {self.timeout_s:g} s (--timeout) waiting for operation {op['name']} "
                               "to end; it may still end: GET it, or run the command again with --no-wait")
            time.sleep(0.3)
            op = self.call("GET", op["name"], absolute=True)
        if "error" in op:
            raise CliError(f"operation {op['name']} failed: {op['error'].get('message')}")
        return op.get("response", op)


def _short(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def _split(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not value.isdigit():
            raise CliError(f"traffic split entries are DEPLOYED_MODEL_ID=PERCENT, got {item!r}")
        out[key] = int(value)
    return out


def models_cmd(args: argparse.Namespace, c: Client):
    if args.action == "upload":
        # As the SDK does: a new version takes the "default" alias unless --no-default-version.
        aliases = [*args.version_aliases, *([] if args.no_default_version else ["default"])]
        body = {"model": {"displayName": args.display_name, "artifactUri": args.artifact_uri,
                          "containerSpec": {"imageUri": "modelyard/serve"}, "versionAliases": aliases}}
        if args.parent_model:
            body["parentModel"] = f"{c.parent}/models/{args.parent_model}"
        if args.model_id:
            body["modelId"] = args.model_id
        return c.operation(c.call("POST", "models:upload", body))
    if args.action == "list":
        return c.list("models", "models")
    if args.action == "list-versions":
        return c.list(f"models/{args.model}:listVersions", "models")
    if args.action == "aliases":
        changes = [*args.add, *(f"-{a}" for a in args.remove)]
        return c.call("POST", f"models/{args.model}:mergeVersionAliases", {"versionAliases": changes})
    if args.action == "describe":
        return c.call("GET", f"models/{args.model}")
    return c.operation(c.call("DELETE", f"models/{args.model}"))


def endpoints_cmd(args: argparse.Namespace, c: Client):
    a = args.action
    if a == "create":
        chosen = f"?endpointId={urllib.parse.quote(args.endpoint_id)}" if args.endpoint_id else ""
        return c.operation(c.call("POST", f"endpoints{chosen}", {"displayName": args.display_name}))
    if a == "list":
        return c.list("endpoints", "endpoints")
    if a == "describe":
        return c.call("GET", f"endpoints/{args.endpoint}")
    if a == "delete":
        return c.operation(c.call("DELETE", f"endpoints/{args.endpoint}"))
    if a == "deploy":
        body = {"deployedModel": {"model": f"{c.parent}/models/{args.model}",
                                  "automaticResources": {"minReplicaCount": args.min_replicas,
                                                         "maxReplicaCount": args.max_replicas or args.min_replicas}}}
        if args.traffic_percentage is not None:
            current = c.call("GET", f"endpoints/{args.endpoint}").get("trafficSplit", {})
            body["trafficSplit"] = _scaled(current, args.traffic_percentage)
        if args.shadow_percentage:
            body["shadowTrafficPercentage"] = args.shadow_percentage
        return c.operation(c.call("POST", f"endpoints/{args.endpoint}:deployModel", body))
    if a == "undeploy":
        body = {"deployedModelId": args.deployed_model_id}
        if args.traffic_split:
            body["trafficSplit"] = _split(args.traffic_split)
        return c.operation(c.call("POST", f"endpoints/{args.endpoint}:undeployModel", body))
    if a == "update-traffic":
        return c.call("PATCH", f"endpoints/{args.endpoint}?updateMask=trafficSplit",
                      {"trafficSplit": _split(args.traffic_split)})
    if a == "predict":
        from modelyard.platform.instances_arg import read_instances

        try:
            instances = read_instances(args.instances, sys.stdin)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        return c.call("POST", f"endpoints/{args.endpoint}:predict", {"instances": instances})
    raise CliError(f"unknown action {a}")


JOB_COLLECTIONS = ("customJobs", "hyperparameterTuningJobs", "batchPredictionJobs", "trainingPipelines")
_FINAL = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")


def _camel(value):
    """snake_case keys -> camelCase, recursively (a spec written as gcloud or the SDK's dicts)."""
    if isinstance(value, list):
        return [_camel(v) for v in value]
    if isinstance(value, dict):
        return {re.sub(r"_([a-z])", lambda m: m.group(1).upper(), k): _camel(v) for k, v in value.items()}
    return value


def job_request(config_path: str, display_name: str | None) -> tuple[str, dict]:
    """(collection, resource body) for ``jobs submit --config``: a CustomJob spec (``jobSpec`` or
    ``workerPoolSpecs`` at the top), a HyperparameterTuningJob (``studySpec``), or else a modelyard
    training config, run as a one-replica CustomJob of ``modelyard train CONFIG``."""
    import yaml

    path = os.path.abspath(config_path)
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as exc:
        raise CliError(f"--config {config_path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise CliError(f"--config {config_path} is not YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise CliError(f"--config {config_path}: expected a mapping at the top")
    from modelyard.platform.jobs import study_submit

    if study_submit.is_study_file(doc):  # a `modelyard tune` study file, as it is
        try:
            return "hyperparameterTuningJobs", study_submit.tuning_job(Path(path), doc, display_name)
        except study_submit.SubmitError as exc:
            raise CliError(f"--config {config_path}: {exc}") from None
    doc = _camel(doc)
    name = display_name or doc.get("displayName") or os.path.splitext(os.path.basename(path))[0]
    if "studySpec" in doc:  # relative paths in its trial command are read beside the file, and sent along
        return "hyperparameterTuningJobs", study_submit.ship_trial_files(Path(path), {**doc, "displayName": name})
    if "workerPoolSpecs" in doc:
        doc = {"jobSpec": doc}
    if "jobSpec" in doc:
        return "customJobs", {**doc, "displayName": name}
    command = [sys.executable, "-m", "modelyard", "train", path]
    return "customJobs", {"displayName": name, "jobSpec": {"workerPoolSpecs": [{
        "replicaCount": "1", "machineSpec": {"machineType": "local"},
        "containerSpec": {"imageUri": "modelyard/train", "command": command}}]}}


def _find_job(c: Client, job: str) -> dict:
    """A job by full name or id (any of the job collections, training pipelines included)."""
    if "/" in job:
        return c.call("GET", job, absolute=True)
    last = None
    for coll in JOB_COLLECTIONS:
        try:
            return c.call("GET", f"{coll}/{job}")
        except CliError as exc:
            last = exc
            if not str(exc).startswith("NOT_FOUND"):
                raise
    raise last


def jobs_cmd(args: argparse.Namespace, c: Client):
    a = args.action
    if a == "submit":
        coll, body = job_request(args.config, args.display_name)
        job = c.call("POST", coll, body)
        deadline = time.monotonic() + args.timeout
        while args.wait and job["state"] not in _FINAL:
            if time.monotonic() > deadline:
                raise CliError(f"gave up after {args.timeout:g} s (--timeout) waiting for job {job['name']} to end "
                               f"(it is {job['state']}): modelyard jobs describe / cancel it")
            time.sleep(0.5)
            job = c.call("GET", job["name"], absolute=True)
        return job
    if a == "list":
        out = []
        for coll in JOB_COLLECTIONS:
            out += c.list(coll, coll)
        return sorted(out, key=lambda j: j["createTime"])
    job = _find_job(c, args.job)
    if a == "describe":
        return job
    if a == "cancel":
        c.call("POST", f"{job['name']}:cancel", {}, absolute=True)
        return c.call("GET", job["name"], absolute=True)
    if a == "logs":
        return RawText(c.raw(f"/modelyard/v1/jobs/{_short(job['name'])}/logs"))
    raise CliError(f"unknown action {a}")


class RawText(str):
    """Printed as is (a log), not as JSON."""


def _scaled(current: dict[str, int], percent: int) -> dict[str, int]:
    """The SDK's rule: the new model ("0") gets ``percent``; the others share the rest in proportion."""
    if not current:
        return {"0": 100}
    rest = 100 - percent
    total = sum(current.values()) or 1
    out = {k: v * rest // total for k, v in current.items()}
    leftover = rest - sum(out.values())
    for k in sorted(out, key=lambda k: -current[k])[:leftover]:
        out[k] += 1
    return {**out, "0": percent}


def register(subparsers) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--platform", default=os.environ.get("MODELYARD_PLATFORM", DEFAULT_URL),
                        help=f"the platform's URL (default $MODELYARD_PLATFORM or {DEFAULT_URL})")
    common.add_argument("--project", default="local")
    common.add_argument("--location", default="us-central1")
    common.add_argument("--token", default=os.environ.get("MODELYARD_PLATFORM_TOKEN"),
                        help="the platform's --auth-token (default $MODELYARD_PLATFORM_TOKEN)")
    # Only the commands that start an operation wait for it; --no-wait is theirs alone.
    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument("--no-wait", action="store_true", help="print the operation instead of waiting for it")
    waiting.add_argument("--timeout", type=float, default=900.0, metavar="S",
                         help="give up waiting for the operation after S seconds, saying so (default 900)")

    m = subparsers.add_parser("models", help="upload, list, describe, delete models on a modelyard platform")
    ms = m.add_subparsers(dest="action", required=True)
    up = ms.add_parser("upload", parents=[common, waiting], help="upload a SavedModel directory as a model (or a new version)")
    up.add_argument("--display-name", required=True)
    up.add_argument("--artifact-uri", required=True, help="SavedModel directory: path, file://, gs:// or s3://")
    up.add_argument("--parent-model", help="upload as a new version of this model id")
    up.add_argument("--model-id", help="the new model's id ([a-z_][a-z0-9_-]*, 63 characters at most; "
                    "default: a generated number)")
    up.add_argument("--version-aliases", nargs="*", default=[], metavar="ALIAS", help="aliases for this version")
    up.add_argument("--no-default-version", action="store_true",
                    help="a new version leaves the 'default' alias where it is")
    ms.add_parser("list", parents=[common])
    ms.add_parser("list-versions", parents=[common], help="every version of a model, with its aliases"
                  ).add_argument("model", help="model id")
    al = ms.add_parser("aliases", parents=[common], help="add or remove a version's aliases (an alias moves "
                       "from the version that held it)")
    al.add_argument("model", help="model id @version, e.g. my_model@2")
    al.add_argument("--add", nargs="*", default=[], metavar="ALIAS")
    al.add_argument("--remove", nargs="*", default=[], metavar="ALIAS")
    ms.add_parser("describe", parents=[common]).add_argument("model", help="model id, optionally @version")
    ms.add_parser("delete", parents=[common, waiting]).add_argument("model", help="model id, optionally @version")
    m.set_defaults(func=lambda a: _run(a, models_cmd))

    e = subparsers.add_parser("endpoints", help="create endpoints, deploy models, split traffic, predict")
    es = e.add_subparsers(dest="action", required=True)
    ec = es.add_parser("create", parents=[common, waiting])
    ec.add_argument("--display-name", required=True)
    ec.add_argument("--endpoint-id", help="the new endpoint's id: a number, 1-10 digits (default: a generated one)")
    es.add_parser("list", parents=[common])
    es.add_parser("describe", parents=[common]).add_argument("endpoint")
    es.add_parser("delete", parents=[common, waiting]).add_argument("endpoint")
    d = es.add_parser("deploy", parents=[common, waiting], help="deploy a model (waits until its replicas serve)")
    d.add_argument("endpoint")
    d.add_argument("--model", required=True, help="model id, optionally @version")
    d.add_argument("--min-replicas", type=int, default=1)
    d.add_argument("--max-replicas", type=int, default=0, help="default: --min-replicas")
    d.add_argument("--traffic-percentage", type=int, help="share for this model; the others keep their proportions")
    d.add_argument("--shadow-percentage", type=int, default=0, help="deploy as a shadow mirroring this share")
    u = es.add_parser("undeploy", parents=[common, waiting])
    u.add_argument("endpoint")
    u.add_argument("deployed_model_id")
    u.add_argument("--traffic-split", nargs="*", default=[], metavar="ID=PERCENT")
    t = es.add_parser("update-traffic", parents=[common], help="set the split, e.g. 123=90 456=10")
    t.add_argument("endpoint")
    t.add_argument("traffic_split", nargs="+", metavar="ID=PERCENT")
    p = es.add_parser("predict", parents=[common], help="predict: instances as JSON text, @FILE or - (stdin)")
    p.add_argument("endpoint")
    p.add_argument("--instances", required=True, metavar="JSON|@FILE|-",
                   help="a JSON list of instances or {\"instances\": [...]}: as text, @FILE for a file, - for stdin")
    e.set_defaults(func=lambda a: _run(a, endpoints_cmd))

    j = subparsers.add_parser("jobs", help="submit, list, describe, follow and cancel jobs on a modelyard platform")
    js = j.add_subparsers(dest="action", required=True)
    sb = js.add_parser("submit", parents=[common], help="submit a `modelyard tune` study file, a training config "
                       "(runs `modelyard train`), or a Vertex CustomJob / HyperparameterTuningJob spec")
    sb.add_argument("--config", required=True, metavar="FILE", help="YAML or JSON: a `modelyard tune` study file, "
                    "a modelyard training config, or a Vertex job spec")
    sb.add_argument("--display-name", help="default: the spec's displayName, else the file's name")
    sb.add_argument("--wait", action="store_true", help="wait until the job ends (exit 1 unless it succeeded); "
                    "default: print the job as created and return")
    sb.add_argument("--timeout", type=float, default=86400.0, metavar="S",
                    help="with --wait: give up waiting after S seconds, saying so (default 86400)")
    js.add_parser("list", parents=[common], help="every job (custom, tuning, batch prediction)")
    for action, what in (("describe", "the job's resource"), ("logs", "the job's log"), ("cancel", "cancel the job")):
        js.add_parser(action, parents=[common], help=what).add_argument("job", help="job id or resource name")
    j.set_defaults(func=lambda a: _run(a, jobs_cmd))
    from modelyard.platform.client_help import document

    document(subparsers)


def _run(args: argparse.Namespace, cmd) -> int:
    try:
        out = cmd(args, Client(args))
    except CliError as exc:
        print(f"modelyard {args.command} {args.action}: error: {exc}", file=sys.stderr)
        return 1
    if isinstance(out, RawText):
        sys.stdout.write(out)
        return 0
    print(json.dumps(out, indent=2))
    if args.command == "jobs" and getattr(args, "wait", False) and out.get("state") != "JOB_STATE_SUCCEEDED":
        return 1
    return 0
