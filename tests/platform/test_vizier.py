"""Vertex AI Vizier on the platform, through the stock SDK (``aiplatform.vizier``) and REST: Google's
``test_vizier`` loop (tests/system/aiplatform), workers' own trials, the Pareto front, median early
stopping, bad input in Google's error format, and a study that outlives a platform restart."""
from __future__ import annotations

import uuid

import pytest
import requests

from tests.platform.jobs_helpers import aiplatform  # noqa: F401  (the module's SDK, polling quickly)


def _config(pyvizier, algorithm=None, metrics=(("pr-auc", "MAXIMIZE"),), stopping=None):
    sc = pyvizier.StudyConfig()
    if algorithm is not None:
        sc.algorithm = algorithm
    for name, goal in metrics:
        sc.metric_information.append(pyvizier.MetricInformation(name=name, goal=getattr(pyvizier.ObjectiveMetricGoal, goal)))
    root = sc.search_space.select_root()
    root.add_float_param("learning_rate", 0.00001, 1.0, scale_type=pyvizier.ScaleType.LINEAR)
    root.add_categorical_param("optimizer", ["adagrad", "adam", "experimental"])
    if stopping is not None:
        sc.automated_stopping_config = stopping
    return sc


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_pyvizier_loop_as_google_test_vizier(aiplatform):  # noqa: F811
    from google.api_core import exceptions
    from google.cloud.aiplatform.vizier import Study, Trial, pyvizier

    sc = _config(pyvizier, pyvizier.Algorithm.RANDOM_SEARCH,
                 stopping=pyvizier.AutomatedStoppingConfig.decay_curve_stopping_config(use_steps=True))
    display = _name("vizier-lifecycle")
    study = Study.create_or_load(display_name=display, problem=sc)
    assert Study.create_or_load(display_name=display, problem=sc).name == study.name  # the same study again
    trials = study.suggest(count=3, worker="halio_test_worker")
    assert len(trials) == 3
    for trial in trials:
        params = {k: v.value for k, v in trial.parameters.items()}
        assert 0.00001 <= params["learning_rate"] <= 1.0 and params["optimizer"] in ("adagrad", "adam", "experimental")
        if not trial.should_stop():
            measurement = pyvizier.Measurement()
            measurement.metrics["pr-auc"] = 0.4
            trial.add_measurement(measurement=measurement)
            trial.complete(measurement=measurement)
    for trial in study.trials():
        assert trial.status == pyvizier.TrialStatus.COMPLETED
    optimal = study.optimal_trials()
    assert optimal and optimal[0].status == pyvizier.TrialStatus.COMPLETED
    assert {t.uid for t in optimal} == {t.uid for t in trials}  # a tie: every one is optimal

    # Study.materialize_study_config() as it is minus its bug: it passes credentials= to get_study, which
    # takes none (a TypeError before any request, whatever the server).
    config = pyvizier.StudyConfig.from_proto(study.api_client.get_study(name=study.resource_name).study_spec)
    assert [m.name for m in config.metric_information] == ["pr-auc"]
    assert config.algorithm == pyvizier.Algorithm.RANDOM_SEARCH
    assert set(config.search_space.parameter_names) == {"learning_rate", "optimizer"}

    # A worker gets its own trials back while they are active; another worker gets new ones.
    first = study.suggest(count=2, worker="w1")
    again = study.suggest(count=2, worker="w1")
    other = study.suggest(count=1, worker="w2")
    assert [t.uid for t in again] == [t.uid for t in first]
    assert other[0].uid not in {t.uid for t in first}
    first[0].complete(infeasible_reason="diverged")
    assert first[0].materialize().infeasibility_reason == "diverged"
    after = study.suggest(count=2, worker="w1")
    assert first[1].uid in {t.uid for t in after} and first[0].uid not in {t.uid for t in after}

    # Deletes: a trial, then the study (Google's test_vizier_trial_deletion and _study_deletion).
    doomed = study.suggest(count=1, worker="halio_test_worker")[0]
    doomed.delete()
    with pytest.raises(exceptions.NotFound):
        Trial(study_id=study.name, trial_name=doomed.name)
    study.delete()
    with pytest.raises(exceptions.NotFound):
        Study(study_id=study.name)


def _rest(platform, method: str, path: str, **kw) -> requests.Response:
    return requests.request(method, platform.api(path), timeout=30, **kw)


