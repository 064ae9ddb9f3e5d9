"""Hyperparameter tuning: ``modelyard tune study.yaml`` runs trials (any training command) as
processes on disjoint devices, reads their per-epoch metrics, stops the hopeless ones early, and
keeps the study in a database so it resumes after a crash.

Function trials (``trial: {function: FILE:NAME}``, or ``modelyard.tune(study, objective)``) run
the objective ``NAME(params, report)`` in warm worker processes instead (tuning.workers).

This package's top level stays light: a training script calls ``trial_params()`` and an
objective catches ``TrialPruned`` without pulling in Optuna.

May import: ``modelyard.model`` (export of the best trial), ``modelyard.errors``, ``modelyard.forked`` (the
handle of a forked trial); training only as processes (a trial is a command), never its modules.
"""
from __future__ import annotations

import json
import os
from typing import Any


class TrialPruned(Exception):
    """Raised by a function trial's ``report(step, value)`` when the study's stopping rule stops
    the trial. Let it propagate: a trial that keeps running after it is stopped by replacing its
    worker process."""


def trial_params(default: dict[str, Any] | None = None) -> dict[str, Any]:
    """The running trial's hyperparameters (``MODELYARD_TRIAL_PARAMS``), over ``default``.

    For training code that takes no flags, e.g. a ``build_model()`` run by ``modelyard train``
    (the study's ``trial.params_as: env``). Outside a study, ``default`` comes back unchanged.
    """
    params = dict(default or {})
    raw = os.environ.get("MODELYARD_TRIAL_PARAMS")
    if raw:
        params.update(json.loads(raw))
    return params
