"""Tuning benchmark: parallel trials on disjoint cores against the same trials one after another,
and early stopping against none.

    python3 bench/tuning.py [--part parallel|early|peers]   # prints the tables, writes bench/results/tuning*.md

The peers part needs KerasTuner: `pip install keras-tuner` (not a modelyard dependency).

Each trial is a real `modelyard train` of the digits MLP (TensorFlow start-up, EPOCHS epochs,
metrics.json) on one core. The same 8 grid points (same seeds: the trainer's seed 0) run as
one study with parallel_trial_count 1 on core 0 and as one with parallel_trial_count 2 on
cores 0 and 1; each study is a fresh `modelyard tune` process and its wall time is measured
from start to exit. Sequential and parallel runs alternate --repeats times (the machine is
shared); the table gives each side's best run and their ratio (target <= 0.6), the ratio of medians
and the ratio within each turn, with the load average after each run.
The early-stopping part runs one 30-trial study three ways (see early_stopping); the peers part
runs it with modelyard tune, a plain Optuna script and KerasTuner's Hyperband (see peers).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from harness import machine, take_turns, write_results

ROOT = Path(__file__).resolve().parent
EPOCHS = 5
TRIALS = 8
ENV = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")


def write_study(directory: Path, name: str, parallel: int) -> Path:
    job = directory / "job.yaml"
    job.write_text(yaml.safe_dump({
        "model": str(ROOT / "tuning_trial" / "digits_mlp.py"), "data": "digits", "epochs": EPOCHS,
        "global_batch_size": 64, "input_report": False, "tensorboard": False, "seed": 0,
    }))
    study = directory / f"{name}.yaml"
    study.write_text(yaml.safe_dump({
        "display_name": name,
        "study_spec": {
            "metrics": [{"metric_id": "val_accuracy", "goal": "MAXIMIZE"}],
            "parameters": [
                {"parameter_id": "learning_rate", "discrete_value_spec": {"values": [0.001, 0.003, 0.01, 0.03]}},
                {"parameter_id": "width", "discrete_value_spec": {"values": [32, 128]}},
            ],
            "algorithm": "GRID_SEARCH",
        },
        "max_trial_count": TRIALS, "parallel_trial_count": parallel,
        "trial": {"command": [sys.executable, "-m", "modelyard", "train", str(job)]},
    }))
    return study


@dataclass
class TuneRun:
    """One fresh `modelyard tune` run: wall and CPU seconds (the tuner and its reaped trials), the
    best value it printed, completed trials, and when each measurement line appeared
    ((trial number from 1, step) -> seconds since the launch)."""

    wall: float
    cpu: float
    best: float
    done: int
    stamps: dict[tuple[int, int], float]
    launched: float  # unix time of the launch, to line stamps up with the trials' recorded start times


_MEASUREMENT = re.compile(r"^trial (\d+) step (\d+) ")


def run_tune(study: Path, devices: str) -> TuneRun:
    before = os.times()
    start, launched = time.perf_counter(), time.time()
    proc = subprocess.Popen([sys.executable, "-m", "modelyard", "tune", str(study), "--devices", devices],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stamps: dict[tuple[int, int], float] = {}
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:  # the tuner flushes each event line as it happens
        lines.append(line)
        match = _MEASUREMENT.match(line)
        if match:
            stamps[(int(match[1]), int(match[2]))] = time.perf_counter() - start
    stderr = proc.stderr.read() if proc.stderr else ""
    proc.wait()
    wall = time.perf_counter() - start
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    stdout = "".join(lines)
    if proc.returncode != 0:
        raise SystemExit(f"modelyard tune failed:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    best = [line for line in stdout.splitlines() if line.startswith("best:")]
    value = float(best[0].split("=")[1].split()[0]) if best else float("nan")
    done = len(re.findall(r"^trial \d+ COMPLETE", stdout, re.M))
    return TuneRun(wall, cpu, value, done, stamps, launched)


EARLY_TRIALS = 30
EARLY_EPOCHS = 20
# The digits study's metric and space (the early-stopping and peers parts here; bench/vizier.py's
# digits row, which runs FUNCTION_TRIAL's objective in its own process).
DIGITS_SPACE = {
    "metrics": [{"metric_id": "val_accuracy", "goal": "MAXIMIZE"}],
    "parameters": [
        {"parameter_id": "learning_rate", "double_value_spec": {"min_value": 1e-4, "max_value": 0.3},
         "scale_type": "UNIT_LOG_SCALE"},
        {"parameter_id": "width", "integer_value_spec": {"min_value": 8, "max_value": 256},
         "scale_type": "UNIT_LOG_SCALE"},
        {"parameter_id": "dropout", "double_value_spec": {"min_value": 0.0, "max_value": 0.6}},
    ],
}


def write_early_study(directory: Path, name: str, stopping: dict | None, algorithm: str = "RANDOM_SEARCH",
                      trial: dict | None = None) -> Path:
    """The early-stopping study: 30 random points (same seed on every side) of the digits MLP
    (``algorithm`` ALGORITHM_UNSPECIFIED: TPE, for the peers part). ``trial`` overrides the trial
    section: ``{"warm_start": False}`` for cold command trials, or a function trial."""
    job = directory / "job.yaml"
    job.write_text(yaml.safe_dump({
        "model": str(ROOT / "tuning_trial" / "digits_mlp.py"), "data": "digits", "epochs": EARLY_EPOCHS,
        "global_batch_size": 64, "input_report": False, "tensorboard": False, "seed": 0, "verbose": False,
    }))
    spec = {**DIGITS_SPACE, "algorithm": algorithm, "measurement_selection_type": "BEST_MEASUREMENT"}
    spec.update(stopping or {})
    study = directory / f"{name}.yaml"
    study.write_text(yaml.safe_dump({
        "display_name": name, "study_spec": spec, "max_trial_count": EARLY_TRIALS, "parallel_trial_count": 2,
        "seed": 0, "trial": trial if trial and "function" in trial else
        {"command": [sys.executable, "-m", "modelyard", "train", str(job)], **(trial or {})},
    }))
    return study


FUNCTION_TRIAL = {"function": str(ROOT / "tuning_trial" / "digits_function.py") + ":objective",
                  "env": {"DIGITS_EPOCHS": str(EARLY_EPOCHS)}}


def counted_trials(study: Path) -> list:
    """The study's trials from its database, less those re-run after an interruption."""
    sys.path.insert(0, str(ROOT.parent / "src"))
    from modelyard.tuning import spec as spec_mod
    from modelyard.tuning.study import load_study, retried_numbers

    trials = load_study(spec_mod.load(study), create=False).get_trials(deepcopy=False)
    return [t for t in trials if t.number not in retried_numbers(trials)]


