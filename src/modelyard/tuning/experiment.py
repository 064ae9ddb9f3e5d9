"""A study recorded as a Vertex AI experiment (``modelyard tune --experiment NAME``): each trial is an
experiment run ``{study}-trial-{n}`` with the trial's parameters, its final metric values and its state,
written through the platform's ML Metadata REST API as the stock SDK writes a run (a ``system.ExperimentRun``
context, child of the ``system.Experiment`` context, with ``_params``, ``_metrics`` and ``_state`` in its
metadata; docs/metadata.md), so ``aiplatform.get_experiment_df()`` and the console's Experiments page show the
study's trials side by side. A HyperparameterTuningJob whose ``trialJobSpec.experiment`` names an experiment runs
its study with this recorder too.

The recorder is one more listener of the tuner's events (started, complete, failed, pruned), beside the
printed live view."""
from __future__ import annotations

import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable

from modelyard.json_http import json_request

EXPERIMENT, RUN = "system.Experiment", "system.ExperimentRun"
_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")


class RecordError(RuntimeError):
    """The platform refused or could not be reached; the message says which and why."""


def run_prefix(study_name: str) -> str:
    """The study's name as the start of a run id (lower case letters, digits and dashes)."""
    return re.sub(r"[^a-z0-9-]+", "-", study_name.lower()).strip("-") or "study"


class ExperimentRecorder:
    """Writes a study's trials into ``experiment`` of the platform at ``url`` (default store of
    ``projects/{project}/locations/{location}``)."""

    def __init__(self, url: str, experiment: str, study_name: str, project: str = "local",
                 location: str = "us-central1", token: str | None = None, timeout: float = 30.0) -> None:
        if not _ID.fullmatch(experiment):
            raise RecordError(f"experiment name {experiment!r} must match [a-z0-9][a-z0-9-]{{0,127}}")
        self.base = f"{url.rstrip('/')}/v1/projects/{project}/locations/{location}/metadataStores/default"
        self.experiment, self.prefix = experiment, run_prefix(study_name)
        self.token, self.timeout = token, timeout
        self._params: dict[int, dict[str, Any]] = {}
        self._last: dict[int, float] = {}

    # ---- REST -----------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict | None = None, query: dict | None = None,
              ok: tuple[int, ...] = ()) -> dict | None:
        url = f"{self.base}/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        try:
            return json_request(method, url, body, self.token, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            if exc.code in ok:
                return None
            try:
                words = json.loads(exc.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                words = exc.reason
            raise RecordError(f"{method} {url}: {exc.code} {words}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise RecordError(f"cannot reach the platform at {url}: {exc}") from None

    def _context(self, cid: str, body: dict) -> dict:
        """The context ``cid``, made with ``body`` if missing."""
        made = self._call("POST", "contexts", body, {"contextId": cid}, ok=(409,))
        return made if made is not None else self._call("GET", f"contexts/{cid}")

    # ---- what the tuner tells ---------------------------------------------------------------------
    def open(self) -> None:
        """The experiment, made if missing (the platform reachable and the name free for it, or the study
        does not start)."""
        row = self._context(self.experiment, {"displayName": self.experiment, "schemaTitle": EXPERIMENT,
                                              "metadata": {}})
        if row.get("schemaTitle") != EXPERIMENT:
            raise RecordError(f"context {self.experiment} exists and is a {row.get('schemaTitle')}, not an experiment")

    def _run(self, number: int, params: dict[str, Any] | None = None, metrics: dict[str, float] | None = None,
             state: str = "RUNNING") -> None:
        name = f"{self.prefix}-trial-{number + 1}"
        cid = f"{self.experiment}-{name}"
        if not _ID.fullmatch(cid):
            raise RecordError(f"run id {cid!r} is not a valid experiment run id (too long?)")
        if params is not None:
            self._params[number] = params
        row = self._context(cid, {"displayName": name, "schemaTitle": RUN,
                                  "metadata": {"_params": self._params.get(number, {}), "_metrics": {},
                                               "_state": state}})
        self._call("POST", f"contexts/{self.experiment}:addContextChildren", {"childContexts": [row["name"]]})
        meta = dict(row.get("metadata") or {})
        meta["_params"] = {**(meta.get("_params") or {}), **self._params.get(number, {})}
        meta["_metrics"] = {**(meta.get("_metrics") or {}), **(metrics or {})}
        meta["_state"] = state
        self._call("PATCH", f"contexts/{cid}", {"metadata": meta}, {"updateMask": "metadata"})

    def __call__(self, event: str, info: dict[str, Any]) -> None:
        number = info.get("number")
        if number is None:
            return
        try:
            self._tell(event, number, info)
        except RecordError as exc:  # the study goes on: its own database holds every trial whatever happens here
            print(f"modelyard tune: trial {number + 1} not recorded in experiment {self.experiment}: {exc}",
                  file=sys.stderr, flush=True)

    def _tell(self, event: str, number: int, info: dict[str, Any]) -> None:
        if event == "measurement":  # the last one is a stopped trial's final measurement
            self._last[number] = info["value"]
        elif event == "started":
            self._run(number, params=dict(info.get("params") or {}))
        elif event == "complete":
            self._run(number, metrics=dict(zip(self.metric_ids, info.get("values") or [])), state="COMPLETE")
        elif event == "failed":
            self._run(number, state="FAILED")
        elif event == "pruned":  # stopped early: its last measurement is final, as on Vertex
            last = self._last.get(number)
            self._run(number, metrics={self.metric_ids[0]: last} if last is not None else None, state="COMPLETE")

    metric_ids: list[str] = ["objective"]


def recorder_for(study, experiment: str, url: str | None, project: str, location: str,
                 token: str | None) -> ExperimentRecorder:
    """The recorder of ``study`` (a ``tuning.spec.Study``), its experiment opened; RecordError if it cannot be."""
    url = url or os.environ.get("MODELYARD_PLATFORM") or "http://127.0.0.1:8600"
    rec = ExperimentRecorder(url, experiment, study.name, project, location,
                             token or os.environ.get("MODELYARD_PLATFORM_TOKEN") or job_token())
    rec.metric_ids = [m.id for m in study.metrics] or ["objective"]
    rec.open()
    return rec


def job_token() -> str | None:
    """Inside a platform job: the job's own token, from its metadata server (as the SDK finds it)."""
    host = os.environ.get("GCE_METADATA_HOST")
    if not host:
        return None
    req = urllib.request.Request(f"http://{host}/computeMetadata/v1/instance/service-accounts/default/token",
                                 headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(req, timeout=10) as answer:
            return json.loads(answer.read())["access_token"]
    except (OSError, ValueError, KeyError):
        return None


def tee(*listeners: Callable[[str, dict], None]) -> Callable[[str, dict], None]:
    """One listener that tells each of ``listeners`` in turn."""
    def tell(event: str, info: dict) -> None:
        for listener in listeners:
            listener(event, info)
    return tell
