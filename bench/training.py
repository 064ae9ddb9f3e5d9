"""Training benchmark: ``modelyard train`` against plain tf.distribute scripts, and the
input-pipeline helper against a naive pipeline on an input-bound workload.

    python3 bench/training.py            # prints the table, writes bench/results/training.md
    python3 bench/training.py --small --out /tmp/training.md   # a check that it runs (not a measurement)

Every configuration runs in fresh processes (TensorFlow's devices are fixed per process).
Samples/s is the median over epochs 2..N of (steps x global batch) / training time of the
epoch, measured the same way on both sides (validation excluded). The sides take turns
(harness.take_turns).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import command_line, env, machine, markdown_table, median, take_turns, write_results

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

GLOBAL_BATCH = 256
# Steps per epoch, epochs, turns of plain and modelyard (each side's best run is reported: the machine
# is shared), rounds of the input pipelines; --small only checks that the benchmark runs.
SIZES = {"full": {"steps": 300, "epochs": 5, "repeats": 5, "pipeline_rounds": 3},
         "small": {"steps": 20, "epochs": 2, "repeats": 1, "pipeline_rounds": 1}}
ENV = env(TF_USE_LEGACY_KERAS="1")


# ---------------------------------------------------------------- plain tf.distribute baseline
def plain(strategy_name: str, out: str, size: dict) -> None:
    """The same model and data written as a user would without modelyard."""
    import tensorflow as tf
    import tf_keras as keras

    from modelyard.datasets import load_digits_28
    from modelyard.training.demo import build_model

    if strategy_name == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice())
    elif strategy_name == "multi_worker_mirrored":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    steps, epochs = size["steps"], size["epochs"]
    keras.utils.set_random_seed(0)
    x, y = load_digits_28("train")

    def dataset_fn(ctx):
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        if ctx.num_input_pipelines > 1:
            ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        return ds.cache().repeat().batch(ctx.get_per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    with strategy.scope():
        model = build_model()
    data = strategy.distribute_datasets_from_function(dataset_fn)

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.rates = []

        def on_epoch_begin(self, epoch, logs=None):
            self.cpu = time.process_time()
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds, cpu = time.perf_counter() - self.start, time.process_time() - self.cpu
            self.rates.append((steps * GLOBAL_BATCH / seconds, steps * GLOBAL_BATCH / cpu))

    timer = Timer()
    model.fit(data, epochs=epochs, steps_per_epoch=steps, callbacks=[timer], verbose=0)
    Path(out).write_text(json.dumps({"samples_per_sec": median(r[0] for r in timer.rates[1:]),
                                     "samples_per_cpu_sec": median(r[1] for r in timer.rates[1:])}))


def _run_plain(strategy_name: str, workdir: Path, size: dict) -> tuple[float, float]:
    me = [sys.executable, str(Path(__file__).resolve()), "_plain", strategy_name]
    sized = [json.dumps(size)]
    if strategy_name != "multi_worker_mirrored":
        out = workdir / f"plain-{strategy_name}.json"
        subprocess.run(me + [str(out)] + sized, env=ENV, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return _rates(out)
    from modelyard.training import cluster

    spec = cluster.local_spec(workers=2)
    procs = []
    for index in range(2):
        child_env = dict(ENV, TF_CONFIG=cluster.tf_config(spec, cluster.Task("worker", index)))
        procs.append(subprocess.Popen(me + [str(workdir / f"plain-mwms-{index}.json")] + sized, env=child_env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit("plain multi-worker baseline failed")
    return _rates(workdir / "plain-mwms-0.json")


def _rates(path: Path) -> tuple[float, float]:
    """(samples per wall-clock second, samples per CPU-second of the process) from a result file."""
    result = json.loads(path.read_text())
    return result["samples_per_sec"], result["samples_per_cpu_sec"]


def _run_modelyard(strategy_name: str, workdir: Path, size: dict) -> tuple[float, float]:
    import yaml

    config = {
        "model": "demo", "global_batch_size": GLOBAL_BATCH, "epochs": size["epochs"], "steps_per_epoch": size["steps"],
        "seed": 0, "job_dir": str(workdir / f"job-{strategy_name}"), "verbose": False,
        "strategy": {"name": strategy_name},
    }
    if strategy_name == "mirrored":
        config["strategy"]["devices"] = ["CPU:0", "CPU:1"]
        config["devices"] = {"logical_cpus": 2}
    path = workdir / f"{strategy_name}.yaml"
    path.write_text(yaml.safe_dump(config))
    train = [sys.executable, "-m", "modelyard", "train", str(path)]
    cmd = train if strategy_name != "multi_worker_mirrored" else \
        [sys.executable, "-m", "modelyard", "launch", "--workers", "2", "--"] + train
    subprocess.run(cmd, env=ENV, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return _rates(workdir / f"job-{strategy_name}" / "metrics.json")


# ---------------------------------------------------------------- input pipeline
def input_bound(out: str, rounds: int) -> None:
    """Train on examples that need a Python-side decode: helper pipeline vs naive pipeline."""
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    from modelyard.datasets import load_digits_28
    from modelyard.training.data import pipeline
    from modelyard.training.demo import build_model

    x, y = load_digits_28("train")
    encoded = np.array([img.tobytes() for img in x], dtype=object)

    def py_decode(blob):
        time.sleep(0.0002)  # stands in for reading/decoding a file: waits without holding the GIL
        return np.frombuffer(blob, dtype=np.uint8).reshape(28, 28)

    def decode(blob, label):
        image = tf.numpy_function(py_decode, [blob], tf.uint8, stateful=False)
        return tf.ensure_shape(image, (28, 28)), label

    batch, epochs = 64, 3
    steps = len(y) // batch

    def run(name: str, _round: int) -> float:
        examples = tf.data.Dataset.from_tensor_slices((encoded, y))
        if name == "naive":
            data = examples.map(decode).batch(batch, drop_remainder=True).repeat()
        elif name == "helper_nocache":
            data = pipeline(examples, batch, decode=decode, cache=False)
        else:
            data = pipeline(examples, batch, decode=decode)
        keras.utils.set_random_seed(0)
        model = build_model()
        model.predict(np.zeros((batch, 28, 28), np.uint8), verbose=0)  # build outside the timing
        start = time.perf_counter()
        model.fit(data, epochs=epochs, steps_per_epoch=steps, verbose=0)
        return epochs * steps * batch / (time.perf_counter() - start)

    # Taking turns: load on the shared machine varies over time.
    results = take_turns(["naive", "helper_nocache", "helper"], rounds, run, report=lambda *_: None)
    Path(out).write_text(json.dumps(results))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="20 steps x 2 epochs, one turn: checks it runs")
    parser.add_argument("--out", help="results file or folder (default bench/results/training.md)")
    args = parser.parse_args()
    size = SIZES["small" if args.small else "full"]
    started_on = machine()
    rows, runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for name, label in (("one_device", "one_device"), ("mirrored", "mirrored (2 logical CPUs)"),
                            ("multi_worker_mirrored", "multi_worker_mirrored (2 processes)")):
            sides = {"plain": _run_plain, "modelyard": _run_modelyard}
            turns = take_turns(list(sides), size["repeats"],
                               lambda side, _round: sides[side](name, workdir, size))  # noqa: B023 (called here)
            bases, ourses = turns["plain"], turns["modelyard"]
            # Other jobs on the machine only ever slow a run down, so the best run of each side is
            # the least disturbed measurement of it; both sides get the same treatment.
            base, ours = max(b for b, _ in bases), max(o for o, _ in ourses)
            pairs = median(o / b for (b, _), (o, _) in zip(bases, ourses))
            cpu = median(c for _, c in ourses) / median(c for _, c in bases)
            rows.append((label, base, ours, ours / base, pairs, cpu))
            print(f"{label}: plain {base:.0f}  modelyard {ours:.0f}  ratio {ours / base:.3f}  pairs {pairs:.3f}  "
                  f"cpu {cpu:.3f}  (runs: plain {[round(b) for b, _ in bases]}, modelyard {[round(o) for o, _ in ourses]})",
                  flush=True)
            runs.append((label, bases, ourses))
        out = workdir / "input.json"
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "_input", str(out), str(size["pipeline_rounds"])],
                       env=ENV, check=True)
        pipe_runs = json.loads(out.read_text())
        pipe = {name: median(values) for name, values in pipe_runs.items()}
    lines = [
        "# Training benchmark",
        "",
        f"`{command_line()}`, {started_on}.",
        "",
        f"Digits MLP (784-100-10, `modelyard.training.demo`), global batch {GLOBAL_BATCH}, {size['steps']} steps x "
        f"{size['epochs']} epochs, same seed, same cached in-memory input (`from_tensor_slices`, per-worker `shard`, "
        "`cache`, `repeat`, per-replica `batch`, `prefetch(AUTOTUNE)`) fed through "
        "`distribute_datasets_from_function`, same cross-device ops (reduce-to-one on CPU), default "
        "`steps_per_execution` on both sides. Samples/s = steps x global batch / seconds of the epoch's training "
        "steps, median of epochs 2..N, read on worker 0. The plain script times `fit` epochs with a single callback; "
        "`modelyard train` runs with its defaults (BackupAndRestore, per-epoch ModelCheckpoint, TensorBoard, "
        "metrics.json, collective watchdog for multi-worker, validation after each epoch) and its timer covers "
        "the same window: from the last epoch-begin hook to the start of validation, so per-epoch checkpoint "
        "writes and validation are outside it on the modelyard side just as they are absent on the plain side. "
        f"Each side is run {size['repeats']} times in fresh processes, taking turns (plain, modelyard, modelyard, "
        "plain, ...: the order reversed every round). Other jobs "
        "share this 2-core CPU and single runs swing by up to 2x, so three views are given: each side's best run "
        "(load only ever slows a run down), the median ratio of back-to-back pairs (neighbours see similar load), "
        "and samples per CPU-second of the worker-0 process over the same window (what the steps cost, largely "
        "independent of other load). Every run is listed below the table. No GPU.",
        "",
        markdown_table(["strategy", "plain tf.distribute, best run (samples/s)", "modelyard train, best run (samples/s)",
                        "ratio of best runs", "ratio, median of back-to-back pairs",
                        "ratio of samples per CPU-second (medians)"],
                       [(label, f"{base:,.0f}", f"{ours:,.0f}", f"{ratio:.2f}", f"{pairs:.2f}", f"{cpu:.2f}")
                        for label, base, ours, ratio, pairs, cpu in rows]),
    ]
    lines += ["", "All runs (samples/s, in run order):", ""]
    lines += [f"- {label}: plain {', '.join(f'{b:,.0f}' for b, _ in bases)}; modelyard {', '.join(f'{o:,.0f}' for o, _ in ourses)}"
              for label, bases, ourses in runs]
    lines += [
        "",
        "Earlier runs gave 0.81 (one_device) and 0.69 (multi_worker_mirrored). Causes found and fixed in the "
        "trainer: (1) `strategy.collective_timeout` (default 300 s) was passed to TensorFlow as "
        "`CommunicationOptions(timeout_seconds=...)`, which starts one thread per collective living for the whole "
        "timeout (TensorFlow documents it as debug-only); the timeout is now enforced by one watchdog thread that "
        "polls the step counters once a second and aborts the collectives when they stop moving; (2) the epoch "
        "timer sat after the checkpoint callbacks, so each epoch's checkpoint save was counted as training time "
        "on the modelyard side only; it now measures the same window as the plain script.",
    ]
    lines += [
        "",
        "Input-bound workload: each example is decoded in Python (`tf.numpy_function` with a 0.2 ms "
        "simulated read wait that releases the GIL; the call itself holds the GIL for ~0.1 ms), 3 epochs of the "
        "digits train split, batch 64, whole `fit` timed, same model and seed for each pipeline. The naive "
        "pipeline is what a first script does: `map(decode)` then `batch`, decoding every epoch with no "
        "parallelism and no prefetch. The helper runs the decode in parallel (AUTOTUNE), prefetches, and by "
        "default caches decoded examples, so epochs 2 and 3 skip the decode; the middle row turns the cache "
        "off to show what parallel decode plus prefetch alone give (the GIL-held part of each call bounds it).",
        "",
        markdown_table(["pipeline", "samples/s", "speed-up"], [
            ("naive (`map(decode)` then `batch`, no parallelism, no prefetch)", f"{pipe['naive']:,.0f}", "1.00"),
            ("`pipeline(decode=..., cache=False)` (parallel decode, prefetch)", f"{pipe['helper_nocache']:,.0f}",
             f"{pipe['helper_nocache'] / pipe['naive']:.2f}"),
            ("`pipeline(decode=...)` (parallel decode, cache, prefetch; the default)", f"{pipe['helper']:,.0f}",
             f"{pipe['helper'] / pipe['naive']:.2f}")]),
        "",
        f"Each pipeline is run {size['pipeline_rounds']} times, taking turns, in one process; medians shown. All runs (samples/s): "
        + "; ".join(f"{name} {', '.join(f'{v:,.0f}' for v in values)}" for name, values in pipe_runs.items()) + ".",
        "",
    ]
    write_results("training", "\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_plain":
        plain(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_input":
        input_bound(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(main())
