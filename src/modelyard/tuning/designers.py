"""The one tuning engine: a study's algorithm, search space and history in, the next points out.

``modelyard tune`` (and so every HyperparameterTuningJob, which runs it) asks ``sampler`` for the
Optuna sampler of its algorithm; the platform's Vizier studies keep their trials in the platform's
store and ask ``suggest`` for new points, which replays that history into an in-memory Optuna
study and asks the same sampler. So each algorithm exists once:

| name (StudySpec.algorithm) | what proposes the points |
| --- | --- |
| ``gp_bandit`` (``ALGORITHM_UNSPECIFIED``, Vizier's default) | ``gp_bandit.GPBanditSampler`` |
| ``random`` (``RANDOM_SEARCH``) | Optuna's RandomSampler |
| ``grid`` (``GRID_SEARCH``) | every grid point once, in a fixed order (``space.grid``) |
| ``tpe`` | Optuna's TPESampler (multivariate, constant liar), ``modelyard tune``'s former default |
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from modelyard.tuning import space
from modelyard.tuning.gp_bandit import GPBanditSampler
from modelyard.tuning.spec import ALGORITHMS, Param


warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.WARNING)  # an in-memory study per suggestion says nothing useful


def sampler(algorithm: str, seed: int | None) -> optuna.samplers.BaseSampler:
    """The Optuna sampler of an engine algorithm name (grid: points are enqueued by the caller,
    so the sampler only fills what a point leaves open)."""
    if algorithm == "gp_bandit":
        return GPBanditSampler(seed=seed)
    if algorithm == "tpe":
        # constant_liar: running trials count as bad guesses, so parallel trials spread out.
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True, multivariate=True)
    if algorithm in ("random", "grid"):
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown algorithm {algorithm!r}; one of {', '.join(sorted(set(ALGORITHMS.values())))}")


@dataclass
class Observed:
    """A trial the engine learns from: its parameters (user values); ``values`` (one per metric)
    when it completed, None while it runs (or when it is infeasible: ``infeasible``)."""

    params: dict[str, Any]
    values: list[float] | None = None
    infeasible: bool = False


def _distribution(param: Param) -> BaseDistribution:
    """The distribution ``space.suggest`` draws ``param`` from (so replayed trials match asked ones)."""
    log = param.scale != "UNIT_LINEAR_SCALE"
    if param.kind == "DOUBLE":
        return FloatDistribution(param.min, param.max, log=log)
    if param.kind == "INTEGER":
        return IntDistribution(int(param.min), int(param.max), log=log)
    return CategoricalDistribution(param.values)


def _internal(params: list[Param], values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, BaseDistribution]]:
    """A trial's user values -> Optuna's stored values and distributions, active parameters only."""
    out, dists = {}, {}
    pending = list(params)
    while pending:
        param = pending.pop(0)
        if param.id not in values:
            continue
        value = values[param.id]
        dist = _distribution(param)
        internal = space.to_internal(param, value)
        if isinstance(dist, CategoricalDistribution):
            if internal not in dist.choices:
                continue
        elif not dist.low <= internal <= dist.high:
            continue
        out[param.id], dists[param.id] = internal, dist
        pending += [child for vals, child in param.children if value in vals]
    return out, dists


def _key(point: dict[str, Any]) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in point.items()))


def suggest(params: list[Param], directions: Sequence[str], algorithm: str, history: list[Observed],
            count: int, seed: int | None = None) -> list[dict[str, Any]]:
    """``count`` new points (user values), given every trial so far. GRID_SEARCH returns fewer
    (none) once every grid point has been handed out."""
    if algorithm == "grid":
        seen = set()
        for obs in history:
            seen.add(_key(_internal(params, obs.params)[0]))
        out = []
        for point in space.grid(params):
            if _key(point) not in seen:
                out.append(_to_user(params, point))
                if len(out) == count:
                    break
        return out
    study = optuna.create_study(directions=[d.lower() for d in directions], sampler=sampler(algorithm, seed))
    for obs in history:
        internal, dists = _internal(params, obs.params)
        if obs.values is not None and not obs.infeasible:
            frozen = create_trial(params=internal, distributions=dists, values=list(obs.values))
        else:
            frozen = create_trial(params=internal, distributions=dists,
                                  state=TrialState.FAIL if obs.infeasible else TrialState.RUNNING)
        study.add_trial(frozen)
    out = []
    for _ in range(count):
        trial = study.ask()
        out.append(space.suggest(trial, params))  # asked trials stay RUNNING: the next asks see them
    return out


def _to_user(params: list[Param], internal: dict[str, Any]) -> dict[str, Any]:
    """Internal (stored) values -> the values a trial gets (reverse-log mirrored back)."""
    out = {}
    pending = list(params)
    while pending:
        param = pending.pop(0)
        if param.id in internal:
            value = internal[param.id]
            out[param.id] = space.to_internal(param, value)  # the mirror is its own inverse
            pending += [child for vals, child in param.children if out[param.id] in vals]
    return out
