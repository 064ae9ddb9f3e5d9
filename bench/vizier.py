"""Vizier benchmark: the default designer (ALGORITHM_UNSPECIFIED, the GP bandit of
modelyard.tuning.gp_bandit) against Optuna's TPE (and random search) on black-box functions, and
the platform's suggestTrials latency at 100 completed trials.

    python3 bench/vizier.py [--trials 30] [--seeds 5] [--no-digits] [--no-latency] [--out FILE]

Quality: BBOB-style functions (sphere, ellipsoid, Rosenbrock, Rastrigin, step-ellipsoid-like
Schwefel 1.2) in 2 to 8 dimensions on [-5, 5]^d, each with its optimum moved to a point drawn per
(function, seed), f* = 0; plus a digits study (scikit-learn's SVC on the 8x8 digits, C and gamma on
log scales, 3-fold error on 900 of the digits: a cheap stand-in for bench/tuning.py's digits MLP, whose trials train a
Keras model for seconds each). Each (function, seed) runs --trials sequential suggestions through
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


def _digits():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import cross_val_score
    from sklearn.svm import SVC

    x, y = load_digits(return_X_y=True)
    x, y = x[:900] / 16.0, y[:900]  # half the set: a trial in ~0.3 s
    spec = {"metrics": [{"metricId": "error", "goal": "MINIMIZE"}],
            "parameters": [{"parameterId": "C", "doubleValueSpec": {"minValue": 1e-3, "maxValue": 1e3},
                            "scaleType": "UNIT_LOG_SCALE"},
                           {"parameterId": "gamma", "doubleValueSpec": {"minValue": 1e-4, "maxValue": 10},
                            "scaleType": "UNIT_LOG_SCALE"}]}

    def error(p):
        return 1.0 - float(cross_val_score(SVC(C=p["C"], gamma=p["gamma"]), x, y, cv=3).mean())

    return spec, error


def run_study(spec: dict, objective, algorithm: str, trials: int, seed: int) -> tuple[float, float]:
    """The best value after ``trials`` suggestions, and the median seconds a suggestion took."""
    metrics, params, _, _ = parse_search(spec)
    history: list[designers.Observed] = []
    took = []
    for i in range(trials):
        start = time.perf_counter()
        (point,) = designers.suggest(params, [m.goal for m in metrics], algorithm, history, 1,
                                     seed=seed * 10_007 + i)
        took.append(time.perf_counter() - start)
        history.append(designers.Observed(point, [objective(point)]))
    return min(h.values[0] for h in history), statistics.median(took)


def quality(trials: int, seeds: int, digits: bool) -> tuple[str, list[str]]:
    problems = [(f"{name} {dim}-D", name, fn, dim) for name, fn, dim in FUNCTIONS]
    if digits:
        problems.append(("digits SVC (3-fold error)", "digits", None, 2))
    rows, notes = [], []
    wins_total = 0
    for label, name, fn, dim in problems:
        best: dict[str, list[float]] = {a: [] for a in ALGORITHMS}
        secs: dict[str, list[float]] = {a: [] for a in ALGORITHMS}
        for seed in range(seeds):
            spec, objective = _digits() if name == "digits" else _bbob(name, fn, dim, seed)

            def one(algorithm: str, _round: int) -> dict:
                value, took = run_study(spec, objective, algorithm, trials, seed)
                return {"best": value, "suggest_s": took}

            results = take_turns(ALGORITHMS, 1, one, report=lambda *a: None)
            for a in ALGORITHMS:
                best[a].append(results[a][0]["best"])
                secs[a].append(results[a][0]["suggest_s"])
        wins = sum(g <= t for g, t in zip(best["gp_bandit"], best["tpe"]))
        wins_total += statistics.median(best["gp_bandit"]) <= statistics.median(best["tpe"])
        rows.append([label] + [f"{statistics.median(best[a]):.4g}" for a in ALGORITHMS]
                    + [f"{wins}/{seeds}"] + [f"{1000 * statistics.median(secs[a]):.0f}" for a in ("gp_bandit", "tpe")])
        log(f"{label}: " + ", ".join(f"{a} {statistics.median(best[a]):.4g}" for a in ALGORITHMS))
    notes.append(f"GP bandit's median best at least as good as TPE's on {wins_total} of {len(problems)} problems.")
    table = markdown_table(["problem", "GP bandit (default)", "Optuna TPE", "random", "GP <= TPE (seeds)",
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
    parser.add_argument("--no-digits", action="store_true")
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--out", default=None, help="results file (default bench/results/vizier.md)")
    args = parser.parse_args()
    parts = ["# Vizier: the default designer against Optuna TPE, and suggestTrials latency", "", machine(), ""]
    table, notes = quality(args.trials, args.seeds, not args.no_digits)
    parts += [f"## Best value after {args.trials} trials (median of {args.seeds} seeds; lower is better, f* = 0)",
              "", table, "", *notes, ""]
    if not args.no_latency:
        table, _ = latency(args.latency_rounds)
        parts += ["## suggestTrials through the platform's REST API (GP bandit, sent and polled until done)", "",
                  table, ""]
    write_results("vizier", "\n".join(parts), args.out)


if __name__ == "__main__":
    main()
