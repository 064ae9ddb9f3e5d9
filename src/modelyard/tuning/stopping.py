"""Early-stopping rules on learning curves (a curve: step -> objective value), for Vizier studies'
``checkTrialEarlyStoppingState`` and, through ``MedianPruner`` (this rule as an Optuna pruner), for
``modelyard tune`` and HyperparameterTuningJobs while their trials run: one median rule for both.

- Median (Vertex's ``medianAutomatedStoppingSpec``): stop a trial whose best value so far is
  strictly worse than the median, over the completed trials, of their running averages up to the
  trial's last step.
- Decay curve (``decayCurveStoppingSpec``): predict the trial's final value from how the completed
  trials' curves went on from the same step (the ratio of their final value to their value there),
  and stop it when even the most hopeful of those predictions does not beat the best final value.
"""
from __future__ import annotations

import math
import statistics

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

MIN_COMPLETED = 3  # completed trials with a measurement at or before the step, before any rule stops one


def _better(a: float, b: float, maximize: bool) -> bool:
    return a > b if maximize else a < b


def median_should_stop(curve: dict[int, float], completed: list[dict[int, float]], maximize: bool,
                       min_completed: int = MIN_COMPLETED, min_measurements: int = 1) -> bool:
    """Vertex's median rule; judged once ``min_completed`` completed trials have a measurement at or
    before the trial's last step and the trial has ``min_measurements`` measurements."""
    curve = {s: v for s, v in curve.items() if math.isfinite(v)}
    if not curve or len(curve) < min_measurements:
        return False
    step = max(curve)
    averages = []
    for other in completed:
        upto = [v for s, v in other.items() if s <= step]
        if upto:
            averages.append(sum(upto) / len(upto))
    if not averages or len(averages) < min_completed:
        return False
    best = max(curve.values()) if maximize else min(curve.values())
    return _better(statistics.median(averages), best, maximize)


class MedianPruner(optuna.pruners.BasePruner):
    """``median_should_stop`` as an Optuna pruner: a running trial's reported steps are its curve,
    the study's completed trials' reported steps the curves it is judged against."""

    def __init__(self, min_completed: int = MIN_COMPLETED, min_measurements: int = 1) -> None:
        self.min_completed, self.min_measurements = min_completed, min_measurements

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        completed = [t.intermediate_values for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
        return median_should_stop(dict(trial.intermediate_values), completed,
                                  study.direction == StudyDirection.MAXIMIZE, self.min_completed,
                                  self.min_measurements)


def decay_curve_should_stop(curve: dict[int, float], completed: list[tuple[dict[int, float], float]],
                            maximize: bool) -> bool:
    """``completed``: (curve, final value) of each completed trial."""
    if not curve:
        return False
    step = max(curve)
    now = curve[step]
    ratios, finals = [], []
    for other, final in completed:
        before = [s for s in other if s <= step]
        finals.append(final)
        if before and other[max(before)] != 0:
            ratios.append(final / other[max(before)])
    if len(ratios) < MIN_COMPLETED:
        return False
    predictions = [now * r for r in ratios]
    hopeful = max(predictions) if maximize else min(predictions)
    best = max(finals) if maximize else min(finals)
    return not _better(hopeful, best, maximize) and hopeful != best