def _create(platform, spec: dict, display: str) -> str:
    r = _rest(platform, "POST", "studies", json={"displayName": display, "studySpec": spec})
    assert r.status_code == 200, r.text
    return r.json()["name"].split("/locations/us-central1/")[1]


X = {"parameterId": "x", "doubleValueSpec": {"minValue": 0.0, "maxValue": 1.0}}


def test_list_optimal_trials_is_the_pareto_front(platform):
    spec = {"metrics": [{"metricId": "acc", "goal": "MAXIMIZE"}, {"metricId": "latency", "goal": "MINIMIZE"}],
            "parameters": [X], "algorithm": "RANDOM_SEARCH"}
    study = _create(platform, spec, _name("pareto"))
    points = {0.1: (0.9, 30.0), 0.2: (0.8, 10.0), 0.3: (0.7, 20.0), 0.4: (0.95, 40.0), 0.5: (0.6, 5.0),
              0.6: (0.8, 12.0), 0.7: (0.9, 30.0)}
    ids = {}
    for x, (acc, lat) in points.items():
        r = _rest(platform, "POST", f"{study}/trials", json={
            "parameters": [{"parameterId": "x", "value": x}],
            "finalMeasurement": {"metrics": [{"metricId": "acc", "value": acc}, {"metricId": "latency", "value": lat}]}})
        assert r.status_code == 200 and r.json()["state"] == "SUCCEEDED", r.text
        ids[r.json()["id"]] = x
    r = _rest(platform, "POST", f"{study}/trials:listOptimalTrials", json={})
    assert r.status_code == 200, r.text
    front = {ids[t["id"]] for t in r.json()["optimalTrials"]}
    # 0.3 (0.7, 20) is dominated by 0.6 (0.8, 12) and 0.6 by 0.2 (0.8, 10); ties (0.1 and 0.7) both stay.
    assert front == {0.1, 0.2, 0.4, 0.5, 0.7}
    # The console lists the study with the tuning jobs: its trials done and the first metric per trial.
    shown = [j for j in requests.get(f"{platform.url}/console/api/state", timeout=30).json()["jobs"]
             if j["name"].endswith(study)]
    assert len(shown) == 1 and shown[0]["kind"] == "studies" and shown[0]["progress"]["done"] == 7, shown
    assert shown[0]["curve"]["values"] == [acc for acc, _ in points.values()]


def test_median_stopping_stops_a_trial_below_the_median(platform):
    spec = {"metrics": [{"metricId": "acc", "goal": "MAXIMIZE"}], "parameters": [X],
            "medianAutomatedStoppingSpec": {}, "algorithm": "RANDOM_SEARCH"}
    study = _create(platform, spec, _name("median"))

    def trial_with(curve: list[float], complete: bool) -> str:
        r = _rest(platform, "POST", f"{study}/trials:suggest", json={"suggestionCount": 1, "clientId": str(curve)})
        op = r.json()
        while not op.get("done"):
            op = requests.get(f"{platform.url}/v1/{op['name']}", timeout=30).json()
        name = op["response"]["trials"][0]["name"].split("/locations/us-central1/")[1]
        for step, value in enumerate(curve, start=1):
            r = _rest(platform, "POST", f"{name}:addTrialMeasurement",
                      json={"measurement": {"stepCount": step, "metrics": [{"metricId": "acc", "value": value}]}})
            assert r.status_code == 200, r.text
        if complete:
            assert _rest(platform, "POST", f"{name}:complete", json={}).json()["state"] == "SUCCEEDED"
        return name

    def should_stop(name: str) -> bool:
        op = _rest(platform, "POST", f"{name}:checkTrialEarlyStoppingState", json={}).json()
        assert op["done"] and op["name"].startswith(f"projects/local/locations/us-central1/{name}/operations/"), op
        return op["response"]["shouldStop"]

    for curve in ([0.5, 0.6, 0.7], [0.6, 0.7, 0.8], [0.4, 0.65, 0.9]):
        trial_with(curve, complete=True)
    good = trial_with([0.55, 0.66], complete=False)
    bad = trial_with([0.3, 0.35], complete=False)
    assert should_stop(good) is False
    assert should_stop(bad) is True  # best 0.35 < median of running averages at step 2 (0.6)
    assert _rest(platform, "GET", bad).json()["state"] == "STOPPING"
    assert _rest(platform, "GET", good).json()["state"] == "ACTIVE"


