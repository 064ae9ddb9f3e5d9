"""Each metric source, end to end: a real `modelyard tune` process running real trial processes
finds the known optimum of a synthetic objective."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import yaml
from optuna.trial import TrialState

from modelyard.tuning.metrics import MetricsJsonReader, TensorBoardReader
from tests.tuning.conftest import TRIALS, best, run, trials, write_study


def _score(x: float, units: int) -> float:  # what hypertune_quadratic.py reports at its last step
    return 1.0 - (x - 0.3) ** 2 - 0.1 * (math.log2(units) - 6) ** 2


def test_hypertune_trials_with_flags_find_the_optimum(tmp_path: Path):
    study = write_study(tmp_path, "ht", [
        {"parameter_id": "x", "double_value_spec": {"min_value": 0.0, "max_value": 1.0}},
        {"parameter_id": "units", "integer_value_spec": {"min_value": 8, "max_value": 512}, "scale_type": "UNIT_LOG_SCALE"},
    ], "hypertune_quadratic.py", study_spec={"algorithm": "RANDOM_SEARCH"},
        max_trial_count=12, parallel_trial_count=2, seed=3)
    result = run(["tune", str(study)])
    assert result.returncode == 0, result.stdout
    done = trials(study)
    assert len(done) == 12 and all(t.state == TrialState.COMPLETE for t in done)
    for t in done:  # each value is what the trial computed from the flags it was given
        p = t.user_attrs["params"]
        assert math.isclose(t.values[0], _score(p["x"], p["units"]), rel_tol=1e-6)
        assert sorted(t.intermediate_values) == [1, 2, 3]  # one measurement per global_step
    top = best(study)
    assert top.values[0] == max(t.values[0] for t in done)
    assert abs(top.user_attrs["params"]["x"] - 0.3) < 0.15 and 32 <= top.user_attrs["params"]["units"] <= 128
    assert f"best: trial {top.number + 1}" in result.stdout
    plots = run(["tune", "status", str(study), "--plots", str(tmp_path / "plots")])
    assert plots.returncode == 0, plots.stdout
    for stem in ("optimization_history", "parallel_coordinate", "param_importances"):
        assert (tmp_path / "plots" / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "plotly" in (tmp_path / "plots" / f"{stem}.html").read_text()


def test_tensorboard_trials_with_conditional_grid_find_the_optimum(tmp_path: Path):
    study = write_study(tmp_path, "tb", [
        {"parameter_id": "optimizer", "categorical_value_spec": {"values": ["adam", "sgd"]},
         "conditional_parameter_specs": [{
             "parent_categorical_values": {"values": ["sgd"]},
             "parameter_spec": {"parameter_id": "momentum", "discrete_value_spec": {"values": [0.5, 0.9]}}}]},
        {"parameter_id": "lr", "discrete_value_spec": {"values": [0.01, 0.1]}},
    ], "tensorboard_curve.py", metric="accuracy", study_spec={"algorithm": "GRID_SEARCH"},
        max_trial_count=100, parallel_trial_count=2, trial={"hyperparameter_metric_tag": "epoch_accuracy"})
    result = run(["tune", str(study)])
    assert result.returncode == 0, result.stdout
    done = trials(study)
    assert len(done) == 6  # the grid: (adam + 2 sgd momenta) x 2 learning rates
    assert {tuple(sorted(t.user_attrs["params"])) for t in done} == {("lr", "optimizer"), ("lr", "momentum", "optimizer")}
    top = best(study)
    assert top.user_attrs["params"] == {"optimizer": "sgd", "momentum": 0.9, "lr": 0.01}
    assert math.isclose(top.values[0], 0.97, rel_tol=1e-6)  # validation run's last step, not train's
    assert sorted(top.intermediate_values) == [0, 1, 2]


def test_modelyard_train_trials_find_the_optimum(tmp_path: Path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "model": str(TRIALS / "objective_model.py"), "data": "digits", "epochs": 2, "global_batch_size": 256,
        "input_report": False, "tensorboard": True,
    }))
    study = write_study(tmp_path, "mt", [
        {"parameter_id": "shift", "discrete_value_spec": {"values": [0.5, 1.0]}},
    ], [sys.executable, "-m", "modelyard", "train", str(job)], metric="val_objective",
        study_spec={"algorithm": "GRID_SEARCH"}, max_trial_count=2, parallel_trial_count=2)
    result = run(["tune", str(study), "--export-best-to", str(tmp_path / "models" / "best")], timeout=180)
    assert result.returncode == 0, result.stdout
    done = trials(study)
    assert len(done) == 2 and all(t.state == TrialState.COMPLETE for t in done), result.stdout
    top = best(study)
    assert top.user_attrs["params"] == {"shift": 0.5} and math.isclose(top.values[0], 1.0, rel_tol=1e-6)
    assert sorted(top.intermediate_values) == [1, 2]  # per epoch, from metrics.json
    job_dir = Path(top.user_attrs["job_dir"])
    assert json.loads((job_dir / "metrics.json").read_text())["completed"] is True
    # The same run's TensorBoard files (written by TensorFlow itself) read the same values.
    epochs = MetricsJsonReader(job_dir)
    epochs.poll()
    board = TensorBoardReader(job_dir)
    board.poll()
    assert "tensorboard/validation/epoch_objective" in board.series, sorted(board.series)
    assert [round(v, 5) for v in board.series["tensorboard/validation/epoch_objective"].values()] == \
        [round(v, 5) for v in epochs.series["val_objective"].values()]
    # --export-best-to: the best trial's model is version 1 of the base path.
    assert (tmp_path / "models" / "best" / "0001" / "saved_model.pb").is_file(), result.stdout


def test_several_metrics_give_the_pareto_front(tmp_path: Path):
    study = write_study(tmp_path, "multi", [
        {"parameter_id": "x", "discrete_value_spec": {"values": [0.3]}},
        {"parameter_id": "units", "discrete_value_spec": {"values": [16, 64, 256]}},
    ], "hypertune_quadratic.py", study_spec={
        "algorithm": "GRID_SEARCH",
        "metrics": [{"metric_id": "score", "goal": "MAXIMIZE"}, {"metric_id": "cost", "goal": "MINIMIZE"}],
    }, max_trial_count=3, parallel_trial_count=2)
    result = run(["tune", str(study)])
    assert result.returncode == 0, result.stdout
    done = trials(study)
    assert sorted(t.values[1] for t in done) == [16, 64, 256]
    from modelyard.tuning import spec
    from modelyard.tuning.report import best_trials

    front = best_trials(spec.load(study), done)
    # 64 units has the best score, 16 the lowest cost; 256 is worse on both than 64.
    assert sorted(t.user_attrs["params"]["units"] for t in front) == [16, 64]
    assert result.stdout.count("best: trial") == 2
