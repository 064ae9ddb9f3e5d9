"""Tuning benchmark: parallel trials on disjoint cores against the same trials one after another.

    python3 bench/tuning.py              # prints the table, writes bench/results/tuning.md

Each trial is a real `modelyard train` of the digits MLP (TensorFlow start-up, EPOCHS epochs,
metrics.json) on one core. The same 8 grid points (same seeds: the trainer's seed 0) run as
one study with parallel_trial_count 1 on core 0 and as one with parallel_trial_count 2 on
cores 0 and 1; each study is a fresh `modelyard tune` process and its wall time is measured
from start to exit. Sequential and parallel runs alternate REPEATS times (the machine is
shared); the table gives each side's median and the ratio of medians (target <= 0.6).
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

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


def run_study(study: Path, devices: str) -> tuple[float, float, int]:
    """Wall seconds, best val_accuracy and completed trials of one fresh `modelyard tune` run."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "modelyard", "tune", str(study), "--devices", devices],
                          env=ENV, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"modelyard tune failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    best = [line for line in proc.stdout.splitlines() if line.startswith("best:")]
    value = float(best[0].split("=")[1].split()[0]) if best else float("nan")
    done = len(re.findall(r"^trial \d+ COMPLETE", proc.stdout, re.M))
    return wall, value, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "results" / "tuning.md"))
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("this benchmark needs 2 cores")
    walls: dict[str, list[float]] = {"sequential": [], "parallel": []}
    bests: dict[str, list[float]] = {"sequential": [], "parallel": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for side, parallel, devices in (("sequential", 1, "cpu:0"), ("parallel", 2, "cpu:0,1")):
                directory = Path(tmp) / f"{side}-{r}"
                directory.mkdir()
                wall, best, done = run_study(write_study(directory, side, parallel), devices)
                if done != TRIALS:
                    raise SystemExit(f"{side}: {done} of {TRIALS} trials completed")
                walls[side].append(wall)
                bests[side].append(best)
                print(f"run {r + 1} {side}: {wall:.1f} s, best val_accuracy {best:.4f}", flush=True)
    seq, par = statistics.median(walls["sequential"]), statistics.median(walls["parallel"])
    ratio = par / seq
    load = os.getloadavg()[0]
    table = "\n".join([
        "| study | trials | parallel | devices | wall s (median) | runs | best val_accuracy |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| sequential | {TRIALS} | 1 | cpu:0 | {seq:.1f} | {', '.join(f'{w:.1f}' for w in walls['sequential'])} | "
        f"{statistics.median(bests['sequential']):.4f} |",
        f"| parallel | {TRIALS} | 2 | cpu:0,1 | {par:.1f} | {', '.join(f'{w:.1f}' for w in walls['parallel'])} | "
        f"{statistics.median(bests['parallel']):.4f} |",
        "",
        f"parallel / sequential wall time: **{ratio:.2f}x** (target <= 0.60: {'PASS' if ratio <= 0.6 else 'FAIL'}); "
        f"1-minute load average at the end: {load:.1f} on {os.cpu_count()} cores",
    ])
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# Tuning benchmark\n\n`python3 bench/tuning.py` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
                   f"Each trial: `modelyard train` of the digits MLP, {EPOCHS} epochs, one core "
                   f"(affinity + TF_NUM_INTRAOP_THREADS=1). Same 8 grid points on both sides.\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