def early_stopping(tmp: Path) -> str:
    """Unpruned vs median stopping vs Hyperband: epochs spent and best validation accuracy."""
    rows = []
    sides = (("unpruned", None), ("median", {"median_automated_stopping_spec": {}}),
             ("hyperband", {"hyperband_stopping_spec": {"min_resource": 1, "max_resource": EARLY_EPOCHS,
                                                        "reduction_factor": 3}}))
    for name, stopping in sides:
        directory = tmp / f"early-{name}"
        directory.mkdir()
        study = write_early_study(directory, name, stopping)
        run = run_tune(study, "cpu:0,1")
        wall = run.wall
        counted = counted_trials(study)
        epochs = sum(len(t.intermediate_values) for t in counted)
        best = max(max(t.intermediate_values.values()) for t in counted if t.intermediate_values)
        pruned = sum(t.state.name == "PRUNED" for t in counted)
        # Where a trial's time goes: from its launch to its first measurement (Python, TensorFlow,
        # the data and the first epoch's tracing), and its whole life as a process.
        startup = statistics.median(run.launched + run.stamps[(t.number + 1, min(t.intermediate_values))]
                                    - t.user_attrs["started"] for t in counted if t.intermediate_values)
        process = sum(t.user_attrs.get("seconds", 0.0) for t in counted)
        rows.append((name, wall, epochs, best, pruned, len(counted), startup, process, run.cpu))
        print(f"{name}: {wall:.1f} s, {epochs} epochs, best val_accuracy {best:.4f}, {pruned} pruned", flush=True)
    base_epochs, base_best = rows[0][2], rows[0][3]
    lines = ["| study | trials | pruned | epochs run | share of unpruned epochs | best val_accuracy | "
             "vs unpruned (points) | wall s | CPU s | trial processes s (sum) | trial launch to 1st epoch s "
             "(median) | target (<= 50 % epochs, within 0.5 points) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, wall, epochs, best, pruned, count, startup, process, cpu in rows:
        share, gap = epochs / base_epochs, (best - base_best) * 100
        verdict = "-" if name == "unpruned" else ("PASS" if share <= 0.5 and gap >= -0.5 else "FAIL")
        lines.append(f"| {name} | {count} | {pruned} | {epochs} | {share:.0%} | {best:.4f} | {gap:+.2f} | "
                     f"{wall:.1f} | {cpu:.1f} | {process:.1f} | {startup:.1f} | {verdict} |")
    return "\n".join(lines)


@dataclass
class Side:
    """One study of the peers part: its epochs as (seconds since launch, val_accuracy), in time order."""

    name: str
    points: list[tuple[float, float]]
    wall: float
    cpu: float
    trials: int
    pruned: int
    load: float
    overhead: float | None = None  # per trial (median): its start to its first measurement, less one epoch
    # per trial: (its start in seconds since the launch, the slot it ran on, its measurements' seconds)
    runs: list[tuple[float, str, list[float]]] | None = None

    def reached(self, target: float) -> tuple[float, int] | None:
        """Seconds until the first epoch at or above ``target`` and the epochs run until then."""
        for count, (seconds, value) in enumerate(self.points, 1):
            if value >= target:
                return seconds, count
        return None

    def epoch(self) -> float | None:
        """Median seconds between a trial's consecutive measurements."""
        gaps = [b - a for _, _, times in self.runs or [] for a, b in zip(times, times[1:])]
        return statistics.median(gaps) if gaps else None

    def chain(self, target: float) -> tuple[int, int, float] | None:
        """The critical path to the target: the trial that reached it and those that ran before it on
        its slot (one after another, each waiting for the last): (trials, epochs, first trial's start s)."""
        hit = self.reached(target)
        if hit is None or not self.runs:
            return None
        at = hit[0]
        start, slot, times = next((r for r in self.runs if at in r[2]), (None, None, None))
        if start is None:
            return None
        before = [r for r in self.runs if r[1] == slot and r[0] < start]
        epochs = sum(len(r[2]) for r in before) + times.index(at) + 1
        # Start-up: the first measurement less one trial's overhead and one epoch (a function trial is
        # sent to its worker at once, while the worker may still be importing TensorFlow).
        first = min(r[2][0] for r in self.runs if r[2]) - (self.overhead or 0.0) - (self.epoch() or 0.0)
        return len(before) + 1, epochs, first


def _overhead(starts: list[float], stamps: list[list[float]]) -> float | None:
    """Median over trials of (first measurement - trial start) less one epoch (the median gap
    between a trial's consecutive measurements): what a trial costs before it trains."""
    gaps = [b - a for times in stamps for a, b in zip(times, times[1:])]
    if not gaps:
        return None
    epoch = statistics.median(gaps)
    return statistics.median(times[0] - start - epoch for start, times in zip(starts, stamps) if times)


def modelyard_side(tmp: Path, name: str, stopping: dict | None, algorithm: str, trial: dict | None = None) -> Side:
    directory = tmp / f"peers-{name}"
    directory.mkdir()
    study = write_early_study(directory, name, stopping, algorithm, trial)
    run = run_tune(study, "cpu:0,1")
    points = []
    trials = counted_trials(study)
    starts, stamps, slots = [], [], []
    for t in trials:
        for step, value in t.intermediate_values.items():
            # Every measurement the tuner records is printed as it records it ("trial N step S").
            points.append((run.stamps[(t.number + 1, step)], value))
        if t.intermediate_values:
            starts.append(t.user_attrs["started"] - run.launched)
            stamps.append([run.stamps[(t.number + 1, step)] for step in sorted(t.intermediate_values)])
            slots.append(t.user_attrs.get("device", "?"))
    return Side(name, sorted(points), run.wall, run.cpu, len(trials),
                sum(t.state.name == "PRUNED" for t in trials), os.getloadavg()[0], _overhead(starts, stamps),
                list(zip(starts, slots, stamps)))


def peer_side(tmp: Path, name: str, tool: str) -> Side:
    """bench/tuning_trial/peers.py TOOL in a fresh process, timed from its launch (TF import included)."""
    import json

    before = os.times()
    start = time.perf_counter()
    wall_start = time.time()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tuning_trial" / "peers.py"), tool, "--trials",
                             str(EARLY_TRIALS), "--epochs", str(EARLY_EPOCHS), "--workdir", str(tmp / f"peer-{tool}")],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    after = os.times()
    if proc.returncode != 0:
        raise SystemExit(f"{tool} failed:\n{out[-2000:]}\n{err[-3000:]}")
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    points = [(e["t"] - wall_start, e["val_accuracy"]) for e in events if e["event"] == "epoch"]
    done = events[-1]
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    starts = {e["trial"]: e["t"] - wall_start for e in events if e["event"] == "trial_start"}
    stamps = {n: [e["t"] - wall_start for e in events if e["event"] == "epoch" and e["trial"] == n] for n in starts}
    overhead = _overhead([starts[n] for n in sorted(starts)], [stamps[n] for n in sorted(starts)]) if starts else None
    runs = [(starts[n], "process", stamps[n]) for n in sorted(starts)] if starts else None  # one after another
    return Side(name, points, wall, cpu, done["points"], done.get("pruned", -1), os.getloadavg()[0], overhead, runs)


