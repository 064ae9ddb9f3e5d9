"""Backup workers against plain synchronous parameter-server training, with a straggler.

    python3 bench/backup_workers.py      # prints the table, writes bench/results/backup_workers.md

Three workers, one parameter server, the digits MLP, `modelyard launch --workers 3 --ps 1`.
Worker 2 is made a straggler from outside: paused (SIGSTOP) for two step-times out of every
three, so each of its gradients takes about 3x a healthy worker's (a sleep of 2x the step
time). `backup_workers: 0` waits for all three gradients every step; `backup_workers: 1`
applies the first two fresh ones and drops the late one. Steps/s is the median over epochs
2..N (epoch 1 includes start-up); the two runs take turns over the rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent
ENV = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
           PYTHONPATH=str(ROOT.parent / "src"))
EPOCHS, STEPS = 5, 60


def _straggle(pid: int, step_seconds: float, stop: threading.Event) -> None:
    """Pause the worker for 2 step-times, let it run for 1, until told to stop."""
    while not stop.is_set():
        try:
            os.killpg(pid, signal.SIGSTOP)
            time.sleep(2 * step_seconds)
            os.killpg(pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        time.sleep(step_seconds)
    try:
        os.killpg(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def one_run(backup: int, step_seconds: float, work: Path) -> dict:
    job = work / f"job-b{backup}-{time.monotonic_ns()}"
    config = work / f"b{backup}.yaml"
    config.write_text(yaml.safe_dump({
        "model": "demo", "strategy": {"name": "parameter_server", "backup_workers": backup},
        "global_batch_size": 96, "epochs": EPOCHS, "steps_per_epoch": STEPS, "validation_steps": 10,
        "tensorboard": False, "input_report": False, "job_dir": str(job)}))
    proc = subprocess.Popen([sys.executable, "-m", "modelyard", "launch", "--workers", "3", "--ps", "1", "--",
                             sys.executable, "-m", "modelyard", "train", str(config)],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    stop = threading.Event()
    output = []
    for line in proc.stdout:
        output.append(line)
        found = re.match(r"worker:2 \| \[modelyard\] started pid (\d+)", line)
        if found and step_seconds > 0:
            threading.Thread(target=_straggle, args=(int(found.group(1)), step_seconds, stop), daemon=True).start()
    stop.set()
    if proc.wait() != 0:
        raise RuntimeError("".join(output[-40:]))
    epochs = json.loads((job / "metrics.json").read_text())["epochs"]
    return {"steps_per_sec": statistics.median(e["steps_per_sec"] for e in epochs[1:]),
            "val_accuracy": epochs[-1]["val_accuracy"], "dropped": sum(e["dropped"] for e in epochs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "results"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="modelyard-backup-") as tmp:
        work = Path(tmp)
        healthy = one_run(1, 0.0, work)  # no straggler: the healthy step time sets the pause length
        step_seconds = 1.0 / healthy["steps_per_sec"]
        print(f"healthy step time {step_seconds * 1000:.0f} ms", file=sys.stderr, flush=True)
        runs: dict[int, list[dict]] = {0: [], 1: []}
        for round_index in range(args.rounds):
            for backup in (0, 1):
                runs[backup].append(one_run(backup, step_seconds, work))
                print(f"round {round_index + 1}: backup_workers {backup}: {runs[backup][-1]}", file=sys.stderr,
                      flush=True)
    sync, backup = ([statistics.median(r[k] for r in runs[b]) for k in ("steps_per_sec", "val_accuracy")] for b in (0, 1))
    ratio = backup[0] / sync[0]
    gap = 100 * (backup[1] - sync[1])
    lines = [
        "# Backup workers with a straggler (parameter server, 3 workers, 1 ps)",
        "",
        f"`python3 bench/backup_workers.py --rounds {args.rounds}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"2 cores. Digits MLP, global batch 96, {EPOCHS} epochs x {STEPS} steps. Worker 2 paused 2 step-times out "
        f"of every 3 (healthy step {step_seconds * 1000:.0f} ms, measured first without the straggler: "
        f"{healthy['steps_per_sec']:.1f} steps/s). Medians over {args.rounds} rounds, the runs taking turns.",
        "",
        "| run | steps/s | final val_accuracy | gradients dropped as stale |",
        "| --- | ---: | ---: | ---: |",
        f"| `backup_workers: 0` (waits for all 3) | {sync[0]:.1f} | {sync[1]:.4f} | "
        f"{statistics.median(r['dropped'] for r in runs[0]):.0f} |",
        f"| `backup_workers: 1` (first 2 of 3) | {backup[0]:.1f} | {backup[1]:.4f} | "
        f"{statistics.median(r['dropped'] for r in runs[1]):.0f} |",
        "",
        f"Steps/s with a backup worker: **{ratio:.2f}x** (target >= 1.5x: {'PASS' if ratio >= 1.5 else 'FAIL'}); "
        f"accuracy difference {gap:+.1f} points (target within 0.5: {'PASS' if abs(gap) <= 0.5 else 'FAIL'}).",
        "",
        "Per run: " + json.dumps(runs),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "backup_workers.md").write_text(text)


if __name__ == "__main__":
    main()
