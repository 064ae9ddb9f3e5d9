"""Staleness: where asynchronous parameter-server training is hurt by stale gradients, and how
much of the gap to synchronous training ``scale: inverse`` and ``drop_older_than`` recover.

    python3 bench/staleness.py           # prints the table, writes bench/results/staleness.md

The setup that hurts: many workers for the machine (5 workers, 1 ps, 1 coordinator on 2
cores, so gradients queue up and arrive many updates late) and a high learning rate (SGD
0.05 with momentum 0.9 on the digits MLP). Same model, data, number of updates and batch per
update for every run: synchronous (``backup_workers: 0``, waits for all 5 and averages, so
it sees 5x the examples per update: given the same examples instead, ``global_batch_size``
is 5x smaller for it), plain asynchronous, asynchronous with ``scale: inverse`` (1/tau), and
with ``drop_older_than: 2`` and ``0``. Final validation accuracy, median over rounds taking turns
(harness.take_turns).

    python3 bench/staleness.py --small --rounds 1 --out /tmp/staleness.md   # a check that it runs
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from harness import command_line, env, machine, markdown_table, median, take_turns, write_results

ENV = env(TF_USE_LEGACY_KERAS="1")
WORKERS, EPOCHS, STEPS, LEARNING_RATE = 5, 4, 60, 0.05
MODEL = f'''
from modelyard.training.demo import build_model as _demo


def build_model():
    return _demo(learning_rate={LEARNING_RATE})
'''
RUNS = {
    "synchronous (backup_workers: 0)": {"backup_workers": 0},
    "asynchronous, no control": {"staleness": {}},
    "asynchronous, scale: inverse": {"staleness": {"scale": "inverse"}},
    "asynchronous, drop_older_than: 2": {"staleness": {"drop_older_than": 2}},
    "asynchronous, drop_older_than: 0": {"staleness": {"drop_older_than": 0}},
}


def one_run(work: Path, label: str, options: dict, size: dict) -> dict:
    job = work / f"job-{time.monotonic_ns()}"
    config = work / f"{job.name}.yaml"
    synchronous = "backup_workers" in options
    workers = size["workers"]
    config.write_text(yaml.safe_dump({
        "model": str(work / "model.py"), "data": "digits",
        "strategy": {"name": "parameter_server", **options},
        # Each update sees ~32 examples: one worker's batch when asynchronous; synchronous averages
        # all workers' batches, so its global batch is the multiple of the workers closest below 32.
        "global_batch_size": 32 // workers * workers if synchronous else 32, "epochs": size["epochs"],
        "steps_per_epoch": size["steps"], "validation_steps": 10, "tensorboard": False, "input_report": False,
        "job_dir": str(job), "seed": 0}))
    result = subprocess.run([sys.executable, "-m", "modelyard", "launch", "--workers", str(workers), "--ps", "1", "--",
                             sys.executable, "-m", "modelyard", "train", str(config)],
                            env=ENV, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"{label} failed:\n{result.stdout[-3000:]}{result.stderr[-2000:]}")
    epochs = json.loads((job / "metrics.json").read_text())["epochs"]
    last = epochs[-1]
    return {"val_accuracy": last["val_accuracy"], "val_loss": last["val_loss"],
            "staleness_mean": statistics.mean(e.get("staleness_mean", 0.0) for e in epochs),
            "staleness_max": max(e.get("staleness_max", 0) for e in epochs),
            "dropped": sum(e["dropped"] for e in epochs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--small", action="store_true",
                        help="2 workers, 1 epoch x 10 updates: checks the benchmark runs, not a measurement")
    parser.add_argument("--out", help="results file or folder (default bench/results/staleness.md)")
    args = parser.parse_args()
    size = {"workers": 2, "epochs": 1, "steps": 10} if args.small else \
        {"workers": WORKERS, "epochs": EPOCHS, "steps": STEPS}
    started_on = machine()
    with tempfile.TemporaryDirectory(prefix="modelyard-staleness-") as tmp:
        work = Path(tmp)
        (work / "model.py").write_text(MODEL)
        runs = take_turns(list(RUNS), args.rounds, lambda label, _round: one_run(work, label, RUNS[label], size))
    acc = {label: median(r["val_accuracy"] for r in rs) for label, rs in runs.items()}
    sync, plain = acc["synchronous (backup_workers: 0)"], acc["asynchronous, no control"]
    gap = sync - plain
    rows = []
    for label, rs in runs.items():
        mean_tau = median(r["staleness_mean"] for r in rs)
        max_tau = max(r["staleness_max"] for r in rs)
        dropped = median(r["dropped"] for r in rs)
        recovered = "" if label.startswith(("synchronous", "asynchronous, no")) or gap <= 0 else \
            f"{(acc[label] - plain) / gap:.0%}"
        rows.append((label, f"{acc[label]:.4f}", f"{mean_tau:.2f} / {max_tau}", f"{dropped:.0f}", recovered))
    best = max(((acc[label] - plain) / gap if gap > 0 else 0.0) for label in list(RUNS)[2:])
    lines = [
        "# Staleness control in asynchronous parameter-server training",
        "",
        f"`{command_line()}`, {started_on}. Digits MLP, SGD lr {LEARNING_RATE} momentum 0.9, {size['workers']} workers "
        f"+ 1 ps + the coordinator, {size['epochs']} epochs x {size['steps']} updates of ~32 examples; final "
        f"val_accuracy, median over {args.rounds} rounds taking turns.",
        "",
        markdown_table(["run", "val_accuracy", "staleness mean / max", "gradients dropped",
                        "share of the sync-async gap recovered"], rows),
        "",
        f"Gap synchronous - plain asynchronous: {100 * gap:+.1f} points. Best recovery: {best:.0%} "
        f"(target >= 50%: {'PASS' if gap > 0 and best >= 0.5 else 'FAIL' if gap > 0 else 'no gap to recover'}).",
        "", "Per run: " + json.dumps(runs)]
    write_results("staleness", "\n".join(lines), args.out)


if __name__ == "__main__":
    main()