def peers(tmp: Path, skip: tuple[str, ...] = (), target: float | None = None, partial: Path | None = None) -> str:
    """The unpruned study sets the target (its best - 0.5 points); every side's time to reach it."""
    median = {"median_automated_stopping_spec": {}}
    hyperband = {"hyperband_stopping_spec": {"min_resource": 1, "max_resource": EARLY_EPOCHS, "reduction_factor": 3}}
    tpe = "ALGORITHM_UNSPECIFIED"
    plan = [
        # The reference only sets the target (its best - 0.5 points): its 600 epochs run as function trials.
        ("modelyard tune, random, no stopping (reference; function trials)",
         lambda: modelyard_side(tmp, "unpruned", None, "RANDOM_SEARCH", FUNCTION_TRIAL)),
        (COLD, lambda: modelyard_side(tmp, "median-cold", median, tpe, {"warm_start": False})),
        (WARM, lambda: modelyard_side(tmp, "median", median, tpe)),
        (FUNCTION, lambda: modelyard_side(tmp, "median-function", median, tpe, FUNCTION_TRIAL)),
        ("modelyard tune, TPE + Hyperband, warm command trials",
         lambda: modelyard_side(tmp, "hyperband", hyperband, tpe)),
        (OPTUNA, lambda: peer_side(tmp, "optuna", "optuna")),
        ("KerasTuner Hyperband (in-process)", lambda: peer_side(tmp, "kerastuner", "kerastuner")),
    ]
    if importlib.util.find_spec("keras_tuner") is None:
        # Not a modelyard dependency; installing it may change the shared environment's Keras.
        print("keras_tuner is not installed (pip install keras-tuner): its row is left out", flush=True)
        plan = [step for step in plan if not step[0].startswith("KerasTuner")]
    plan = [step for step in plan if not any(word.lower() in step[0].lower() for word in skip)]
    if target is not None:
        # --target: the reference's best - 0.5 points from an earlier run; the reference is not run.
        # The sides that the targets compare run first (a busy machine may not finish them all).
        plan = [step for step in plan if "(reference" not in step[0]]
        first = (OPTUNA, FUNCTION, WARM, COLD)
        plan.sort(key=lambda step: first.index(step[0]) if step[0] in first else len(first))
    sides = []
    given = target
    for label, run in plan:
        side = run()
        side.name = label
        sides.append(side)
        best = max(v for _, v in side.points)
        print(f"{label}: {side.wall:.1f} s, {len(side.points)} epochs, best {best:.4f}, per-trial overhead "
              f"{side.overhead if side.overhead is None else round(side.overhead, 2)} s", flush=True)
        if partial is not None:  # the table so far, in case the run is cut short
            partial.write_text(_peers_table(sides, given if given is not None else
                                            max(v for _, v in sides[0].points) - 0.005, given is not None) + "\n")
    return _peers_table(sides, given if given is not None else max(v for _, v in sides[0].points) - 0.005,
                        given is not None)


