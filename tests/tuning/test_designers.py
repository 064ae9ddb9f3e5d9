"""The tuning engine (tuning.designers, tuning.gp_bandit, tuning.stopping), without processes: each
algorithm's points stay in the space, the GP bandit learns, a grid hands each point out once, and
the stopping rules stop what they should."""
from __future__ import annotations

import math

import pytest

from modelyard.tuning import designers, stopping
from modelyard.tuning.spec import SpecError, parse_search

SPACE = {
    "metrics": [{"metricId": "y", "goal": "MINIMIZE"}],
    "parameters": [
        {"parameterId": "lr", "doubleValueSpec": {"minValue": 1e-4, "maxValue": 1.0}, "scaleType": "UNIT_LOG_SCALE"},
        {"parameterId": "units", "integerValueSpec": {"minValue": 8, "maxValue": 64}},
        {"parameterId": "decay", "doubleValueSpec": {"minValue": 0.01, "maxValue": 0.99},
         "scaleType": "UNIT_REVERSE_LOG_SCALE"},
        {"parameterId": "batch", "discreteValueSpec": {"values": [16, 32, 64]}},
        {"parameterId": "opt", "categoricalValueSpec": {"values": ["adam", "sgd"]},
         "conditionalParameterSpecs": [{"parentCategoricalValues": {"values": ["sgd"]}, "parameterSpec": {
             "parameterId": "momentum", "doubleValueSpec": {"minValue": 0.0, "maxValue": 0.9}}}]},
    ],
}


def _objective(p: dict) -> float:
    return (math.log10(p["lr"]) + 2) ** 2 + ((p["units"] - 40) / 20) ** 2 + (p["opt"] == "sgd") * 0.5


def _check_in_space(p: dict) -> None:
    assert 1e-4 <= p["lr"] <= 1.0 and isinstance(p["units"], int) and 8 <= p["units"] <= 64
    assert 0.01 <= p["decay"] <= 0.99 and p["batch"] in (16, 32, 64) and p["opt"] in ("adam", "sgd")
    assert ("momentum" in p) == (p["opt"] == "sgd")


@pytest.mark.parametrize("algorithm", ["gp_bandit", "random", "tpe"])
def test_every_algorithm_suggests_inside_the_space(algorithm):
    metrics, params, _, _ = parse_search(SPACE)
    history = []
    for i in range(12):
        (point,) = designers.suggest(params, ["MINIMIZE"], algorithm, history, 1, seed=i)
        _check_in_space(point)
        history.append(designers.Observed(point, [_objective(point)]))
    # Running trials count: a batch of suggestions has no two points alike.
    batch = designers.suggest(params, ["MINIMIZE"], algorithm, history, 4, seed=99)
    assert len(batch) == 4 and len({repr(sorted(p.items())) for p in batch}) == 4


def test_gp_bandit_beats_random_search_on_a_smooth_function():
    spec = {"metrics": [{"metricId": "y", "goal": "MINIMIZE"}],
            "parameters": [{"parameterId": f"x{i}", "doubleValueSpec": {"minValue": -5, "maxValue": 5}}
                           for i in range(4)]}
    _, params, _, _ = parse_search(spec)

    def f(p):  # a shifted sphere: its minimum is not at the centre the GP starts from
        return sum((p[f"x{i}"] - 1.3 + 0.4 * i) ** 2 for i in range(4))

    best = {}
    for algorithm in ("gp_bandit", "random"):
        history = []
        for i in range(25):
            (point,) = designers.suggest(params, ["MINIMIZE"], algorithm, history, 1, seed=i)
            history.append(designers.Observed(point, [f(point)]))
        best[algorithm] = min(h.values[0] for h in history)
    assert best["gp_bandit"] < 0.5 * best["random"], best