@pytest.mark.parametrize("body, status, text", [
    ({"displayName": "bad", "studySpec": {"metrics": [{"metricId": "a", "goal": "MAXIMIZE"}],
                                          "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 2,
                                                                                                  "maxValue": 1}}]}},
     "INVALID_ARGUMENT", "min_value 2.0 is greater than max_value 1.0"),
    ({"displayName": "bad", "studySpec": {"metrics": [], "parameters": [X]}}, "INVALID_ARGUMENT", "study_spec.metrics"),
    ({"displayName": "bad", "studySpec": {"metrics": [{"metricId": "a", "goal": "MAXIMIZE"}], "parameters": [X]},
      "colour": 1}, "INVALID_ARGUMENT", 'Unknown name "colour"'),
    ({"studySpec": {"metrics": [{"metricId": "a", "goal": "MAXIMIZE"}], "parameters": [X]}},
     "INVALID_ARGUMENT", "display_name is required"),
])
def test_bad_study_is_refused_in_googles_format(platform, body, status, text):
    r = _rest(platform, "POST", "studies", json=body)
    error = r.json()["error"]
    assert r.status_code == 400 and error["status"] == status and text in error["message"], r.text


def test_bad_trial_calls_are_refused_in_googles_format(platform):
    spec = {"metrics": [{"metricId": "acc", "goal": "MAXIMIZE"}], "parameters": [X], "algorithm": "RANDOM_SEARCH"}
    display = _name("errors")
    study = _create(platform, spec, display)
    again = _rest(platform, "POST", "studies", json={"displayName": display, "studySpec": spec})
    assert again.status_code == 200 and again.json()["name"].endswith(study)  # the same study: idempotent
    other = {**spec, "algorithm": "GRID_SEARCH"}
    again = _rest(platform, "POST", "studies", json={"displayName": display, "studySpec": other})
    assert again.status_code == 409 and again.json()["error"]["status"] == "ALREADY_EXISTS"
    assert _rest(platform, "GET", "studies/12345").json()["error"]["status"] == "NOT_FOUND"
    r = _rest(platform, "POST", f"{study}/trials", json={"parameters": [{"parameterId": "x", "value": 7}]})
    assert r.status_code == 400 and "outside [0.0, 1.0]" in r.json()["error"]["message"]
    r = _rest(platform, "POST", f"{study}/trials:suggest", json={"suggestionCount": 0, "clientId": "w"})
    assert r.status_code == 400 and "suggestion_count" in r.json()["error"]["message"]
    trial = _rest(platform, "POST", f"{study}/trials", json={"parameters": [{"parameterId": "x", "value": 0.5}]}).json()
    assert trial["state"] == "REQUESTED"
    path = trial["name"].split("/locations/us-central1/")[1]
    r = _rest(platform, "POST", f"{path}:complete", json={})
    assert r.status_code == 400 and "has no measurement" in r.json()["error"]["message"]
    assert _rest(platform, "POST", f"{path}:complete", json={"trialInfeasible": True,
                                                             "infeasibleReason": "nan"}).json()["state"] == "INFEASIBLE"
    r = _rest(platform, "POST", f"{path}:complete", json={})
    assert r.status_code == 400 and r.json()["error"]["status"] == "FAILED_PRECONDITION"


def test_a_study_and_its_active_trials_survive_a_restart(platform):
    spec = {"metrics": [{"metricId": "y", "goal": "MINIMIZE"}],
            "parameters": [X, {"parameterId": "n", "integerValueSpec": {"minValue": 1, "maxValue": 4}}]}
    study = _create(platform, spec, _name("restart"))  # algorithm unset: the GP bandit

    def suggest(client: str, count: int) -> list[dict]:
        op = _rest(platform, "POST", f"{study}/trials:suggest", json={"suggestionCount": count, "clientId": client}).json()
        while not op.get("done"):
            op = requests.get(f"{platform.url}/ui/{op['name']}", timeout=30).json()
        assert "error" not in op, op
        return op["response"]["trials"]

    def complete(trial: dict) -> None:
        params = {p["parameterId"]: p["value"] for p in trial["parameters"]}
        path = trial["name"].split("/locations/us-central1/")[1]
        r = _rest(platform, "POST", f"{path}:complete", json={"finalMeasurement": {
            "metrics": [{"metricId": "y", "value": (params["x"] - 0.3) ** 2 + params["n"]}]}})
        assert r.status_code == 200, r.text

    for trial in suggest("w", 5):
        complete(trial)
    active = suggest("w", 2)
    platform.stop()
    platform.start()
    assert _rest(platform, "GET", study).json()["state"] == "ACTIVE"
    assert [t["id"] for t in suggest("w", 2)] == [t["id"] for t in active]  # the same worker's active trials
    for trial in active:
        complete(trial)
    fresh = suggest("w", 1)
    assert int(fresh[0]["id"]) == 8 and fresh[0]["state"] == "ACTIVE"
    listed = _rest(platform, "GET", f"{study}/trials").json()["trials"]
    assert [t["state"] for t in listed] == ["SUCCEEDED"] * 7 + ["ACTIVE"]


