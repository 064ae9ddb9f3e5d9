"""A trial whose first epochs land all at once between two polls of the tuner: it writes the
cloudml-hypertune file with one measurement per value of --curve (comma-separated, steps 1, 2, ...)
in a single atomic replace, then, if its first value is below --hold-below, holds for --hold
seconds before exiting (so only a trial that should be stopped takes long)."""
import argparse
import json
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--curve", required=True)
parser.add_argument("--hold", type=float, default=0.0)
parser.add_argument("--hold-below", type=float, default=float("inf"))
args, _ = parser.parse_known_args()

path = os.environ["CLOUD_ML_HP_METRIC_FILE"]
now = time.time()
# The layout cloudml-hypertune writes: one JSON object per report, each with its own timestamp.
lines = [json.dumps({"timestamp": now + step * 1e-3, "trial": os.environ["CLOUD_ML_TRIAL_ID"],
                     "global_step": step, "score": float(value)})
         for step, value in enumerate(args.curve.split(","), 1)]
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path + ".tmp", "w") as f:
    f.write("\n".join(lines) + "\n")
os.replace(path + ".tmp", path)
if float(args.curve.split(",")[0]) < args.hold_below:
    time.sleep(args.hold)
