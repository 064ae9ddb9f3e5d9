"""A tuning trial for the Ray job tests: flags in, ``cloudml-hypertune`` out (``score`` = 1 - (x - 0.3)^2,
reached at the second of two steps), and a record of where it ran: the Ray node its actor gave it
(``MODELYARD_RAY_NODE_ID``), its pid, working directory and metric file. Writes
AIP_MODEL_DIR/where.json and prints the same line, then sleeps ``--sleep`` seconds."""
import argparse
import json
import os
import time

import hypertune

parser = argparse.ArgumentParser()
parser.add_argument("--x", type=float, required=True)
parser.add_argument("--sleep", type=float, default=0)
args = parser.parse_args()

hpt = hypertune.HyperTune()
for step in (1, 2):
    hpt.report_hyperparameter_tuning_metric(hyperparameter_metric_tag="score",
                                            metric_value=(1.0 - (args.x - 0.3) ** 2) * step / 2, global_step=step)
seen = {"node_id": os.environ.get("MODELYARD_RAY_NODE_ID"), "pid": os.getpid(), "cwd": os.getcwd(),
        "metric_file": os.environ["CLOUD_ML_HP_METRIC_FILE"], "trial": os.environ["CLOUD_ML_TRIAL_ID"]}
with open(os.path.join(os.environ["AIP_MODEL_DIR"], "where.json"), "w") as f:
    json.dump(seen, f)
print(f"trial {seen['trial']} on node {seen['node_id']}: {json.dumps(seen)}", flush=True)
time.sleep(args.sleep)
