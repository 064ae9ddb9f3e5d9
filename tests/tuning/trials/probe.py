"""A CPU-bound trial that records, from inside, where it may run and where it did run.

It busy-loops for --seconds, sampling the core it is on (/proc/self/stat field 39), and
writes probe.json into its job dir: affinity, the cores seen, thread-count variables, and
its start/end times. It reports `score` = --x through hypertune.
"""
import argparse
import json
import os
import time

import hypertune

parser = argparse.ArgumentParser()
parser.add_argument("--x", type=float, required=True)
parser.add_argument("--seconds", type=float, default=1.5)
args = parser.parse_args()


def current_core() -> int:
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


start = time.time()
seen = set()
while time.time() - start < args.seconds:
    sum(i * i for i in range(20000))
    seen.add(current_core())
hypertune.HyperTune().report_hyperparameter_tuning_metric("score", args.x, global_step=1)
out = {
    "pid": os.getpid(), "affinity": sorted(os.sched_getaffinity(0)), "seen": sorted(seen),
    "intra": os.environ.get("TF_NUM_INTRAOP_THREADS"), "omp": os.environ.get("OMP_NUM_THREADS"),
    "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": start, "end": time.time(),
}
with open(os.path.join(os.environ["MODELYARD_JOB_DIR"], "probe.json"), "w") as f:
    json.dump(out, f)
