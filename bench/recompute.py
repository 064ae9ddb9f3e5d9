"""Gradient checkpointing (``recompute``): peak memory and step time, with and without.

    python3 bench/recompute.py           # prints the table, writes bench/results/recompute.md

A deep MLP (8 x Dense 2048, ReLU) trained on a batch of 4096 random rows, each mode in its
own process. Measured: the peak of TensorFlow's CPU allocator during the training steps
above what was allocated before them (the step's activations, gradients and temporaries),
the process's peak RSS, and the step time. Also shown: ``accumulate_steps: 4`` (a quarter
of the batch's activations alive at once). The modes take turns (harness.take_turns). The
children run with ``TF_CPU_ALLOCATOR_USE_BFC=true``: TensorFlow 2.21 keeps no allocator
statistics for the CPU without it.

    python3 bench/recompute.py --small --rounds 1 --out /tmp/recompute.md   # a check that it runs
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from harness import command_line, env, machine, markdown_table, median, take_turns, write_results

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
SIZES = {"full": {"batch": 4096, "width": 2048, "depth": 8, "steps": 6},
         "small": {"batch": 256, "width": 128, "depth": 2, "steps": 2}}  # --small: checks it runs
# TensorFlow 2.21 keeps allocator statistics for CPU:0 only with its BFC allocator on the CPU
# ("Allocator stats not available for device 'CPU:0'" otherwise).
CHILD_ENV = env(TF_USE_LEGACY_KERAS="1", TF_CPU_ALLOCATOR_USE_BFC="true")
MODES = {"plain": {}, "recompute: true": {"recompute": True},
         "accumulate_steps: 4": {"accumulate_steps": 4}}


def one_run(mode: str, size: dict) -> dict:
    import numpy as np
    import tf_keras as keras

    from modelyard.training import train_step

    batch, width, depth, steps = size["batch"], size["width"], size["depth"], size["steps"]
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((width,))] + [keras.layers.Dense(width, activation="relu")
                                                       for _ in range(depth)] + [keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.001, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, width)).astype("float32")
    y = rng.integers(0, 10, batch)
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
    for _ in range(steps if options is not None else 0):
        start = time.perf_counter()
        float(train(data)["loss"])
        seconds.append(time.perf_counter() - start)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    return {"step_peak_mib": (peak - before) / 2**20, "rss_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "step_s": median(seconds) if seconds else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="a tiny MLP: checks the benchmark runs, not a measurement")
    parser.add_argument("--out", help="results file or folder (default bench/results/recompute.md)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    size_name = "small" if args.small else "full"
    size = SIZES[size_name]
    if args.one:
        print(json.dumps(one_run(args.one, size)))
        return

    def run(mode: str, _round: int) -> dict:
        # Each mode in its own process: TensorFlow's allocator peak and the RSS are per process.
        out = subprocess.run([sys.executable, __file__, "--one", mode] + (["--small"] if args.small else []),
                             capture_output=True, text=True, env=CHILD_ENV)
        if out.returncode != 0:
            raise RuntimeError(f"{mode} failed:\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    started_on = machine()
    runs = take_turns(list(MODES), args.rounds, run)
    plain_peak = median(r["step_peak_mib"] for r in runs["plain"])
    plain_step = median(r["step_s"] for r in runs["plain"])
    rows = []
    for mode in MODES:
        if MODES[mode] is None:
            continue
        peak = median(r["step_peak_mib"] for r in runs[mode])
        rss = median(r["rss_peak_mib"] for r in runs[mode])
        step = median(r["step_s"] for r in runs[mode])
        rows.append((f"`{mode}`", f"{peak:,.0f}", f"{peak / plain_peak:.2f}x", f"{rss:,.0f}", f"{step:.2f}",
                     f"{step / plain_step:.2f}x"))
    lines = [
        "# Gradient checkpointing: memory a training step allocates, and its time",
        "",
        f"`{command_line()}`, {started_on}. {size['depth']} x Dense {size['width']} + Dense 10, batch "
        f"{size['batch']} of random rows, SGD with momentum. Peak of TensorFlow's CPU allocator during {size['steps']} "
        "training steps above what was allocated before them "
        "(`tf.config.experimental.get_memory_info`, after `reset_memory_stats`): the activations, gradients and "
        "temporaries of a step. Process peak RSS beside it (it also holds TensorFlow, the data and malloc's "
        f"arenas). Medians over {args.rounds} rounds, each mode in its own process, modes taking turns.",
        "",
        markdown_table(["mode", "step peak MiB", "vs plain", "process peak RSS MiB", "step s", "vs plain"], rows),
        "",
        "Per run: " + json.dumps(runs),
    ]
    write_results("recompute", "\n".join(lines), args.out)


if __name__ == "__main__":
    main()
