"""bf16 gradients: final accuracy against float32 on two workers (multi_worker_mirrored).

    python3 bench/bf16.py                # prints the table, writes bench/results/bf16.md

The digits MLP, `modelyard launch --workers 2`, global batch 64, the same seed and data
order for both; the runs take turns over the rounds. The bytes and the samples/s under a
100 Mbit/s link are in bench/results/scaling.md (bench/scaling.py).
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
EPOCHS = 6


def one_run(work: Path, dtype: str) -> dict:
    job = work / f"job-{dtype}-{time.monotonic_ns()}"
    config = work / f"{dtype}.yaml"
    config.write_text(yaml.safe_dump({
        "model": "demo", "data": "digits", "strategy": "multi_worker_mirrored", "gradient_dtype": dtype,
        "global_batch_size": 64, "epochs": EPOCHS, "seed": 0, "tensorboard": False, "input_report": False,
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
    parser.add_argument("--out", default=str(ROOT / "results"))
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"float32": [], "bfloat16": []}
    with tempfile.TemporaryDirectory(prefix="modelyard-bf16-") as tmp:
        for round_index in range(args.rounds):
            for dtype in runs:
                runs[dtype].append(one_run(Path(tmp), dtype))
                print(f"round {round_index + 1}: {dtype}: {runs[dtype][-1]}", file=sys.stderr, flush=True)
    acc = {d: statistics.median(r["val_accuracy"] for r in rs) for d, rs in runs.items()}
    size = {d: rs[0]["allreduce_bytes_per_step"] for d, rs in runs.items()}
    diff = 100 * (acc["bfloat16"] - acc["float32"])
    ratio = size["bfloat16"] / size["float32"]
    lines = [
        "# bf16 gradients on two workers: accuracy and bytes",
        "",
        f"`python3 bench/bf16.py --rounds {args.rounds}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"2 cores. Digits MLP, multi_worker_mirrored over 2 workers, global batch 64, {EPOCHS} epochs, seed 0; "
        f"final val_accuracy, median over {args.rounds} rounds taking turns.",
        "",
        "| gradient_dtype | val_accuracy | gradient bytes per step per replica |",
        "| --- | ---: | ---: |",
    ]
    for dtype in runs:
        lines.append(f"| {dtype} | {acc[dtype]:.4f} | {size[dtype]:,} |")
    lines += ["", f"Accuracy difference {diff:+.2f} points (target within 0.5: {'PASS' if abs(diff) <= 0.5 else 'FAIL'}); "
              f"bytes {ratio:.2f}x (target <= 0.55x: {'PASS' if ratio <= 0.55 else 'FAIL'}). The bytes on the wire "
              "and samples/s under a 100 Mbit/s link: bench/results/scaling.md.", "", "Per run: " + json.dumps(runs)]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bf16.md").write_text(text)


if __name__ == "__main__":
    main()
