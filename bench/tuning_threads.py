"""Where a warm worker's CPU per epoch goes: the benchmark's digits function trial run the way a
warm worker runs it (modelyard.tuning.worker's load, apply_slot, clear_state at a trial's start
and end), in one or two processes at once, the old way or the current way.

    python3 bench/tuning_threads.py [--trials 6] [--epochs 5]

Rows (each a fresh set of processes, run one after another):

- ``alone, unpinned``: one process, no slot, no clearing between trials: what the in-process
  Optuna script does;
- ``two, old workers``: two processes at once, one core each, the slot applied after the
  objective's module was imported (TensorFlow had already made its pools for every core when the
  thread-count variables came), nothing frozen: issue 29's first workers;
- ``two, slot before import``: the same with the slot's thread counts and cores in place before
  the import, nothing frozen;
- ``two, current workers``: slot before import and the import's objects frozen (worker.load):
  what WorkerPool runs now.

A child prints CPU seconds (user + system, its trials only: imports excluded), wall seconds, the
number of threads and the threads that used the most CPU (by name), as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = str(HERE / "tuning_trial" / "digits_function.py") + ":objective"
# Points of the study's range, wide and narrow networks, as TPE tries them.
POINTS = [(0.003, 64, 0.1), (0.01, 256, 0.3), (0.0005, 16, 0.0), (0.05, 128, 0.5), (0.002, 200, 0.2), (0.02, 32, 0.4)]


def _threads() -> list[tuple[str, float]]:
    """(name, CPU s) of this process' threads, busiest first."""
    tick = os.sysconf("SC_CLK_TCK")
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out.append((name, (int(fields[11]) + int(fields[12])) / tick))
    return sorted(out, key=lambda t: -t[1])


def child(args: argparse.Namespace) -> None:
    from modelyard.tuning.devices import Slot
    from modelyard.tuning.worker import apply_slot, clear_state, load, resolve

    os.environ["DIGITS_EPOCHS"] = str(args.epochs)
    slot = Slot("cpu", (args.core,)) if args.core is not None else None
    if slot and args.slot == "before":
        apply_slot(slot.env(), sorted(slot.cpus))
    objective = load(TARGET) if args.freeze else resolve(TARGET)
    if slot and args.slot == "after":
        apply_slot(slot.env(), sorted(slot.cpus))
    epochs = 0

    def report(step, value):
        nonlocal epochs
        epochs += 1

    start, usage = time.time(), resource.getrusage(resource.RUSAGE_SELF)
    for i in range(args.trials):
        if slot:
            clear_state(0)
        lr, width, dropout = POINTS[i % len(POINTS)]
        objective({"learning_rate": lr, "width": width, "dropout": dropout}, report)
        if slot:
            clear_state(None)
    after = resource.getrusage(resource.RUSAGE_SELF)
    import tensorflow as tf

    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    threads = _threads()
    print(json.dumps({"cpu": cpu, "wall": time.time() - start, "epochs": epochs, "threads": len(threads),
                      "busiest": threads[:6], "intra": tf.config.threading.get_intra_op_parallelism_threads(),
                      "inter": tf.config.threading.get_inter_op_parallelism_threads(),
                      "affinity": sorted(os.sched_getaffinity(0))}), flush=True)


def run(args: argparse.Namespace, cores: list[int | None], slot: str, freeze: bool) -> list[dict]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    procs = []
    for core in cores:
        argv = [sys.executable, __file__, "--child", "--slot", slot, "--trials", str(args.trials),
                "--epochs", str(args.epochs)] + (["--core", str(core)] if core is not None else []) + (
                ["--freeze"] if freeze else [])
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
    return [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--core", type=int)
    parser.add_argument("--slot", choices=("after", "before"), default="before")
    parser.add_argument("--freeze", action="store_true")
    parser.add_argument("--only", nargs="*", default=None, help="row names' first words to run")
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    rows = [("alone, unpinned", [None], "before", False), ("two, old workers", [0, 1], "after", False),
            ("two, slot before import", [0, 1], "before", False), ("two, current workers", [0, 1], "before", True)]
    print(f"{args.trials} trials x {args.epochs} epochs per process; load {os.getloadavg()[0]:.1f}", flush=True)
    print("| processes | CPU s per epoch (each) | wall s per epoch (each) | intra/inter threads | threads | busiest threads (CPU s) | load |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, cores, slot, freeze in rows:
        if args.only and not any(name.startswith(w) for w in args.only):
            continue
        results = run(args, cores, slot, freeze)
        per_cpu = ", ".join(f"{r['cpu'] / r['epochs']:.3f}" for r in results)
        per_wall = ", ".join(f"{r['wall'] / r['epochs']:.3f}" for r in results)
        busiest = "; ".join(", ".join(f"{n} {c:.1f}" for n, c in r["busiest"][:4]) for r in results)
        print(f"| {name} | {per_cpu} | {per_wall} | {results[0]['intra']}/{results[0]['inter']} | "
              f"{', '.join(str(r['threads']) for r in results)} | {busiest} | {os.getloadavg()[0]:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
