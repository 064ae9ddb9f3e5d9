"""Staleness: where asynchronous parameter-server training is hurt by stale gradients, and how
much of the gap to synchronous training ``scale: inverse`` and ``drop_older_than`` recover.

    python3 bench/staleness.py           # prints the table, writes bench/results/staleness.md

The setup that hurts: many workers for the machine (5 workers, 1 ps, 1 coordinator on 2
cores, so gradients queue up and arrive many updates late) and a high learning rate (SGD
0.05 with momentum 0.9 on the digits MLP). Same model, data, number of updates and batch per
update for every run: synchronous (``backup_workers: 0``, waits for all 5 and averages, so
it sees 5x the examples per update: given the same examples instead, ``global_batch_size``
is 5x smaller for it), plain asynchronous, asynchronous with ``scale: inverse`` (1/tau), and
with ``drop_older_than: 2`` and ``0``. Final validation accuracy, median over rounds taking turns.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent
ENV = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
           PYTHONPATH=str(ROOT.parent / "src"))
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


def one_run(work: Path, label: str, options: dict) -> dict:
    job = work / f"job-{time.monotonic_ns()}"
    config = work / "job.yaml"
    synchronous = "backup_workers" in options
    config.write_text(yaml.safe_dump({
        "model": str(work / "model.py"), "data": "digits",
        "strategy": {"name": "parameter_server", **options},
        # Each update sees 32 examples: one worker's batch when asynchronous, 5 x 32/5... as close as divides.
        "global_batch_size": 30 if synchronous else 32, "epochs": EPOCHS, "steps_per_epoch": STEPS,
        "validation_steps": 10, "tensorboard": False, "input_report": False, "job_dir": str(job), "seed": 0}))
    result = subprocess.run([sys.executable, "-m", "modelyard", "launch", "--workers", str(WORKERS), "--ps", "1", "--",
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
    parser.add_argument("--out", default=str(ROOT / "results"))
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {label: [] for label in RUNS}
    with tempfile.TemporaryDirectory(prefix="modelyard-staleness-") as tmp:
        work = Path(tmp)
        (work / "model.py").write_text(MODEL)
        for round_index in range(args.rounds):
            for label, options in RUNS.items():
                runs[label].append(one_run(work, label, options))
                print(f"round {round_index + 1}: {label}: {runs[label][-1]}", file=sys.stderr, flush=True)
    acc = {label: statistics.median(r["val_accuracy"] for r in rs) for label, rs in runs.items()}
    sync, plain = acc["synchronous (backup_workers: 0)"], acc["asynchronous, no control"]
    gap = sync - plain
    lines = [
        "# Staleness control in asynchronous parameter-server training",
        "",
        f"`python3 bench/staleness.py --rounds {args.rounds}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"2 cores. Digits MLP, SGD lr {LEARNING_RATE} momentum 0.9, {WORKERS} workers + 1 ps + the coordinator, "
        f"{EPOCHS} epochs x {STEPS} updates of ~32 examples; final val_accuracy, median over {args.rounds} rounds "
        "taking turns.",
        "",
        "| run | val_accuracy | staleness mean / max | gradients dropped | share of the sync-async gap recovered |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for label, rs in runs.items():
        mean_tau = statistics.median(r["staleness_mean"] for r in rs)
        max_tau = max(r["staleness_max"] for r in rs)
        dropped = statistics.median(r["dropped"] for r in rs)
        recovered = "" if label.startswith(("synchronous", "asynchronous, no")) or gap <= 0 else \
            f"{(acc[label] - plain) / gap:.0%}"
        lines.append(f"| {label} | {acc[label]:.4f} | {mean_tau:.2f} / {max_tau} | {dropped:.0f} | {recovered} |")
    best = max(((acc[label] - plain) / gap if gap > 0 else 0.0) for label in list(RUNS)[2:])
    lines += ["", f"Gap synchronous - plain asynchronous: {100 * gap:+.1f} points. Best recovery: {best:.0%} "
              f"(target >= 50%: {'PASS' if gap > 0 and best >= 0.5 else 'FAIL' if gap > 0 else 'no gap to recover'}).",
              "", "Per run: " + json.dumps(runs)]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "staleness.md").write_text(text)


if __name__ == "__main__":
    main()
