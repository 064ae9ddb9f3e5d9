"""``modelyard launch`` of a 2-worker ``multi_worker_mirrored`` job: tasks forked from the launch's
warm interpreter (the default) against ``--cold`` (a fresh Python per task), taking turns (issue 29).

    python3 bench/warm_launch.py              # 2 rounds
    python3 bench/warm_launch.py --rounds 3 --workers 2

Each run is ``modelyard launch --workers N [--cold] -- python3 -m modelyard train CONFIG`` of the demo
model (two steps, one epoch). Reported per side: the wall time of the launch, and the CPU seconds of
the launcher and every process it started (its fork server and the tasks the server forked are
waited for in turn, so ``RUSAGE_CHILDREN`` counts them as it counts cold tasks). Writes
bench/results/warm_launch.md.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from harness import (children_cpu_seconds, command_line, env, log, machine, markdown_table, median, take_turns,
                     write_results)

ENV = env(TF_USE_LEGACY_KERAS="1")


def run_launch(tmp: Path, side: str, round_no: int, workers: int) -> dict:
    cfg = tmp / f"{side}-{round_no}.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": "demo", "strategy": "multi_worker_mirrored", "global_batch_size": 8 * workers, "epochs": 1,
        "steps_per_epoch": 2, "seed": 7, "tensorboard": False, "input_report": False,
        "job_dir": str(tmp / f"job-{side}-{round_no}")}))
    cmd = [sys.executable, "-m", "modelyard", "launch", "--workers", str(workers),
           *(["--cold"] if side == "cold" else []), "--", sys.executable, "-m", "modelyard", "train", str(cfg)]
    cpu, start = children_cpu_seconds(), time.monotonic()
    proc = subprocess.run(cmd, env=ENV, cwd=tmp, capture_output=True, text=True, timeout=900)
    wall, cpu = time.monotonic() - start, children_cpu_seconds() - cpu
    if proc.returncode != 0:
        raise SystemExit(f"{side} launch failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    warm = proc.stdout.count("[modelyard] warm start:")
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "warm_tasks": warm}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", help="results file or folder (default bench/results/warm_launch.md)")
    args = parser.parse_args()
    header = machine()
    with tempfile.TemporaryDirectory(prefix="warm-launch-") as d:
        results = take_turns(["warm", "cold"], args.rounds, lambda side, r: run_launch(Path(d), side, r, args.workers))
    rows = []
    for side, runs in results.items():
        rows.append([side, len(runs), round(median(r["wall_s"] for r in runs), 1),
                     round(median(r["cpu_s"] for r in runs), 1),
                     " ".join(f"{r['wall_s']}/{r['cpu_s']}" for r in runs), runs[0]["warm_tasks"]])
    text = "\n\n".join([
        "# modelyard launch: warm tasks against cold", header, f"`{command_line()}`",
        f"{args.workers} workers, `modelyard train` of the demo model (multi_worker_mirrored, one epoch of two steps). "
        "CPU: the launcher and every process it started.",
        markdown_table(["side", "runs", "wall s (median)", "CPU s (median)", "each run wall/CPU",
                        "tasks announcing a warm start"], rows),
        "The load figure is the machine's at the start; other work shares the 2 cores, so compare sides "
        "within a file, not across files."])
    write_results("warm_launch", text, args.out)
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
