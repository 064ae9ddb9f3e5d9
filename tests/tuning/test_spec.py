"""The study file: Vertex StudySpec semantics, and bad input refused before any trial runs."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import optuna
import pytest

from modelyard.tuning import space, spec
from tests.tuning.conftest import run, write_study

X = {"parameter_id": "x", "double_value_spec": {"min_value": 0.0, "max_value": 1.0}}


@pytest.mark.parametrize("parameters, trial, expected", [
    ([{**X, "scale_type": "UNIT_SQRT_SCALE"}], {}, "scale_type 'UNIT_SQRT_SCALE' is unknown"),
    ([{"parameter_id": "x", "double_value_spec": {"min_value": 2, "max_value": 1}}], {},
     "min_value 2.0 is greater than max_value 1.0"),
    ([{**X, "scale_type": "UNIT_LOG_SCALE"}], {}, "UNIT_LOG_SCALE needs min_value > 0"),
    ([X], {"command": ["no-such-trainer-xyz", "--fast"]}, "'no-such-trainer-xyz' was not found on PATH"),
    ([X], {"command": [sys.executable, "missing_train.py"]}, "script missing_train.py not found"),
])
def test_bad_study_fails_before_any_trial(tmp_path: Path, parameters, trial, expected):
    study = write_study(tmp_path, "bad", parameters, "hypertune_quadratic.py", trial=trial)
    result = run(["tune", str(study)], timeout=60)
    assert result.returncode == 2, result.stdout
    assert "modelyard tune: error:" in result.stdout and expected in result.stdout, result.stdout
    assert not (tmp_path / "runs").exists()  # no trial ran
    assert not (tmp_path / "bad.tuning.db").exists()  # no study was created


def _load(tmp_path: Path, parameters, **top) -> spec.Study:
    return spec.load(write_study(tmp_path, "s", parameters, "hypertune_quadratic.py", **top))


@pytest.mark.parametrize("parameters, top, expected", [
    ([{"parameter_id": "n", "integer_value_spec": {"min_value": 0, "max_value": 8}, "scale_type": "UNIT_REVERSE_LOG_SCALE"}],
     {}, "UNIT_REVERSE_LOG_SCALE needs min_value > 0"),
    ([{"parameter_id": "b", "discrete_value_spec": {"values": [64, 32]}}], {}, "strictly increasing"),
    ([X, X], {}, "parameter_id 'x' is used twice"),
    ([X], {"study_spec": {"algorithm": "GRID_SEARCH"}}, "parameter x is DOUBLE; a grid needs"),
    ([X], {"study_spec": {"metrics": [{"metric_id": "a", "goal": "BIGGER"}]}}, "goal 'BIGGER' is not one of"),
    ([X], {"trial": {"command": "modelyard train job.yaml", "params_as": "flags"}}, "takes no hyperparameter flags"),
    ([{"parameter_id": "opt", "categorical_value_spec": {"values": ["adam", "sgd"]},
       "conditional_parameter_specs": [{"parent_categorical_values": {"values": ["rmsprop"]},
                                        "parameter_spec": X}]}], {}, "parent values ['rmsprop'] are not values of opt"),
    ([X], {"max_trial_count": 0}, "max_trial_count: must be an integer >= 1"),
    ([{**X, "double_value_spec": {"min_value": 0, "max_value": 1, "step": 2}}], {}, "unknown key(s) step"),
])
def test_spec_errors_name_the_key(tmp_path: Path, parameters, top, expected):
    with pytest.raises(spec.SpecError) as err:
        _load(tmp_path, parameters, **top)
    assert expected in str(err.value)


def test_vertex_json_spec_is_read_unchanged(tmp_path: Path):
    """camelCase StudySpec as Vertex's REST API and SDK send it (int64 as strings)."""
    vertex = {
        "metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}],
        "parameters": [
            {"parameterId": "lr", "doubleValueSpec": {"minValue": 1e-4, "maxValue": 0.1}, "scaleType": "UNIT_LOG_SCALE"},
            {"parameterId": "units", "integerValueSpec": {"minValue": "16", "maxValue": "256"}},
            {"parameterId": "optimizer", "categoricalValueSpec": {"values": ["adam", "sgd"]},
             "conditionalParameterSpecs": [{"parentCategoricalValues": {"values": ["sgd"]},
                                            "parameterSpec": {"parameterId": "momentum",
                                                              "discreteValueSpec": {"values": [0.0, 0.5, 0.9]}}}]},
        ],
        "measurementSelectionType": "BEST_MEASUREMENT",
        "medianAutomatedStoppingSpec": {},
    }
    path = tmp_path / "v.yaml"
    path.write_text(json.dumps({"studySpec": vertex, "maxTrialCount": 5, "parallelTrialCount": 2,
                                "trial": {"command": [sys.executable, "-c", "pass"]}}))
    study = spec.load(path)
    assert [p.id for p in study.params] == ["lr", "units", "optimizer"]
    assert (study.params[0].scale, study.params[1].min, study.params[1].max) == ("UNIT_LOG_SCALE", 16, 256)
    assert study.params[2].children[0][0] == ["sgd"] and study.params[2].children[0][1].values == [0.0, 0.5, 0.9]
    assert study.selection == "BEST_MEASUREMENT" and study.stopping["method"] == "median"
    assert (study.max_trials, study.parallel, study.params_as) == (5, 2, "flags")