def test_gp_bandit_never_suggests_a_near_copy_of_a_trial():
    """A continuous parameter: no suggestion within gp_bandit.MIN_GAP of an earlier one (the GP, converging on a
    smooth optimum, would otherwise re-measure it); a discrete one: no combination suggested twice while others
    are left."""
    from modelyard.tuning.gp_bandit import MIN_GAP

    spec = {"metrics": [{"metricId": "y", "goal": "MINIMIZE"}],
            "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0, "maxValue": 1}}]}
    _, params, _, _ = parse_search(spec)
    history = []
    for i in range(20):
        (point,) = designers.suggest(params, ["MINIMIZE"], "gp_bandit", history, 1, seed=i)
        gaps = [abs(point["x"] - h.params["x"]) for h in history]
        assert not gaps or min(gaps) >= MIN_GAP - 1e-9, (i, point, sorted(h.params["x"] for h in history))
        history.append(designers.Observed(point, [(point["x"] - 0.37) ** 2]))

    spec = {"metrics": [{"metricId": "y", "goal": "MAXIMIZE"}],
            "parameters": [{"parameterId": "n", "integerValueSpec": {"minValue": 1, "maxValue": 4}},
                           {"parameterId": "c", "categoricalValueSpec": {"values": ["a", "b", "c"]}}]}
    _, params, _, _ = parse_search(spec)
    history = []
    for i in range(12):  # exactly the 12 combinations
        (point,) = designers.suggest(params, ["MAXIMIZE"], "gp_bandit", history, 1, seed=i)
        history.append(designers.Observed(point, [point["n"] + (point["c"] == "b")]))
    assert len({(h.params["n"], h.params["c"]) for h in history}) == 12


def test_gp_bandit_starts_at_the_centre_and_treats_infeasible_trials_as_no_result():
    _, params, _, _ = parse_search({"metrics": [{"metricId": "y", "goal": "MAXIMIZE"}],
                                    "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0,
                                                                                            "maxValue": 10}}]})
    (first,) = designers.suggest(params, ["MAXIMIZE"], "gp_bandit", [], 1, seed=0)
    assert first == {"x": 5.0}
    history = [designers.Observed({"x": 5.0}, infeasible=True)] + [
        designers.Observed({"x": float(x)}, [-(x - 7.0) ** 2]) for x in (1, 3, 9, 4.5)]
    for i in range(6):
        (point,) = designers.suggest(params, ["MAXIMIZE"], "gp_bandit", history, 1, seed=i)
        history.append(designers.Observed(point, [-(point["x"] - 7.0) ** 2]))
    assert max(h.values[0] for h in history if h.values) > -0.1


def test_gp_targets_are_not_flattened_by_a_disaster():
    """The output warping (half-rank, then log): one huge loss must not squeeze the good trials'
    differences to nothing, and the order of every trial is kept."""
    import numpy as np
    from optuna.study import StudyDirection

    from modelyard.tuning.gp_bandit import _targets

    losses = np.array([[1.0], [2.0], [3.0], [40.0], [50.0], [1e6]])
    y = _targets(losses, [StudyDirection.MINIMIZE], np.random.default_rng(0))
    assert list(np.argsort(-y)) == [0, 1, 2, 3, 4, 5]
    # A plain log warp and standardisation put 1, 2 and 3 within 1e-5 of the range of each other
    # (measured); warped as Vizier does, they span several percent of it.
    assert y[0] - y[2] > 0.05 * (y.max() - y.min()), y


