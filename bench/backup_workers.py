"""Backup workers against plain synchronous parameter-server training, with a straggler.

    python3 bench/backup_workers.py      # prints the table, writes bench/results/backup_workers.md
    python3 bench/backup_workers.py --small --rounds 1 --out /tmp/backup_workers.md   # a check that it runs

Three workers, one parameter server, the digits MLP, `modelyard launch --workers 3 --ps 1`.
Worker 2 is made a straggler from outside: paused (SIGSTOP) for two step-times out of every
three, so each of its gradients takes about 3x a healthy worker's (a sleep of 2x the step
time). `backup_workers: 0` waits for all three gradients every step; `backup_workers: 1`
applies the first two fresh ones and drops the late one. Steps/s is the median over epochs
2..N (epoch 1 includes start-up); the two runs take turns over the rounds (harness.take_turns).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from harness import Service, command_line, env, log, machine, markdown_table, median, take_turns, write_results

ENV = env(TF_USE_LEGACY_KERAS="1")
EPOCHS, STEPS = 5, 60
WORKER_2 = re.compile(r"worker:2 \| \[modelyard\] started pid (\d+)")


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


def one_run(backup: int, step_seconds: float, work: Path, epochs: int, steps: int) -> dict:
    job = work / f"job-b{backup}-{time.monotonic_ns()}"
    config = work / f"b{backup}.yaml"
    config.write_text(yaml.safe_dump({
        "model": "demo", "strategy": {"name": "parameter_server", "backup_workers": backup},
        "global_batch_size": 96, "epochs": epochs, "steps_per_epoch": steps, "validation_steps": 10,
        "tensorboard": False, "input_report": False, "job_dir": str(job)}))
    # Ready once the launcher says worker 2 started: its pid is what the straggler pauses.
    launch = Service(f"launch backup_workers {backup}",
                     [sys.executable, "-m", "modelyard", "launch", "--workers", "3", "--ps", "1", "--",
                      sys.executable, "-m", "modelyard", "train", str(config)],
                     job.with_suffix(".log"), env=ENV, timeout=600,
                     ready=lambda: WORKER_2.search(launch.log_text()) is not None)
    stop = threading.Event()
    with launch:
        if step_seconds > 0:
            pid = int(WORKER_2.search(launch.log_text()).group(1))
            threading.Thread(target=_straggle, args=(pid, step_seconds, stop), daemon=True).start()
        try:
            code = launch.proc.wait(timeout=1800)
        finally:
            stop.set()
        if code != 0:
            raise RuntimeError(launch.log_text()[-4000:])
    epochs_seen = json.loads((job / "metrics.json").read_text())["epochs"]
    return {"steps_per_sec": median(e["steps_per_sec"] for e in epochs_seen[1:] or epochs_seen),
            "val_accuracy": epochs_seen[-1]["val_accuracy"], "dropped": sum(e["dropped"] for e in epochs_seen)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--small", action="store_true",
                        help="2 epochs x 10 steps: checks the benchmark runs, not a measurement")
    parser.add_argument("--out", help="results file or folder (default bench/results/backup_workers.md)")
    args = parser.parse_args()
    epochs, steps = (2, 10) if args.small else (EPOCHS, STEPS)
    started_on = machine()
    with tempfile.TemporaryDirectory(prefix="modelyard-backup-") as tmp:
        work = Path(tmp)
        healthy = one_run(1, 0.0, work, epochs, steps)  # no straggler: the healthy step time sets the pause length
        step_seconds = 1.0 / healthy["steps_per_sec"]
        log(f"healthy step time {step_seconds * 1000:.0f} ms")
        turns = take_turns(["0", "1"], args.rounds,
                           lambda backup, _round: one_run(int(backup), step_seconds, work, epochs, steps))
    runs = {int(b): rs for b, rs in turns.items()}
    sync, backup = ([median(r[k] for r in runs[b]) for k in ("steps_per_sec", "val_accuracy")] for b in (0, 1))
    ratio = backup[0] / sync[0]
    gap = 100 * (backup[1] - sync[1])
    lines = [
        "# Backup workers with a straggler (parameter server, 3 workers, 1 ps)",
        "",
        f"`{command_line()}`, {started_on}. Digits MLP, global batch 96, {epochs} epochs x {steps} steps. Worker 2 "
        f"paused 2 step-times out of every 3 (healthy step {step_seconds * 1000:.0f} ms, measured first without the "
        f"straggler: {healthy['steps_per_sec']:.1f} steps/s). Medians over {args.rounds} rounds, the runs taking turns.",
        "",
        markdown_table(["run", "steps/s", "final val_accuracy", "gradients dropped as stale"], [
            ("`backup_workers: 0` (waits for all 3)", f"{sync[0]:.1f}", f"{sync[1]:.4f}",
             f"{median(r['dropped'] for r in runs[0]):.0f}"),
            ("`backup_workers: 1` (first 2 of 3)", f"{backup[0]:.1f}", f"{backup[1]:.4f}",
             f"{median(r['dropped'] for r in runs[1]):.0f}")]),
        "",
        f"Steps/s with a backup worker: **{ratio:.2f}x** (target >= 1.5x: {'PASS' if ratio >= 1.5 else 'FAIL'}); "
        f"accuracy difference {gap:+.1f} points (target within 0.5: {'PASS' if abs(gap) <= 0.5 else 'FAIL'}).",
        "",
        "Per run: " + json.dumps(runs),
    ]
    write_results("backup_workers", "\n".join(lines), args.out)


if __name__ == "__main__":
    main()
