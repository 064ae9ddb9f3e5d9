"""Pipeline parallelism benchmark: the measured GPipe bubble against (K - 1) / (M + K - 1).

    python3 bench/pipeline.py            # prints the table, writes bench/results/pipeline.md

A balanced model (four Dense 1024 layers, two per stage) on K = 2 logical CPU devices, each
op single-threaded so that each stage has one of the machine's two cores, trained with
M = 1 (plain model parallelism), 2, 4, 8 and 16 micro-batches per batch of 512. For each M:
the median over steps 2..N of the measured idle share, 1 - busy / (K x wall), and the
samples/s, next to the same model trained on one device without stages. Each configuration
runs in its own process (TensorFlow's devices and thread counts are fixed per process), and
the configurations take turns over the rounds.

    python3 bench/pipeline.py --schedules   # writes bench/results/pipeline_1f1b.md

PipeDream's 1F1B (asynchronous, weight stashing) and PipeDream-Flush against GPipe on the
same model and devices at M = 4 and 8: the bubble, samples/s and the stage inputs each stage
holds between its forward and backward passes (the activation memory: a stage's backward
pass recomputes its forward pass from them), counted by the pipeline and times their bytes;
then the demo model's accuracy on digits without a pipeline, with 1F1B and stashing, and
without stashing.

    python3 bench/pipeline.py --profile     # prints where each schedule's time goes

GPipe and 1F1B at M = 4 and 8, one process each: the time per micro-batch of each stage's
forward pass, backward pass (on the live weights or on a saved copy), weight update (with the
save of the weights an in-flight micro-batch still needs), gradient sum, the batch's
synchronous update, and the copy of a micro-batch's activations to the next stage's device.
Timed around each call (wall time in the stage's thread), medians of nothing: sums over
steps 3..N divided by the micro-batches, so a noisy machine shows as noise.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parent
BATCH = 512
WIDTH = 2048
STEPS = 12
MICRO_BATCHES = (1, 2, 4, 8, 16)
STAGES = 2


def _model():
    import tf_keras as keras

    model = keras.Sequential([keras.Input(shape=(WIDTH,))] + [keras.layers.Dense(WIDTH, activation="relu")
                                                             for _ in range(4)] + [keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def one_run(micro_batches: int, schedule: str = "gpipe") -> dict:
    """One configuration in this process; M = 0 means one device, no stages."""
    import tensorflow as tf

    model, x, y = _seeded_model_and_batch()
    if micro_batches == 0:
        step = tf.function(lambda: model.train_step((x, y)))
        walls = []
        for _ in range(STEPS):
            start = time.perf_counter()
            step()["loss"].numpy()
            walls.append(time.perf_counter() - start)
        return {"samples_per_sec": BATCH / statistics.median(walls[1:])}
    runner = _two_stages(model, micro_batches, schedule)
    results = [runner.train_step(x, y) for _ in range(STEPS)][1:]  # the first step traces the stages
    # Bytes of one micro-batch's input to each stage: the data for the first, the first stage's output after.
    input_bytes = [4 * (BATCH // micro_batches) * WIDTH] * STAGES
    return {"samples_per_sec": BATCH / statistics.median(r.wall for r in results),
            "bubble": statistics.median(r.bubble for r in results),
            "bubble_theoretical": runner.theoretical_bubble,
            "inputs_held": [max(r.stashed_peak[i] for r in results) for i in range(STAGES)],
            "held_mib": [max(r.stashed_peak[i] for r in results) * input_bytes[i] / 2**20 for i in range(STAGES)],
            "weight_versions": [max(r.versions_peak[i] for r in results) for i in range(STAGES)],
            "staleness_max": [max((max(r.staleness[i]) if r.staleness[i] else 0) for r in results)
                              for i in range(STAGES)]}


def _seeded_model_and_batch():
    """The model and one batch, the same in every run (two logical CPUs set up first)."""
    import numpy as np
    import tensorflow as tf

    _setup_devices()
    tf.keras.utils.set_random_seed(0)
    model = _model()
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((BATCH, WIDTH)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, BATCH))
    return model, x, y


def _two_stages(model, micro_batches: int, schedule: str):
    """The pipeline the bench measures: the model's first two layers on CPU:0, the rest on CPU:1."""
    from modelyard.training import pipeline

    layers = [layer.name for layer in model.layers]
    return pipeline.Pipeline(model, [layers[:2], layers[2:]], ["CPU:0", "CPU:1"], micro_batches, schedule=schedule)


