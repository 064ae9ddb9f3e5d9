"""``modelyard.tune(study, objective)``: a study file (or its mapping) and a Python function, run as
function trials in warm workers, from Python instead of ``modelyard tune``.

The objective must be a module-level function (the workers import it by its file and name);
the script calling ``tune`` keeps that call under ``if __name__ == "__main__":``, since the
workers import the script.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from modelyard.tuning.spec import SpecError, Study, from_mapping, with_budget
from modelyard.tuning.worker import WORKER_ENV


@dataclass
class TuneResult:
    """The finished study: the best trial's values and parameters, the counts, all trials."""

    best_values: list[float] | None
    best_params: dict[str, Any] | None
    counts: dict[str, int]
    trials: list[Any]  # optuna FrozenTrial

    @property
    def best_value(self) -> float | None:
        return self.best_values[0] if self.best_values else None


def function_target(objective: Callable[..., Any]) -> str:
    """``FILE.py:NAME`` for a module-level function, which a worker can import."""
    name = getattr(objective, "__qualname__", "")
    module = sys.modules.get(getattr(objective, "__module__", ""), None)
    path = getattr(module, "__file__", None)
    if not name or "<" in name or "." in name or path is None or getattr(module, name, None) is not objective:
        raise SpecError(f"modelyard.tune: the objective must be a function defined at the top level of a .py file "
                        f"(workers import it by file and name), got {objective!r}")
    return f"{Path(path).resolve()}:{name}"


def tune(study: str | Path | dict[str, Any], objective: Callable[..., Any] | str, *, max_trials: int | None = None,
         parallel: int | None = None, devices: str | None = None, storage: str | None = None,
         on_event: Callable[[str, dict[str, Any]], None] | None = None) -> TuneResult:
    """Run (or resume) ``study`` with ``objective(params, report)`` as its trials; see docs/tuning.md."""
    if os.environ.get(WORKER_ENV):
        raise SpecError("modelyard.tune was called inside a trial worker: the workers import your script, so put "
                        "the tune(...) call under `if __name__ == \"__main__\":`")
    target = objective if isinstance(objective, str) else function_target(objective)
    if isinstance(study, dict):
        raw = dict(study)
        path = Path.cwd() / f"{raw.get('display_name', 'study')}.yaml"
    else:
        path = Path(study)
        try:
            raw = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise SpecError(f"study file {path} not found") from None
        if not isinstance(raw, dict):
            raise SpecError(f"study file {path} must be a mapping with study_spec")
    trial = dict(raw.get("trial") or {})
    trial.pop("command", None)
    trial["function"] = target
    raw["trial"] = trial
    spec = with_budget(from_mapping(raw, path, storage), max_trials, parallel)
    return run(spec, devices, on_event)


def run(spec: Study, devices: str | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None) -> TuneResult:
    from modelyard.tuning import devices as devices_mod
    from modelyard.tuning.report import LiveView, best_trials
    from modelyard.tuning.study import Tuner, counts

    slots = devices_mod.parse(devices, spec.parallel)
    tuner = Tuner(spec, slots, on_event or LiveView(spec))
    tuner.run()
    trials = tuner.ostudy.get_trials(deepcopy=False)
    best = best_trials(spec, trials)
    return TuneResult(list(best[0].values) if best else None, dict(best[0].user_attrs.get("params", best[0].params)) if best else None,
                      counts(trials), trials)
