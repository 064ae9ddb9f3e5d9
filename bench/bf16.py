"""bf16 gradients: final accuracy against float32 on two workers (multi_worker_mirrored).

    python3 bench/bf16.py                # prints the table, writes bench/results/bf16.md
    python3 bench/bf16.py --small --rounds 1 --out /tmp/bf16.md   # a check that it runs (1 epoch)

The digits MLP, `modelyard launch --workers 2`, global batch 64, the same seed and data
order for both; the runs take turns over the rounds (harness.take_turns). The bytes and the
samples/s under a 100 Mbit/s link are in bench/results/scaling.md (bench/scaling.py).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from harness import command_line, env, machine, markdown_table, median, take_turns, write_results

ENV = env(TF_USE_LEGACY_KERAS="1")
EPOCHS = 6
DTYPES = ("float32", "bfloat16")


def one_run(work: Path, dtype: str, epochs: int) -> dict:
    job = work / f"job-{dtype}-{time.monotonic_ns()}"
    config = work / f"{dtype}.yaml"
    config.write_text(yaml.safe_dump({
        "model": "demo", "data": "digits", "strategy": "multi_worker_mirrored", "gradient_dtype": dtype,
        "global_batch_size": 64, "epochs": epochs, "seed": 0, "tensorboard": False, "input_report": False,
        "job_dir": str(job)}))
    result = subprocess.run([sys.executable, "-m", "modelyard", "launch", "--workers", "2", "--",
                             sys.executable, "-m", "modelyard", "train", str(config)],
                            env=ENV, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(result.stdout[-3000:] + result.stderr[-2000:])
    metrics = json.loads((job / "metrics.json").read_text())
    return {"val_accuracy": metrics["epochs"][-1]["val_accuracy"], "loss": metrics["epochs"][-1]["loss"],
            "allreduce_bytes_per_step": metrics["allreduce_bytes_per_step"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="1 epoch: checks the benchmark runs, not a measurement")
    parser.add_argument("--out", help="results file or folder (default bench/results/bf16.md)")
    args = parser.parse_args()
    epochs = 1 if args.small else EPOCHS
    started_on = machine()
    with tempfile.TemporaryDirectory(prefix="modelyard-bf16-") as tmp:
        runs = take_turns(DTYPES, args.rounds, lambda dtype, _round: one_run(Path(tmp), dtype, epochs))
    acc = {d: median(r["val_accuracy"] for r in rs) for d, rs in runs.items()}
    size = {d: rs[0]["allreduce_bytes_per_step"] for d, rs in runs.items()}
    diff = 100 * (acc["bfloat16"] - acc["float32"])
    ratio = size["bfloat16"] / size["float32"]
    lines = [
        "# bf16 gradients on two workers: accuracy and bytes",
        "",
        f"`{command_line()}`, {started_on}. Digits MLP, multi_worker_mirrored over 2 workers, global batch 64, "
        f"{epochs} epochs, seed 0; final val_accuracy, median over {args.rounds} rounds taking turns.",
        "",
        markdown_table(["gradient_dtype", "val_accuracy", "gradient bytes per step per replica"],
                       [(dtype, f"{acc[dtype]:.4f}", f"{size[dtype]:,}") for dtype in DTYPES]),
        "",
        f"Accuracy difference {diff:+.2f} points (target within 0.5: {'PASS' if abs(diff) <= 0.5 else 'FAIL'}); "
        f"bytes {ratio:.2f}x (target <= 0.55x: {'PASS' if ratio <= 0.55 else 'FAIL'}). The bytes on the wire "
        "and samples/s under a 100 Mbit/s link: bench/results/scaling.md.",
        "",
        "Per run: " + json.dumps(runs),
    ]
    write_results("bf16", "\n".join(lines), args.out)


if __name__ == "__main__":
    main()
