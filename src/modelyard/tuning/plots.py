"""Study plots: optimization history, parallel coordinates and parameter importances, each as
PNG (matplotlib) and HTML (plotly), drawn by Optuna's visualization module from the database.

Interrupted trials (re-run under another number) are left out, so each point is one real trial.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

from modelyard.tuning.spec import Study
from modelyard.tuning.study import retried_numbers


class PlotError(RuntimeError):
    """Plots cannot be drawn (a library is missing, or too few trials)."""


def _counted_copy(study: Study, ostudy: optuna.Study) -> optuna.Study:
    """An in-memory copy of the study with only the trials that count, as user values."""
    trials = ostudy.get_trials(deepcopy=False)
    skip = retried_numbers(trials)
    copy = optuna.create_study(directions=[m.direction for m in study.metrics])
    for t in trials:
        if t.number in skip or t.state != TrialState.COMPLETE:
            continue
        copy.add_trial(t)
    return copy


def write_plots(study: Study, ostudy: optuna.Study, out: Path) -> list[Path]:
    """Write the plots under ``out``; returns the files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import plotly  # noqa: F401
    except ImportError as exc:
        raise PlotError(f"plots need matplotlib and plotly ({exc.name} is missing): pip install matplotlib plotly") from None
    from optuna import visualization as vis
    from optuna.visualization import matplotlib as vis_mpl

    counted = _counted_copy(study, ostudy)
    if len(counted.trials) < 2:
        raise PlotError(f"plots need at least 2 completed trials; {len(counted.trials)} completed")
    target = (lambda t: t.values[0]) if len(study.metrics) > 1 else None
    name = study.metrics[0].id
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        for stem, draw_html, draw_png in (
            ("optimization_history", vis.plot_optimization_history, vis_mpl.plot_optimization_history),
            ("parallel_coordinate", vis.plot_parallel_coordinate, vis_mpl.plot_parallel_coordinate),
            ("param_importances", vis.plot_param_importances, vis_mpl.plot_param_importances),
        ):
            if stem == "param_importances" and len(counted.trials[0].params) < 2 and len(study.params) < 2:
                continue  # one parameter has all the importance: nothing to show
            kwargs = {"target": target, "target_name": name} if target else {"target_name": name}
            fig = draw_html(counted, **kwargs)
            html = out / f"{stem}.html"
            fig.write_html(str(html), include_plotlyjs="directory")
            ax = draw_png(counted, **kwargs)
            png = out / f"{stem}.png"
            (ax.figure if hasattr(ax, "figure") else ax.flat[0].figure).savefig(png, dpi=100, bbox_inches="tight")
            plt.close("all")
            written += [png, html]
    return written