def test_conditional_children_only_when_parent_matches(tmp_path: Path):
    study = _load(tmp_path, [{"parameter_id": "optimizer", "categorical_value_spec": {"values": ["adam", "sgd"]},
                              "conditional_parameter_specs": [{"parent_categorical_values": {"values": ["sgd"]},
                                                               "parameter_spec": X}]}])
    ostudy = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(20):
        params = space.suggest(ostudy.ask(), study.params)
        assert ("x" in params) == (params["optimizer"] == "sgd")
        seen.add(params["optimizer"])
    assert seen == {"adam", "sgd"}
    # The grid visits each branch: adam alone, sgd with each x... but x is DOUBLE, so use a discrete child.
    study.params[0].children[0][1].kind = "DISCRETE"
    study.params[0].children[0][1].values = [0.1, 0.2]
    assert space.grid(study.params) == [{"optimizer": "adam"}, {"optimizer": "sgd", "x": 0.1},
                                        {"optimizer": "sgd", "x": 0.2}]
    assert spec.grid_size(study.params) == 3


def test_log_and_reverse_log_scales_stay_in_range_and_lean_as_vertex_says(tmp_path: Path):
    params = [{"parameter_id": name, "double_value_spec": {"min_value": 1.0, "max_value": 1000.0}, "scale_type": scale}
              for name, scale in (("lin", "UNIT_LINEAR_SCALE"), ("log", "UNIT_LOG_SCALE"),
                                  ("rev", "UNIT_REVERSE_LOG_SCALE"))]
    study = _load(tmp_path, params)
    ostudy = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    draws = [space.suggest(ostudy.ask(), study.params) for _ in range(400)]
    for name in ("lin", "log", "rev"):
        assert all(1.0 <= d[name] <= 1000.0 for d in draws)
    share_low = {name: sum(d[name] < 100 for d in draws) / len(draws) for name in ("lin", "log", "rev")}
    # log: two of three decades below 100 -> ~2/3; linear ~0.1; reverse log mirrors log -> near 0.
    assert share_low["log"] > 0.5 and 0.03 < share_low["lin"] < 0.2 and share_low["rev"] < 0.05
    assert math.isclose(space.to_internal(study.params[2], 900.0), 101.0)


def test_devices_give_disjoint_slots_and_refuse_overlaps():
    from modelyard.tuning import devices

    cores = sorted(__import__("os").sched_getaffinity(0))
    split = devices.parse("cpu", 2)
    assert [s.ids for s in split] == [(cores[0],), (cores[1],)]
    assert split[0].env()["TF_NUM_INTRAOP_THREADS"] == "1" and split[0].env()["CUDA_VISIBLE_DEVICES"] == ""
    assert [s.ids for s in devices.parse("gpu:0,1", 2)] == [(0,), (1,)]
    assert devices.parse("gpu:1", 1)[0].env() == {"CUDA_VISIBLE_DEVICES": "1"}
    for bad, expected in (("cpu:0,0", "slots must be disjoint"), ("cpu:0-1,1", "slots must be disjoint"),
                          ("cpu:9999", "not available to this process"), ("tpu:0", "use cpu, cpu:0,1"),
                          ("cpu:1-0", "bad range")):
        with pytest.raises(devices.DeviceError) as err:
            devices.parse(bad, 1)
        assert expected in str(err.value)
    with pytest.raises(devices.DeviceError, match="parallel trials need"):
        devices.parse("cpu", len(cores) + 1)


def test_a_vertex_hyperparameter_tuning_job_is_a_study_file(tmp_path: Path):
    """The HyperparameterTuningJob resource the SDK sends: container command + args run here, the
    image is recorded, the trial's parameters go as --name=value flags."""
    job = {
        "displayName": "hpt", "maxTrialCount": 4, "parallelTrialCount": 2, "maxFailedTrialCount": 1,
        "studySpec": {"metrics": [{"metricId": "score", "goal": "MAXIMIZE"}],
                      "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0, "maxValue": 1},
                                      "scaleType": "UNIT_LINEAR_SCALE"}]},
        "trialJobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
            "containerSpec": {"imageUri": "gcr.io/p/trainer:1", "command": ["python3", "trainer.py"],
                              "args": ["--epochs=3"], "env": [{"name": "MODE", "value": "fast"}]}}]},
        "baseOutputDirectory": {"outputUriPrefix": str(tmp_path / "out")},
    }
    (tmp_path / "trainer.py").write_text("")
    path = tmp_path / "hpt.json"
    path.write_text(json.dumps(job))
    study = spec.load(path)
    assert study.command == [sys.executable, "trainer.py", "--epochs=3"] and study.env == {"MODE": "fast"}
    assert (study.image_uri, study.job_dir, study.max_failed) == ("gcr.io/p/trainer:1", tmp_path / "out", 1)
    job["trialJobSpec"]["workerPoolSpecs"][0]["containerSpec"].pop("command")
    path.write_text(json.dumps(job))
    with pytest.raises(spec.SpecError, match="the image's entrypoint cannot run here"):
        spec.load(path)
