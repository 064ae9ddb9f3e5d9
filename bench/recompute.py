"""Gradient checkpointing (``recompute``): peak memory and step time, with and without.

    python3 bench/recompute.py           # prints the table, writes bench/results/recompute.md

A deep MLP (8 x Dense 2048, ReLU) trained on a batch of 4096 random rows, each mode in its
own process. Measured: the peak of TensorFlow's CPU allocator during the training steps
above what was allocated before them (the step's activations, gradients and temporaries),
the process's peak RSS, and the step time. Also shown: ``accumulate_steps: 4`` (a quarter
of the batch's activations alive at once).
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
MODES = {"plain": {}, "recompute: true": {"recompute": True},
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
    import tensorflow as tf

    data = iter(tf.data.Dataset.from_tensors((x, y)).repeat())
    if options is None:
        model.optimizer.build(model.trainable_variables)  # slots exist, as in training
    else:
        option = dict(options)
        recompute = option.pop("recompute", False)
        train_step.install(model, train_step.StepOptions(recompute=recompute, **option))
        train = model.make_train_function()
        train(data)  # trace and build outside the measurement
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    tf.config.experimental.reset_memory_stats("CPU:0")
    for _ in range(STEPS if options is not None else 0):
        start = time.perf_counter()
        float(train(data)["loss"])
        seconds.append(time.perf_counter() - start)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    return {"step_peak_mib": (peak - before) / 2**20, "rss_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "step_s": statistics.median(seconds) if seconds else None}


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
    plain_peak = statistics.median(r["step_peak_mib"] for r in runs["plain"])
    plain_step = statistics.median(r["step_s"] for r in runs["plain"])
    lines = [
        "# Gradient checkpointing: memory a training step allocates, and its time",
        "",
        f"`python3 bench/recompute.py --rounds {args.rounds}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"2 cores. {DEPTH} x Dense {WIDTH} + Dense 10, batch {BATCH} of random rows, SGD with momentum. Peak of "
        f"TensorFlow's CPU allocator during {STEPS} training steps above what was allocated before them "
        "(`tf.config.experimental.get_memory_info`, after `reset_memory_stats`): the activations, gradients and "
        "temporaries of a step. Process peak RSS beside it (it also holds TensorFlow, the data and malloc's "
        f"arenas). Medians over {args.rounds} rounds, each mode in its own process, modes taking turns.",
        "",
        "| mode | step peak MiB | vs plain | process peak RSS MiB | step s | vs plain |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode in MODES:
        if MODES[mode] is None:
            continue
        peak = statistics.median(r["step_peak_mib"] for r in runs[mode])
        rss = statistics.median(r["rss_peak_mib"] for r in runs[mode])
        step = statistics.median(r["step_s"] for r in runs[mode])
        lines.append(f"| `{mode}` | {peak:,.0f} | {peak / plain_peak:.2f}x | {rss:,.0f} | {step:.2f} | "
                     f"{step / plain_step:.2f}x |")
    lines += ["", "Per run: " + json.dumps(runs)]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "recompute.md").write_text(text)


if __name__ == "__main__":
    main()