def test_multi_objective_gp_bandit_runs():
    _, params, _, _ = parse_search({"metrics": [{"metricId": "a", "goal": "MAXIMIZE"}, {"metricId": "b", "goal": "MINIMIZE"}],
                                    "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0, "maxValue": 1}}]})
    history = []
    for i in range(10):
        (point,) = designers.suggest(params, ["MAXIMIZE", "MINIMIZE"], "gp_bandit", history, 1, seed=i)
        history.append(designers.Observed(point, [point["x"], point["x"] ** 2]))
    assert all(0 <= h.params["x"] <= 1 for h in history)


def test_grid_hands_out_every_point_once():
    _, params, algorithm, _ = parse_search({
        "metrics": [{"metricId": "y", "goal": "MAXIMIZE"}], "algorithm": "GRID_SEARCH",
        "parameters": [{"parameterId": "n", "integerValueSpec": {"minValue": 1, "maxValue": 3}},
                       {"parameterId": "opt", "categoricalValueSpec": {"values": ["adam", "sgd"]}}]})
    assert algorithm == "grid"
    history, seen = [], []
    while True:
        points = designers.suggest(params, ["MAXIMIZE"], algorithm, history, 4)
        if not points:
            break
        seen += points
        history += [designers.Observed(p) for p in points]  # handed out, not completed yet: still visited
    assert sorted((p["n"], p["opt"]) for p in seen) == [(n, o) for n in (1, 2, 3) for o in ("adam", "sgd")]


def test_algorithm_names_map_to_the_engine():
    base = {"metrics": [{"metricId": "y", "goal": "MAXIMIZE"}],
            "parameters": [{"parameterId": "n", "integerValueSpec": {"minValue": 1, "maxValue": 3}}]}
    assert parse_search(base)[2] == "gp_bandit"  # Vertex's default: Vizier's GP bandit
    assert parse_search({**base, "algorithm": "RANDOM_SEARCH"})[2] == "random"
    assert parse_search({**base, "algorithm": "tpe"})[2] == "tpe"
    with pytest.raises(SpecError, match="is not one of"):
        parse_search({**base, "algorithm": "CMA_ES"})


def test_median_rule():
    done = [{1: 0.5, 2: 0.6, 3: 0.7}, {1: 0.6, 2: 0.7, 3: 0.8}, {1: 0.4, 2: 0.65, 3: 0.9}]
    # Running averages at step 2: 0.55, 0.65, 0.525 -> median 0.55.
    assert stopping.median_should_stop({1: 0.3, 2: 0.5}, done, maximize=True)
    assert not stopping.median_should_stop({1: 0.3, 2: 0.56}, done, maximize=True)
    assert not stopping.median_should_stop({1: 0.0}, done[:2], maximize=True)  # too few completed trials
    # Minimising: the same curves as losses; a loss above the median stops.
    assert stopping.median_should_stop({1: 0.9, 2: 0.8}, done, maximize=False)


def test_modelyard_tune_prunes_by_the_same_median_rule():
    """``modelyard tune``'s pruner is the Vizier rule: running averages of completed trials, not
    (as Optuna's MedianPruner) their values at the step."""
    from types import SimpleNamespace

    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    from modelyard.tuning.study import _pruner

    pruner = _pruner(SimpleNamespace(stopping={"method": "median", "min_completed_trials": 3, "min_measurements": 1}))
    study = optuna.create_study(direction="maximize", pruner=pruner)
    done = [{1: 0.5, 2: 0.6, 3: 0.7}, {1: 0.6, 2: 0.7, 3: 0.8}, {1: 0.4, 2: 0.65, 3: 0.9}]
    for curve in done:
        study.add_trial(create_trial(params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
                                     value=curve[3], intermediate_values=curve))
    for curve, stop in (({1: 0.3, 2: 0.56}, False), ({1: 0.3, 2: 0.5}, True)):
        trial = study.ask()
        for step, value in curve.items():
            trial.report(value, step)
        # Running averages at step 2: 0.55, 0.65, 0.525 -> median 0.55 (Optuna's MedianPruner: 0.65).
        assert trial.should_prune() is stop is stopping.median_should_stop(curve, done, maximize=True)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)


def test_decay_curve_rule():
    done = [({1: 0.5, 5: 0.8}, 0.8), ({1: 0.4, 5: 0.7}, 0.7), ({1: 0.6, 5: 0.9}, 0.9)]
    # Ratios final/value-at-step-1: 1.6, 1.75, 1.5 -> from 0.3 the best hope is 0.525 < 0.9: stop.
    assert stopping.decay_curve_should_stop({1: 0.3}, done, maximize=True)
    assert not stopping.decay_curve_should_stop({1: 0.55}, done, maximize=True)  # 0.9625 could beat 0.9
