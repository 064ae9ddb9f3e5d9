"""The search space on Optuna: a trial's values, drawn define-by-run, and the grid's points.

Optuna stores what it samples ("internal" values); for UNIT_REVERSE_LOG_SCALE that is a
log-uniform draw ``t`` mirrored into the range (``min + max - t``), which puts more points
near the top of the range, as Vertex's reverse-log scale does. Trials receive the mirrored
(user) value.
"""
from __future__ import annotations

import itertools
from typing import Any

import optuna

from modelyard.tuning.spec import Param, grid_values


def _mirror(param: Param, value: float) -> float:
    return param.min + param.max - value


def _draw(trial: optuna.Trial, param: Param) -> Any:
    log = param.scale != "UNIT_LINEAR_SCALE"
    if param.kind == "DOUBLE":
        value = trial.suggest_float(param.id, param.min, param.max, log=log)
    elif param.kind == "INTEGER":
        value = trial.suggest_int(param.id, int(param.min), int(param.max), log=log)
    else:
        return trial.suggest_categorical(param.id, param.values)
    if param.scale == "UNIT_REVERSE_LOG_SCALE":
        value = _mirror(param, value)
        value = int(round(value)) if param.kind == "INTEGER" else min(max(value, param.min), param.max)
    return value


def suggest(trial: optuna.Trial, params: list[Param]) -> dict[str, Any]:
    """The trial's parameter values: each top-level one, plus the children its value activates."""
    out: dict[str, Any] = {}
    pending = list(params)
    while pending:
        param = pending.pop(0)
        value = _draw(trial, param)
        out[param.id] = value
        pending += [child for values, child in param.children if value in values]
    return out


def to_internal(param: Param, value: Any) -> Any:
    """The value Optuna stores for a user value (the inverse of the reverse-log mirror)."""
    if param.scale == "UNIT_REVERSE_LOG_SCALE":
        mirrored = _mirror(param, value)
        return int(round(mirrored)) if param.kind == "INTEGER" else mirrored
    return value


def _points(param: Param) -> list[dict[str, Any]]:
    points = []
    for value in grid_values(param):
        active = [child for values, child in param.children if value in values]
        for rest in grid(active):
            points.append({param.id: to_internal(param, value), **rest})
    return points


def grid(params: list[Param]) -> list[dict[str, Any]]:
    """Every point of the grid, as internal values, in a fixed order (first parameter slowest)."""
    combos: list[dict[str, Any]] = [{}]
    for param in params:
        combos = [{**a, **b} for a, b in itertools.product(combos, _points(param))]
    return combos


def format_value(value: Any) -> str:
    """How a value is passed as a flag: floats in Python's shortest exact form (0.003, 1e-05)."""
    return repr(float(value)) if isinstance(value, float) else str(value)
