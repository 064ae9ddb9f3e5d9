"""What a person sees: the live view while a study runs and the table ``tune status`` prints.

Both draw from the study's trials in the database, so the live table, ``status`` and the
end-of-run table are the same table.
"""
from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from optuna.trial import FrozenTrial, TrialState

from modelyard.tuning.spec import Study
from modelyard.tuning.study import retried_numbers

_MAX_STEPS_SHOWN = 6


def _num(value: float) -> str:
    return f"{value:.4g}"


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={_num(v) if isinstance(v, float) else v}" for k, v in params.items())


def _curve(values: dict[int, float]) -> str:
    steps = sorted(values)
    shown = steps[-_MAX_STEPS_SHOWN:]
    text = " ".join(_num(values[s]) for s in shown)
    return (f"…{len(steps) - len(shown)} " if len(steps) > len(shown) else "") + text


def curve(trial: FrozenTrial) -> dict[int, float]:
    """The first metric per step (kept in a user attribute for multi-objective studies)."""
    if trial.intermediate_values:
        return dict(trial.intermediate_values)
    return {int(step): value for step, value in trial.user_attrs.get("curve", {}).items()}


def rows(study: Study, trials: list[FrozenTrial]) -> list[dict[str, str]]:
    """One row per trial: what the table shows, as text."""
    retried = retried_numbers(trials)
    out = []
    for t in sorted(trials, key=lambda t: t.number):
        state = t.state.name
        if t.user_attrs.get("excess"):
            state = "NOT RUN"  # another host had taken the last trial of the budget
        elif t.number in retried:
            state = "INTERRUPTED"
        elif t.state == TrialState.FAIL:
            state = "FAILED"
        values = ", ".join(_num(v) for v in t.values) if t.values and t.state == TrialState.COMPLETE else ""
        seconds = t.user_attrs.get("seconds")
        out.append({
            "trial": str(t.number + 1), "state": state, "params": _params(t.user_attrs.get("params", {})),
            study.metrics[0].id + " per step": _curve(curve(t)), "value": values,
            "device": t.user_attrs.get("device", ""), "s": f"{seconds:.1f}" if seconds is not None else "",
        })
    return out


def table(study: Study, trials: list[FrozenTrial]) -> str:
    """The trials as an aligned text table, the best trial and the failures' errors under it."""
    data = rows(study, trials)
    if not data:
        return "no trials yet"
    headers = list(data[0])
    widths = {h: max(len(h), *(len(r[h]) for r in data)) for h in headers}
    lines = ["  ".join(h.ljust(widths[h]) for h in headers)]
    lines += ["  ".join(r[h].ljust(widths[h]) for h in headers).rstrip() for r in data]
    best = best_trials(study, trials)
    if best:
        metric_names = ", ".join(m.id for m in study.metrics)
        for t in best:
            lines.append(f"best: trial {t.number + 1}  {metric_names} = {', '.join(_num(v) for v in t.values)}  "
                         f"{_params(t.user_attrs.get('params', {}))}")
    for t in trials:
        if t.state == TrialState.FAIL and "error" in t.user_attrs:
            lines.append(f"trial {t.number + 1} failed: {t.user_attrs['error']}")
    return "\n".join(lines)


def best_trials(study: Study, trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The best trial (one metric) or the Pareto front (several), among completed trials."""
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.values]
    if not done:
        return []
    signs = [1 if m.goal == "MAXIMIZE" else -1 for m in study.metrics]
    if len(signs) == 1:
        return [max(done, key=lambda t: signs[0] * t.values[0])]

    def dominates(a: FrozenTrial, b: FrozenTrial) -> bool:
        better = [s * x >= s * y for s, x, y in zip(signs, a.values, b.values)]
        return all(better) and a.values != b.values

    return [t for t in done if not any(dominates(o, t) for o in done)]


class LiveView:
    """Prints each event as one line; on a terminal, also redraws the table at most once a second."""

    def __init__(self, study: Study, stream: TextIO | None = None, get_trials=None):
        self.study, self.stream, self.get_trials = study, stream or sys.stdout, get_trials
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._drawn = 0.0

    def __call__(self, event: str, info: dict[str, Any]) -> None:
        number = info.get("number")
        head = f"trial {number + 1}" if number is not None else "study"
        if event == "started":
            text = f"{head} started  {_params(info['params'])}  [{info['device']}]  {info['job_dir']}"
        elif event == "measurement":
            text = f"{head} step {info['step']}  {self.study.metrics[0].tag} {_num(info['value'])}"
        elif event == "complete":
            text = f"{head} COMPLETE  {', '.join(_num(v) for v in info['values'])}"
        elif event == "failed":
            text = f"{head} FAILED  {info['error']}"
            if info.get("log_tail"):
                text += "\n    " + info["log_tail"].replace("\n", "\n    ")
        elif event == "pruned" and info.get("note"):
            text = f"{head} PRUNED  ({info['note']})"
        elif event == "resumed":
            text = f"study resumed: interrupted trial(s) {', '.join(str(n + 1) for n in info['rerun'])} will re-run"
        else:
            text = f"{head} {event.upper()}" + (f" at step {info['step']}" if "step" in info else "")
        if self.tty and self.get_trials and time.time() - self._drawn > 1.0:
            self._drawn = time.time()
            print("\x1b[2J\x1b[H" + table(self.study, self.get_trials()), file=self.stream)
        print(text, file=self.stream, flush=True)