def _peers_table(sides: list[Side], target: float, given: bool) -> str:
    source = "given with --target" if given else "the reference's best"
    lines = [f"target: val_accuracy >= {target:.4f} ({source} {target + 0.005:.4f} - 0.5 points)", "",
             "| study | points tried | pruned | epochs run | best val_accuracy | time to target s | "
             "epochs run by then | wall s (whole study) | CPU s | per-trial overhead s (median) | load avg at end |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for side in sides:
        hit = side.reached(target)
        reach = f"{hit[0]:.1f}" if hit else "not reached"
        overhead = f"{side.overhead:.2f}" if side.overhead is not None else "-"
        lines.append(f"| {side.name} | {side.trials} | {side.pruned if side.pruned >= 0 else '-'} | "
                     f"{len(side.points)} | {max(v for _, v in side.points):.4f} | {reach} | "
                     f"{hit[1] if hit else '-'} | {side.wall:.1f} | {side.cpu:.1f} | {overhead} | {side.load:.1f} |")
    try:
        lines += ["", *targets(sides, target)]
    except KeyError:
        lines += ["", "(targets: not every side has run)"]
    lines += ["", *anatomy(sides, target)]
    return "\n".join(lines)


def anatomy(sides: list[Side], target: float) -> list[str]:
    """Where each side's time to the target goes: start-up until its first trial starts, the trials on
    the critical path (the trial that reached the target and those before it on its slot), their
    epochs, the per-trial overhead and the epoch time; and what the Optuna script's own start-up,
    overhead and epoch time give for each side's critical path (its bound with no coordination cost
    and parallel trials running as fast as one alone), as a share of the Optuna script's time."""
    by = {s.name: s for s in sides}
    optuna = by.get(OPTUNA)
    if optuna is None or optuna.reached(target) is None or optuna.chain(target) is None:
        return ["(time to target, where it goes: the Optuna script did not run or reach the target)"]
    o_start, o_epoch, o_overhead = optuna.chain(target)[2], optuna.epoch(), optuna.overhead or 0.0
    o_time = optuna.reached(target)[0]
    lines = ["Time to target, where it goes (critical path: the trial that first reached the target and the "
             "trials before it on its slot):", "",
             "| study | time to target s | start-up s (launch to the 1st measurement, less one overhead and one epoch) | trials on the path | epochs on the path | "
             "per-trial overhead s | epoch s (median) | the path at the Optuna script's costs s | that / Optuna's time |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for side in sides:
        hit, chain, epoch = side.reached(target), side.chain(target), side.epoch()
        if hit is None or chain is None or epoch is None:
            continue
        trials, epochs, start = chain
        bound = o_start + trials * o_overhead + epochs * o_epoch
        lines.append(f"| {side.name} | {hit[0]:.1f} | {start:.1f} | {trials} | {epochs} | {side.overhead or 0:.2f} | "
                     f"{epoch:.3f} | {bound:.1f} | {bound / o_time:.2f}x |")
    return lines


COLD = "modelyard tune, TPE + median stopping, cold command trials (warm_start: false)"
WARM = "modelyard tune, TPE + median stopping, warm command trials"
FUNCTION = "modelyard tune, TPE + median stopping, function trials"
OPTUNA = "Optuna script, TPE + MedianPruner (in-process)"


def targets(sides: list[Side], target: float) -> list[str]:
    """The issue's targets against the Optuna script (issue 29)."""
    by = {s.name: s for s in sides}
    optuna, function = by[OPTUNA], by[FUNCTION]
    warm = by.get(WARM)
    best = {name: max(v for _, v in s.points) for name, s in by.items()}
    hit = {name: s.reached(target) for name, s in by.items()}
    out = []
    if hit[FUNCTION] and hit[OPTUNA]:
        ratio = hit[FUNCTION][0] / hit[OPTUNA][0]
        out.append(f"- function trials, time to target / Optuna's: **{ratio:.2f}x** (target <= 0.6: "
                   f"{'PASS' if ratio <= 0.6 else 'FAIL'})")
    else:
        out.append(f"- function trials, time to target: not comparable (function reached: {bool(hit[FUNCTION])}, "
                   f"Optuna reached: {bool(hit[OPTUNA])})")
    ratio = function.wall / optuna.wall
    out.append(f"- function trials, whole-study wall / Optuna's: **{ratio:.2f}x** (target <= 0.7: "
               f"{'PASS' if ratio <= 0.7 else 'FAIL'})")
    gap = (best[FUNCTION] - best[OPTUNA]) * 100
    out.append(f"- function trials, best val_accuracy vs Optuna's: {gap:+.2f} points (target within 0.5: "
               f"{'PASS' if gap >= -0.5 else 'FAIL'})")
    if warm is None:
        return out
    ratio = warm.wall / optuna.wall
    cold = f"; cold command trials: {by[COLD].wall / optuna.wall:.2f}x" if COLD in by else ""
    out.append(f"- warm command trials, whole-study wall / Optuna's: **{ratio:.2f}x** (target <= 1.5: "
               f"{'PASS' if ratio <= 1.5 else 'FAIL'}){cold}")
    return out


def parallelism(tmp: Path, repeats: int) -> str:
    """Sequential vs 2 parallel trials on disjoint cores: the table."""
    settings = {"sequential": (1, "cpu:0"), "parallel": (2, "cpu:0,1")}

    def one_run(side: str, r: int) -> dict:
        parallel, devices = settings[side]
        directory = tmp / f"{side}-{r}"
        directory.mkdir()
        run = run_tune(write_study(directory, side, parallel), devices)
        if run.done != TRIALS:
            raise SystemExit(f"{side}: {run.done} of {TRIALS} trials completed")
        # load: the 1-minute load average after the run
        return {"wall": run.wall, "cpu": run.cpu, "best": run.best, "load": os.getloadavg()[0]}

    def show(side: str, r: int, run: dict) -> None:
        print(f"run {r + 1} {side}: {run['wall']:.1f} s wall, {run['cpu']:.1f} s CPU, "
              f"best val_accuracy {run['best']:.4f}", flush=True)

    runs = take_turns(list(settings), repeats, one_run, show)
    walls, cpus, bests, loads = ({side: [run[key] for run in rs] for side, rs in runs.items()}
                                 for key in ("wall", "cpu", "best", "load"))
    # Best run per side (as bench/training.py does): other work on this shared machine only ever
    # adds time, so the fastest run is the closest to what the code itself costs.
    seq, par = min(walls["sequential"]), min(walls["parallel"])
    ratio = par / seq
    median_ratio = statistics.median(walls["parallel"]) / statistics.median(walls["sequential"])
    # Each parallel run against the sequential run of the same turn: the two sides of one turn
    # saw about the same load from other work, which the best and the median runs do not pair up.
    paired = [p / s for s, p in zip(walls["sequential"], walls["parallel"])]

    def row(side: str, parallel: int, devices: str) -> str:
        # CPU share: CPU seconds used / (wall x cores given). Near 1.0 the trials had their cores to
        # themselves; well below, other work on the machine took them.
        shares = ", ".join(f"{c / (w * parallel):.2f}" for c, w in zip(cpus[side], walls[side]))
        return (f"| {side} | {TRIALS} | {parallel} | {devices} | {min(walls[side]):.1f} | "
                f"{', '.join(f'{w:.1f}' for w in walls[side])} | {', '.join(f'{c:.1f}' for c in cpus[side])} | "
                f"{shares} | {', '.join(f'{x:.1f}' for x in loads[side])} | {statistics.median(bests[side]):.4f} |")

    return "\n".join([
        "| study | trials | parallel | devices | wall s (best run) | all runs wall s | CPU s | CPU share of the cores | "
        "load avg after each run | best val_accuracy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        row("sequential", 1, "cpu:0"),
        row("parallel", 2, "cpu:0,1"),
        "",
        f"parallel / sequential wall time (best runs): **{ratio:.2f}x** (target <= 0.60: "
        f"{'PASS' if ratio <= 0.6 else 'FAIL'}); ratio of medians {median_ratio:.2f}x; per turn "
        f"{', '.join(f'{r:.2f}' for r in paired)}x (median {statistics.median(paired):.2f}x)",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="parallelism: alternating runs per side")
    parser.add_argument("--part", choices=("all", "parallel", "early", "peers"), default="all")
    parser.add_argument("--out-dir", default=str(ROOT / "results"))
    parser.add_argument("--target", type=float, metavar="VAL_ACCURACY",
                        help="peers: the target accuracy (an earlier reference's best - 0.005); skips the reference")
    parser.add_argument("--skip", nargs="*", default=[], metavar="WORD",
                        help="peers: leave out the rows whose name has one of these words (e.g. Hyperband)")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("this benchmark needs 2 cores")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)  # the partial peers table is written there as sides finish
    stamp = machine()
    with tempfile.TemporaryDirectory() as tmp:
        if args.part in ("all", "parallel"):
            table = parallelism(Path(tmp), args.repeats)
            table += f"; 1-minute load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
            write_results("tuning",
                f"# Tuning benchmark: parallel trials\n\n`python3 bench/tuning.py --part parallel` ({stamp})\n\n"
                f"Each trial: `modelyard train` of the digits MLP, {EPOCHS} epochs, on one core (affinity + "
                f"TF_NUM_INTRAOP_THREADS=1). The same 8 grid points on both sides; each side a fresh "
                f"`modelyard tune`, wall time from start to exit; runs alternate (the machine is shared with "
                f"other work, so single runs swing).\n\n{table}\n", out)
        if args.part in ("all", "early"):
            table = early_stopping(Path(tmp))
            table += f"\n\n1-minute load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
            write_results("tuning_early_stopping",
                f"# Tuning benchmark: early stopping\n\n`python3 bench/tuning.py --part early` ({stamp})\n\n"
                f"The same {EARLY_TRIALS} random points (seed 0) of the digits MLP (learning rate, width, dropout; "
                f"{EARLY_EPOCHS} epochs each, `modelyard train`), 2 trials at a time, without early stopping, with "
                f"median stopping and with Hyperband. Epochs run = measurements received (a pruned trial's "
                f"epochs up to its stop). Best = best validation accuracy of any epoch of any trial "
                f"(BEST_MEASUREMENT).\n\n{table}\n", out)
        if args.part in ("all", "peers"):
            table = peers(Path(tmp), tuple(args.skip), args.target, out / "tuning_peers.partial.md")
            write_results("tuning_peers",
                f"# Tuning benchmark: modelyard tune against KerasTuner and Optuna\n\n"
                f"`python3 bench/tuning.py --part peers` ({stamp}; `pip install keras-tuner`)\n\n"
                f"The study of the early-stopping part (digits MLP, learning rate 1e-4..0.3 log, width 8..256 log, "
                f"dropout 0..0.6; {EARLY_EPOCHS} epochs at most; {EARLY_TRIALS} points) run several ways, one after "
                f"another. modelyard: `modelyard tune`, 2 trials at a time, one core each; its trials as cold "
                f"command trials (`warm_start: false`: a fresh `modelyard train` process each), warm command "
                f"trials (`modelyard train` forked from a server that imported TensorFlow) or function trials "
                f"(bench/tuning_trial/digits_function.py in warm workers). Optuna: a plain script, one process, trials one after another in it "
                f"(TPE seed 0, MedianPruner defaults). Per-trial overhead: a trial's start to its first measurement, less one epoch (the median gap between a trial's measurements); median over the trials. KerasTuner (when installed): Hyperband (max_epochs {EARLY_EPOCHS}, factor 3, "
                f"hyperband_iterations set so it starts about {EARLY_TRIALS} points), one process. The peers train "
                f"the same network on the same tf.data input as `modelyard train` (bench/tuning_trial/peers.py). "
                f"Time to target: seconds from the study's launch (Python and TensorFlow start-up included) to the "
                f"first epoch of any trial at or above the target.\n\n{table}\n", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
