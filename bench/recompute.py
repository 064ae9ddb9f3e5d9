"""Gradient checkpointing (``recompute``): peak memory and step time, with and without.

    python3 bench/recompute.py           # prints the table, writes bench/results/recompute.md

A deep MLP (8 x Dense 2048, ReLU) trained on a batch of 4096 random rows; each mode in its
own process, whose peak resident memory (ru_maxrss) is read after a few steps, and a bare
process that only builds the model gives the baseline (TensorFlow, weights, optimizer
slots). The activations are what ``recompute`` trades for compute: the difference between
a mode's peak and the baseline is what the training step itself needed. Also shown:
``accumulate_steps: 4`` (a quarter of the batch's activations alive at once).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent
BATCH, WIDTH, DEPTH, STEPS = 4096, 2048, 8, 6
MODES = {"baseline (no training step)": None, "plain": {}, "recompute: true": {"recompute": True},
         "accumulate_steps: 4": {"accumulate_steps": 4}}


def one_run(mode: str) -> dict:
    import numpy as np
    import tf_keras as keras

    from modelyard.training import train_step

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((WIDTH,))] + [keras.layers.Dense(WIDTH, activation="relu")
                                                       for _ in range(DEPTH)] + [keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.001, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, WIDTH)).astype("float32")
    y = rng.integers(0, 10, BATCH)
    options = MODES[mode]
    seconds = []
    if options is None:
        model.optimizer.build(model.trainable_variables)  # slots exist, as in training
        model.predict(x[:1], verbose=0)
    else:
        option = dict(options)
        recompute = option.pop("recompute", False)
        train_step.install(model, train_step.StepOptions(recompute=recompute, **option))
        for _ in range(STEPS):
            start = time.perf_counter()
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
            seconds.append(time.perf_counter() - start)
    return {"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "step_s": statistics.median(seconds[1:]) if seconds else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "results"))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one)))
        return
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for round_index in range(args.rounds):
        for mode in MODES:  # taking turns
            out = subprocess.run([sys.executable, __file__, "--one", mode], capture_output=True, text=True, check=True,
                                 env=dict(os.environ, PYTHONPATH=str(ROOT.parent / "src")))
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {round_index + 1}: {mode}: {runs[mode][-1]}", file=sys.stderr, flush=True)
    base = statistics.median(r["peak_mib"] for r in runs["baseline (no training step)"])
    plain_extra = statistics.median(r["peak_mib"] for r in runs["plain"]) - base
    plain_step = statistics.median(r["step_s"] for r in runs["plain"])
    lines = [
        "# Gradient checkpointing: peak memory and step time",
        "",
        f"`python3 bench/recompute.py --rounds {args.rounds}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"2 cores. {DEPTH} x Dense {WIDTH} + Dense 10, batch {BATCH} of random rows, SGD with momentum; peak RSS "
        f"(ru_maxrss) of each mode's own process after {STEPS} steps, medians over {args.rounds} rounds, modes "
        "taking turns.",
        "",
        "| mode | peak RSS MiB | above baseline MiB | vs plain | step s | vs plain |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode in MODES:
        peak = statistics.median(r["peak_mib"] for r in runs[mode])
        if MODES[mode] is None:
            lines.append(f"| {mode} | {peak:,.0f} | 0 | | | |")
            continue
        step = statistics.median(r["step_s"] for r in runs[mode])
        extra = peak - base
        lines.append(f"| `{mode}` | {peak:,.0f} | {extra:,.0f} | {extra / plain_extra:.2f}x | {step:.2f} | "
                     f"{step / plain_step:.2f}x |")
    lines += ["", "Per run: " + json.dumps(runs)]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "recompute.md").write_text(text)


if __name__ == "__main__":
    main()