def _setup_devices():
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(4)
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * STAGES)


def profile_run(micro_batches: int, schedule: str) -> dict:
    """One schedule in this process, each stage's calls timed by wrapping them (nothing in the library)."""
    import threading
    from collections import defaultdict

    import tensorflow as tf

    model, x, y = _seeded_model_and_batch()
    runner = _two_stages(model, micro_batches, schedule)
    for _ in range(2):  # traces, compiles and makes the saved copies
        runner.train_step(x, y)
    # The activations' trip to the next stage's device (in the pipeline, part of that stage's forward call).
    out = runner.stages[0].forward(x[:BATCH // micro_batches])
    trips = []
    for _ in range(20):
        start = time.perf_counter()
        with tf.device("CPU:1"):
            tf.identity(out).numpy()
        trips.append(time.perf_counter() - start)
    compiled = [getattr(stage.update, "compiled", None) for stage in runner.stages]
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    calls: dict[tuple[str, str], int] = defaultdict(int)

    def timed(owner, attr: str, phase: str) -> None:
        fn = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                key = (threading.current_thread().name.replace("pipeline-stage-", "stage "), phase)
                seconds[key] += time.perf_counter() - start
                calls[key] += 1
        setattr(owner, attr, wrapper)

    for stage in runner.stages:
        timed(stage, "forward", "forward")
        timed(stage, "backward", "backward, live weights")
        timed(stage, "accumulate", "gradient sum")
        if stage.update is not None:
            timed(stage, "update", "update")
        for slot in getattr(stage, "slots", []):  # none before the saved copies existed
            timed(slot, "backward", "backward, saved weights")
            timed(slot, "save_and_update", "save + update")
    timed(runner.optimizer, "apply_gradients", "batch update (main thread)")
    steps = STEPS - 2
    walls = [runner.train_step(x, y).wall for _ in range(steps)]
    per_mb = steps * micro_batches
    return {"samples_per_sec": BATCH / statistics.median(walls),
            "ms_per_micro_batch": {f"{who}|{phase}": 1000 * t / per_mb for (who, phase), t in seconds.items()},
            "calls_per_micro_batch": {f"{who}|{phase}": n / per_mb for (who, phase), n in calls.items()},
            "transfer_ms": 1000 * statistics.median(trips),
            "compiled_update": compiled}


def profile_main() -> None:
    """GPipe and 1F1B at M = 4 and 8, each in its own process: where the time per micro-batch goes."""
    sys.path.insert(0, str(ROOT))
    from harness import machine, markdown_table

    print(f"`python3 bench/pipeline.py --profile`; {machine()}.\n")
    for m in (4, 8):
        results = {}
        for schedule in ("gpipe", "1f1b"):
            out = subprocess.run([sys.executable, __file__, "--one-profile", f"{schedule}:{m}"], capture_output=True,
                                 text=True, check=True, env=dict(os.environ, PYTHONPATH=str(ROOT.parent / "src")))
            results[schedule] = json.loads(out.stdout.strip().splitlines()[-1])
        keys = sorted({key for r in results.values() for key in r["ms_per_micro_batch"]},
                      key=lambda key: (key.split("|")[0] == "MainThread", key))
        rows = [[key.split("|")[0], key.split("|")[1]]
                + [f"{r['ms_per_micro_batch'].get(key, 0):.1f} ({r['calls_per_micro_batch'].get(key, 0):.2f})"
                   for r in results.values()] for key in keys]
        rows.append(["-", "activations to the next device (one copy)"]
                    + [f"{r['transfer_ms']:.2f}" for r in results.values()])
        rows.append(["-", "samples/s"] + [f"{r['samples_per_sec']:,.0f}" for r in results.values()])
        print(f"M = {m}: ms per micro-batch (calls per micro-batch); 1F1B's update compiled with XLA: "
              f"{results['1f1b']['compiled_update']}\n")
        print(markdown_table(["thread", "phase", "gpipe", "1f1b"], rows, "llrr") + "\n", flush=True)


def accuracy_run() -> dict:
    """The demo on digits, 4 epochs of batch 64: no pipeline, 1F1B (M = 4) with and without stashing."""
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * STAGES)
    from modelyard.training import data as data_mod
    from modelyard.training import demo, pipeline

    epochs, batch = 4, 64
    train = data_mod.builtin_dataset_fn({}, "train", batch, 0)(None)
    x_val, y_val = data_mod.load_arrays({}, "validation")
    steps = data_mod.count_examples({}, "train") // batch
    out = {}
    for name in ("no pipeline", "1f1b, stashing", "1f1b, no stashing", "gpipe"):
        keras.utils.set_random_seed(1)
        model = demo.build_model()
        if name == "no pipeline":
            model.fit(train, epochs=epochs, steps_per_epoch=steps, verbose=0)
        else:
            names = [layer.name for layer in model.layers]
            runner = pipeline.Pipeline(model, [names[:3], names[3:]], ["CPU:0", "CPU:1"], 4,
                                       schedule=name.split(",")[0], weight_stashing="no stashing" not in name)
            pipeline.fit(runner, train, epochs, steps)
        out[name] = float(np.mean(np.argmax(model.predict(x_val, verbose=0), axis=1) == y_val))
    return out


def schedules_main(rounds: int, out_dir: str) -> None:
    """PipeDream (1F1B, PipeDream-Flush) against GPipe: bubble, samples/s, activation memory, accuracy."""
    sys.path.insert(0, str(ROOT))
    from harness import machine, markdown_table, median, take_turns, write_results

    sides = [f"{schedule}:{m}" for m in (4, 8) for schedule in ("gpipe", "1f1b-flush", "1f1b")]

    def run(side: str, _round: int) -> dict:
        out = subprocess.run([sys.executable, __file__, "--one-schedule", side], capture_output=True, text=True,
                             check=True, env=dict(os.environ, PYTHONPATH=str(ROOT.parent / "src")))
        return json.loads(out.stdout.strip().splitlines()[-1])

    runs = take_turns(sides, rounds, run)
    rows = []
    for side in sides:
        schedule, m = side.split(":")
        gpipe = runs[f"gpipe:{m}"]
        rate, base = median(r["samples_per_sec"] for r in runs[side]), median(r["samples_per_sec"] for r in gpipe)
        held, base_held = runs[side][0]["held_mib"], gpipe[0]["held_mib"]
        rows.append([f"`{schedule}`", m, f"{median(r['bubble'] for r in runs[side]):.3f}",
                     f"{runs[side][0]['bubble_theoretical']:.3f}", f"{rate:,.0f}", f"{rate / base:.2f}x",
                     " / ".join(str(n) for n in runs[side][0]["inputs_held"]),
                     " / ".join(f"{mib:.1f}" for mib in held),
                     " / ".join(f"{a / b:.2f}x" for a, b in zip(held, base_held)),
                     " / ".join(str(n) for n in runs[side][0]["weight_versions"]),
                     " / ".join(str(n) for n in runs[side][0]["staleness_max"])])
    accuracy = json.loads(subprocess.run([sys.executable, __file__, "--one-schedule", "accuracy"], capture_output=True,
                                         text=True, check=True,
                                         env=dict(os.environ, PYTHONPATH=str(ROOT.parent / "src"))).stdout
                          .strip().splitlines()[-1])
    plain = accuracy["no pipeline"]
    text = "\n".join([
        f"# Pipeline schedules: PipeDream 1F1B and PipeDream-Flush against GPipe, K = {STAGES}",
        "",
        f"`python3 bench/pipeline.py --schedules --rounds {rounds}`; {machine()}.",
        f"Model: 4 x Dense {WIDTH} + Dense 10 (two equal stages on logical CPU:0 / CPU:1, one thread per op), batch "
        f"{BATCH}; medians over steps 2..{STEPS} and {rounds} round(s), the schedules taking turns. Inputs held: the "
        "most micro-batch inputs a stage kept at once between their forward and backward passes (counted by the "
        "pipeline); their MiB is the stage's activation memory between the passes (each backward pass recomputes "
        "its stage's forward pass from them). Values per stage (stage 0 / stage 1).",
        "",
        markdown_table(["schedule", "M", "bubble", "GPipe theory", "samples/s", "vs GPipe", "inputs held",
                        "held MiB", "held vs GPipe", "weight versions", "max staleness"], rows, "lrrrrrrrrrr"),
        "",
        "## Accuracy: the demo on digits (4 epochs, batch 64, M = 4)",
        "",
        markdown_table(["training", "validation accuracy", "vs no pipeline (points)"],
                       [[name, f"{acc:.4f}", f"{100 * (acc - plain):+.1f}"] for name, acc in accuracy.items()]),
        "",
        "1F1B applies an update per micro-batch (M times GPipe's updates, each on a quarter of the batch), so its "
        "accuracy after the same epochs is not GPipe's; PipeDream-Flush makes GPipe's updates exactly "
        "(tests/training/test_pipedream.py). Each batch ends with the pipeline drained, so 1F1B's bubble here "
        "includes a fill and a drain per batch, as GPipe's does.",
    ])
    write_results("pipeline_1f1b", text, out_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "results"))
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # run one configuration, print JSON
    parser.add_argument("--schedules", action="store_true", help="1F1B and PipeDream-Flush against GPipe")
    parser.add_argument("--one-schedule", help=argparse.SUPPRESS)  # "schedule:M" or "accuracy", print JSON
    parser.add_argument("--profile", action="store_true", help="where GPipe's and 1F1B's time per micro-batch goes")
    parser.add_argument("--one-profile", help=argparse.SUPPRESS)  # "schedule:M", print JSON
    args = parser.parse_args()
    if args.profile:
        profile_main()
        return
    if args.one_profile:
        schedule, m = args.one_profile.split(":")
        print(json.dumps(profile_run(int(m), schedule)))
        return
    if args.one is not None:
        print(json.dumps(one_run(args.one)))
        return
    if args.one_schedule:
        if args.one_schedule == "accuracy":
            print(json.dumps(accuracy_run()))
        else:
            schedule, m = args.one_schedule.split(":")
            print(json.dumps(one_run(int(m), schedule)))
        return
    if args.schedules:
        schedules_main(args.rounds, args.out)
        return
    sys.path.insert(0, str(ROOT))
    from harness import take_turns, write_results

    def run(m: int, _round: int) -> dict:
        out = subprocess.run([sys.executable, __file__, "--one", str(m)], capture_output=True, text=True,
                             check=True, env=dict(os.environ, PYTHONPATH=str(ROOT.parent / "src")))
        return json.loads(out.stdout.strip().splitlines()[-1])

    # Taking turns, so a slow minute of the shared machine hits every configuration.
    runs: dict[int, list[dict]] = take_turns((0,) + MICRO_BATCHES, args.rounds, run)
    base = statistics.median(r["samples_per_sec"] for r in runs[0])
    lines = [
        f"# Pipeline parallelism: measured bubble vs GPipe's (K-1)/(M+K-1), K = {STAGES}",
        "",
        f"`python3 bench/pipeline.py --rounds {args.rounds}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
        f"Model: 4 x Dense {WIDTH} + Dense 10, batch {BATCH}, two layers per stage on logical CPU:0 / CPU:1, "
        f"one thread per op (one core per stage). Medians over steps 2..{STEPS} and over {args.rounds} rounds.",
        "",
        "| micro-batches M | measured bubble | theoretical | difference (points) | within 10 points | samples/s | vs one device |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| one device, no stages | - | - | - | - | {base:,.0f} | 1.00x |",
    ]
    for m in MICRO_BATCHES:
        bubble = statistics.median(r["bubble"] for r in runs[m])
        theory = runs[m][0]["bubble_theoretical"]
        rate = statistics.median(r["samples_per_sec"] for r in runs[m])
        diff = 100 * (bubble - theory)
        lines.append(f"| {m}{' (M >= 4K)' if m >= 4 * STAGES else ''} | {bubble:.3f} | {theory:.3f} | {diff:+.1f} | "
                     f"{'yes' if abs(diff) <= 10 else 'NO'} | {rate:,.0f} | {rate / base:.2f}x |")
    lines += ["", "Bubble = 1 - (sum of the stages' busy time) / (K x the span from the first stage call's start to the "
              "last one's end), measured on every step around each stage's calls (the weight update after it is "
              "not part of it); the backward pass recomputes the forward pass "
              "(GPipe's re-materialisation), so a pipelined step does more work than one on one device; and two single-threaded matmuls at once on this VM's two cores each run ~1.5x slower than one alone (memory bandwidth), so here the stages' overlap does not make up for the recompute: samples/s is below one device's. The bubble, the schedule's idle share, follows GPipe's bound."]
    write_results("pipeline", "\n".join(lines), args.out)


if __name__ == "__main__":
    main()