def test_a_grid_tuning_job_visits_every_point_once_and_is_a_study(platform, tmp_path):
    """A HyperparameterTuningJob runs on the same engine: GRID_SEARCH hands out each of the 4 points once,
    however many trials the job allows; its trials are listed as a Vizier study, as on Vertex."""
    import sys
    from pathlib import Path

    from tests.platform.jobs_helpers import wait_state

    script = Path(__file__).resolve().parents[1] / "tuning" / "trials" / "hypertune_quadratic.py"
    body = {"displayName": "grid-job", "maxTrialCount": 10, "parallelTrialCount": 2,
            "studySpec": {"metrics": [{"metricId": "score", "goal": "MAXIMIZE"}], "algorithm": "GRID_SEARCH",
                          "parameters": [{"parameterId": "x", "discreteValueSpec": {"values": [0.1, 0.3]}},
                                         {"parameterId": "units", "discreteValueSpec": {"values": [32, 64]}}]},
            "trialJobSpec": {"workerPoolSpecs": [{"replicaCount": "1", "containerSpec": {
                "imageUri": "x", "command": [sys.executable, str(script)], "args": ["--epochs=1"]}}],
                "baseOutputDirectory": {"outputUriPrefix": str(tmp_path)}}}
    r = requests.post(platform.api("hyperparameterTuningJobs"), json=body, timeout=30)
    assert r.status_code == 200, r.text
    job = wait_state(platform, r.json()["name"], ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"), timeout=180)
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    points = sorted(tuple(sorted((p["parameterId"], float(p["value"])) for p in t["parameters"])) for t in job["trials"])
    assert points == sorted((("units", u), ("x", x)) for x in (0.1, 0.3) for u in (32.0, 64.0))
    # The job's trials are a Vizier study (its id the job's): listed, read, not changed but by the job.
    study = "studies/" + job["name"].rsplit("/", 1)[1]
    got = _rest(platform, "GET", study).json()
    assert got["displayName"] == "grid-job" and got["state"] == "COMPLETED", got
    assert got["studySpec"]["algorithm"] == "GRID_SEARCH"
    assert got["name"] in [s["name"] for s in _rest(platform, "GET", "studies").json()["studies"]]
    listed = _rest(platform, "GET", f"{study}/trials").json()["trials"]
    assert [t["id"] for t in listed] == [t["id"] for t in job["trials"]]
    assert _rest(platform, "GET", f"{study}/trials/{listed[0]['id']}").json()["parameters"] == job["trials"][0]["parameters"]
    r = _rest(platform, "POST", f"{study}/trials:suggest", json={"suggestionCount": 1, "clientId": "w"})
    assert r.status_code == 400 and r.json()["error"]["status"] == "FAILED_PRECONDITION", r.text
    # The console shows it once: as the job.
    shown = [j["kind"] for j in requests.get(f"{platform.url}/console/api/state", timeout=30).json()["jobs"]
             if j["name"].rsplit("/", 1)[-1] == study.rsplit("/", 1)[-1]]
    assert shown == ["hyperparameterTuningJobs"]


def check_vizier_store(url: str) -> None:
    """Vizier's tables and rules on one database (SQLite here, PostgreSQL from test_postgres): a study made
    again with its spec is the same study, trial ids count from 1 per study, completing picks the
    measurement the spec says, the optimal trial, deletes; two platforms writing at once
    (check_concurrent_vizier_writes); all without a platform process."""
    from types import SimpleNamespace

    from modelyard.platform.api.errors import ApiError
    from modelyard.platform.resources import studies, trials
    from modelyard.platform.state.store import Store

    store = Store(url)
    try:
        p = SimpleNamespace(store=store)
        spec = {"metrics": [{"metricId": "acc", "goal": 1}], "measurementSelectionType": 2,  # enum numbers
                "parameters": [{"parameterId": "x", "doubleValueSpec": {"maxValue": 1}}]}  # minValue 0 left out
        made = studies.create(p, "projects/p/locations/l", {"displayName": "s", "studySpec": spec})
        assert made["studySpec"]["metrics"][0]["goal"] == "MAXIMIZE" and made["studySpec"]["measurementSelectionType"] == "BEST_MEASUREMENT"
        assert studies.create(p, "projects/p/locations/l", {"displayName": "s", "studySpec": spec})["name"] == made["name"]
        study = studies.db.get_study(store.engine, made["name"].rsplit("/", 1)[1])
        ids = []
        for x in (0.2, 0.4, 0.6):
            trial = trials.create(p, study, {"parameters": [{"parameterId": "x", "value": x}]})
            ids.append(int(trial["id"]))
            for step, acc in enumerate((x, 1 - x, x / 2), start=1):
                trials.add_measurement(p, study, ids[-1], {"measurement": {"stepCount": step,
                                                                           "metrics": [{"metricId": "acc", "value": acc}]}})
            done = trials.complete(p, study, ids[-1], {})
            assert done["finalMeasurement"]["metrics"][0]["value"] == max(x, 1 - x, x / 2)  # BEST_MEASUREMENT
        assert ids == [1, 2, 3]
        assert [t["id"] for t in trials.optimal(p, study)["optimalTrials"]] == ["1"]  # 0.8 at x=0.2
        with pytest.raises(ApiError) as err:
            trials.stop(p, study, 1, {})
        assert err.value.status == "FAILED_PRECONDITION"
        studies.db.delete_study(store.engine, study["id"])
        with pytest.raises(ApiError):
            studies.db.get_study(store.engine, study["id"])
        assert studies.db.list_trials(store.engine, study["id"]) == []
    finally:
        store.close()
    check_concurrent_vizier_writes(url)


def check_concurrent_vizier_writes(url: str) -> None:
    """Two platforms on one store (two Stores, two threads each) adding trials to one study and the
    same display names at once: trial ids stay 1..n with none refused, and each name is one study."""
    import threading
    import time
    import uuid

    from modelyard.platform.state import vizier_schema as db
    from modelyard.platform.state.store import Store

    stores = [Store(url), Store(url)]
    parent, tag = "projects/race/locations/l", uuid.uuid4().hex[:8]
    study = {"id": f"9{int(tag, 16)}", "parent": parent, "display_name": f"trials-{tag}", "spec": {}, "state": "ACTIVE",
             "inactive_reason": "", "created": time.time()}
    db.add_study(stores[0].engine, study)
    ids, errors, made = [], [], []

    def work(store, worker: int) -> None:
        try:
            for i in range(8):
                ids.extend(r["id"] for r in db.add_trials(store.engine, study["id"], [{"state": "ACTIVE", "doc": {}}] * 2))
                made.append(db.add_study(store.engine, {**study, "id": f"{worker}{i}{study['id']}",
                                                        "display_name": f"name-{tag}-{i}"})["id"])
        except Exception as exc:  # noqa: BLE001  (reported by the assert below)
            errors.append(repr(exc))

    try:
        threads = [threading.Thread(target=work, args=(stores[n % 2], n)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:3]
        assert sorted(ids) == list(range(1, 65))
        names = [r["display_name"] for r in db.list_studies(stores[0].engine, parent) if tag in r["display_name"]]
        assert sorted(names) == sorted({f"trials-{tag}"} | {f"name-{tag}-{i}" for i in range(8)}), names
        assert len(set(made)) == 8  # every worker got the one study of each name
    finally:
        for store in stores:
            store.close()


def test_vizier_store_on_sqlite(tmp_path):
    check_vizier_store(f"sqlite:///{tmp_path / 'platform.db'}")


@pytest.mark.parametrize("tail, vizier", [
    ("projects/p/locations/l/studies", True), ("projects/p/locations/l/studies:lookup", True),
    ("projects/p/locations/l/studies/1/trials/2:complete", True),
    ("projects/p/locations/l/studies/1/trials/2/operations/3", True),
    ("projects/p/locations/l/metadataStores/default/artifacts/studies1", False),  # an id that starts "studies"
    ("projects/p/locations/l/studiesx", False), ("projects/p/locations/l/models/1", False),
])
def test_only_vizier_paths_go_to_the_studies(tail, vizier):
    from modelyard.platform.resources.studies import is_vizier_path

    assert is_vizier_path(tail) is vizier
