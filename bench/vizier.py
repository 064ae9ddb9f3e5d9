"""Vizier benchmark: the default designer (ALGORITHM_UNSPECIFIED, the GP bandit of
modelyard.tuning.gp_bandit) against Optuna's TPE (and random search) on black-box functions, and
the platform's suggestTrials latency at 100 completed trials.

    python3 bench/vizier.py [--trials 30] [--seeds 5] [--digits-epochs 20] [--no-latency] [--out FILE]

Quality: BBOB-style functions (sphere, ellipsoid, Rosenbrock, Rastrigin, step-ellipsoid-like
Schwefel 1.2) in 2 to 8 dimensions on [-5, 5]^d, each with its optimum moved to a point drawn per
(function, seed), f* = 0; plus bench/tuning.py's digits study (the digits MLP: learning rate, width
and dropout, val_accuracy maximised; its trial function bench/tuning_trial/digits_function.py, run
in this process, --digits-epochs epochs a trial, GP bandit and TPE only: a trial trains for seconds).
Each (function, seed) runs --trials sequential suggestions through
``modelyard.tuning.designers.suggest`` (the code Vizier studies, `modelyard tune` and tuning jobs
use), one algorithm after the other in turns. The table gives each algorithm's median (over seeds)
of the best value found, and on how many seeds the GP bandit did at least as well as TPE.

Latency: a real `modelyard platform`; one study of 8 DOUBLE parameters gets 100 completed trials
(createTrial with finalMeasurement), then --latency-rounds times: suggestTrials (count 1) is sent and
its operation polled every 5 ms until done, and the trial completed. The table gives p50/p90/max.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import requests
from harness import log, machine, markdown_table, modelyard_platform, percentile, take_turns, write_results
from tuning import EARLY_EPOCHS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from modelyard.tuning import designers  # noqa: E402
from modelyard.tuning.spec import parse_search  # noqa: E402

ALGORITHMS = ("gp_bandit", "tpe", "random")


def _sphere(z):
    return float(np.sum(z ** 2))


def _ellipsoid(z):
    d = len(z)
    return float(np.sum(10 ** (6 * np.arange(d) / max(d - 1, 1)) * z ** 2)) / 1e3


def _rosenbrock(z):
    x = z + 1.0  # optimum of the classic form at 1: moved to 0 like the others
    return float(np.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2))


def _rastrigin(z):
    return float(10 * len(z) + np.sum(z ** 2 - 10 * np.cos(2 * math.pi * z)))


def _schwefel12(z):
    return float(np.sum(np.cumsum(z) ** 2))


FUNCTIONS = [("sphere", _sphere, 2), ("rosenbrock", _rosenbrock, 2), ("rastrigin", _rastrigin, 4),
             ("ellipsoid", _ellipsoid, 4), ("schwefel1.2", _schwefel12, 6), ("sphere", _sphere, 8),
             ("rosenbrock", _rosenbrock, 8)]


def _bbob(name: str, fn, dim: int, seed: int):
    shift = np.random.default_rng(1000 * seed + dim + len(name)).uniform(-4, 4, dim)
    spec = {"metrics": [{"metricId": "f", "goal": "MINIMIZE"}],
            "parameters": [{"parameterId": f"x{i}", "doubleValueSpec": {"minValue": -5, "maxValue": 5}}
                           for i in range(dim)]}
    return spec, lambda p: fn(np.array([p[f"x{i}"] for i in range(dim)]) - shift)


def _digits(epochs: int):
    """bench/tuning.py's digits study: its space and metric (tuning.DIGITS_SPACE), its trial
    (bench/tuning_trial/digits_function.py: the digits MLP, Keras seed 0, best epoch's val_accuracy)
    run here in this process."""
    import os

    from tuning import DIGITS_SPACE

    os.environ["DIGITS_EPOCHS"] = str(epochs)
    sys.path.insert(0, str(Path(__file__).resolve().parent / "tuning_trial"))
    import digits_function  # noqa: E402  (TensorFlow and the datasets, once)

    return DIGITS_SPACE, lambda p: digits_function.objective(p, lambda step, value: None)


def run_study(spec: dict, objective, algorithm: str, trials: int, seed: int) -> tuple[float, float]:
    """The best value after ``trials`` suggestions (by the study's goal), and the median seconds a
    suggestion took."""
    metrics, params, _, _ = parse_search(spec)
    history: list[designers.Observed] = []
    took = []
    for i in range(trials):
        start = time.perf_counter()
        (point,) = designers.suggest(params, [m.goal for m in metrics], algorithm, history, 1,
                                     seed=seed * 10_007 + i)
        took.append(time.perf_counter() - start)
        history.append(designers.Observed(point, [objective(point)]))
    values = [h.values[0] for h in history]
    return (max(values) if metrics[0].goal == "MAXIMIZE" else min(values)), statistics.median(took)


def quality(trials: int, seeds: int, digits_epochs: int) -> tuple[str, list[str]]:
    """``digits_epochs`` 0: no digits row."""
    problems = [(f"{name} {dim}-D", name, fn, dim, ALGORITHMS) for name, fn, dim in FUNCTIONS]
    if digits_epochs:
        # Random search left out: each trial trains a network for seconds.
        problems.append((f"digits MLP, bench/tuning.py's study ({digits_epochs} epochs; val_accuracy, higher is "
                         "better)", "digits", None, 3, ("gp_bandit", "tpe")))
    rows, notes = [], []
    wins_total = 0
    for label, name, fn, dim, algorithms in problems:
        best: dict[str, list[float]] = {a: [] for a in algorithms}
        secs: dict[str, list[float]] = {a: [] for a in algorithms}
        for seed in range(seeds):
            spec, objective = _digits(digits_epochs) if name == "digits" else _bbob(name, fn, dim, seed)

            def one(algorithm: str, _round: int) -> dict:
                value, took = run_study(spec, objective, algorithm, trials, seed)
                return {"best": value, "suggest_s": took}

            results = take_turns(algorithms, 1, one, report=lambda *a: None)
            for a in algorithms:
                best[a].append(results[a][0]["best"])
                secs[a].append(results[a][0]["suggest_s"])
            log(f"{label} seed {seed}: " + ", ".join(f"{a} {best[a][-1]:.4g}" for a in algorithms))
        sign = -1.0 if name == "digits" else 1.0  # lower is better after the sign
        wins = sum(sign * g <= sign * t for g, t in zip(best["gp_bandit"], best["tpe"]))
        wins_total += sign * statistics.median(best["gp_bandit"]) <= sign * statistics.median(best["tpe"])
        rows.append([label] + [f"{statistics.median(best[a]):.4g}" if a in best else "not run" for a in ALGORITHMS]
                    + [f"{wins}/{seeds}"] + [f"{1000 * statistics.median(secs[a]):.0f}" for a in ("gp_bandit", "tpe")])
        log(f"{label}: " + ", ".join(f"{a} {statistics.median(best[a]):.4g}" for a in algorithms))
    notes.append(f"GP bandit's median best at least as good as TPE's on {wins_total} of {len(problems)} problems.")
    table = markdown_table(["problem", "GP bandit (default)", "Optuna TPE", "random", "GP at least as good as TPE (seeds)",
                            "GP suggest ms", "TPE suggest ms"], rows)
    return table, notes


def latency(calls: int, completed: int = 100) -> tuple[str, list[str]]:
    with tempfile.TemporaryDirectory(prefix="bench-vizier-") as tmp, modelyard_platform(Path(tmp)) as platform:
        api = f"{platform.base}/v1/projects/bench/locations/us-central1"
        dim = 8
        spec = {"metrics": [{"metricId": "f", "goal": "MINIMIZE"}],
                "parameters": [{"parameterId": f"x{i}", "doubleValueSpec": {"minValue": -5, "maxValue": 5}}
                               for i in range(dim)]}
        study = requests.post(f"{api}/studies", json={"displayName": "latency", "studySpec": spec}, timeout=30).json()
        name = study["name"]
        rng = np.random.default_rng(0)
        for _ in range(completed):
            x = rng.uniform(-5, 5, dim)
            r = requests.post(f"{platform.base}/v1/{name}/trials", timeout=30, json={
                "parameters": [{"parameterId": f"x{i}", "value": float(v)} for i, v in enumerate(x)],
                "finalMeasurement": {"metrics": [{"metricId": "f", "value": float(np.sum((x - 1) ** 2))}]}})
            r.raise_for_status()
        took = []
        session = requests.Session()
        for i in range(calls):
            start = time.perf_counter()
            op = session.post(f"{platform.base}/v1/{name}/trials:suggest", timeout=60,
                              json={"suggestionCount": 1, "clientId": f"worker-{i}"}).json()
            while not op.get("done"):
                time.sleep(0.005)
                op = session.get(f"{platform.base}/v1/{op['name']}", timeout=60).json()
            took.append(time.perf_counter() - start)
            trial = op["response"]["trials"][0]
            x = np.array([p["value"] for p in trial["parameters"]])
            session.post(f"{platform.base}/v1/{trial['name']}:complete", timeout=30, json={
                "finalMeasurement": {"metrics": [{"metricId": "f", "value": float(np.sum((x - 1) ** 2))}]}})
        ms = [1000 * t for t in took]
        table = markdown_table(["completed trials", "dims", "suggestTrials calls", "p50 ms", "p90 ms", "max ms"],
                               [[f"{completed}-{completed + calls - 1}", dim, calls, f"{percentile(ms, 50):.0f}",
                                 f"{percentile(ms, 90):.0f}", f"{max(ms):.0f}"]])
        return table, []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--latency-rounds", type=int, default=20)
    parser.add_argument("--digits-epochs", type=int, default=EARLY_EPOCHS,
                        help="epochs per digits trial (bench/tuning.py's study has 20); 0: no digits row")
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--out", default=None, help="results file (default bench/results/vizier.md)")
    args = parser.parse_args()
    parts = ["# Vizier: the default designer against Optuna TPE, and suggestTrials latency", "", machine(), "",
             "`python3 bench/vizier.py " + " ".join(sys.argv[1:]) + "`", ""]
    table, notes = quality(args.trials, args.seeds, args.digits_epochs)
    parts += [f"## Best value after {args.trials} trials (median of {args.seeds} seeds; BBOB: lower is better, f* = 0)",
              "", table, "", *notes, ""]
    if not args.no_latency:
        table, _ = latency(args.latency_rounds)
        parts += ["## suggestTrials through the platform's REST API (GP bandit, sent and polled until done)", "",
                  table, ""]
    write_results("vizier", "\n".join(parts), args.out)


if __name__ == "__main__":
    main()
