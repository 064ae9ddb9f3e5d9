"""A replica for the Ray job tests: records its TF_CONFIG, the Ray node it runs on and whether its own
address in the cluster is free to bind, then sleeps or fails.

Writes AIP_MODEL_DIR/<task type>-<index>.json (the TF_CONFIG task) and prints the same line.
"""
import json
import os
import socket
import sys
import time

args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:] if "=" in a)
tf_config = json.loads(os.environ["TF_CONFIG"])
task = tf_config["task"]
host, port = tf_config["cluster"][task["type"]][task["index"]].rsplit(":", 1)
with socket.socket() as s:  # the port reserved for this task on its node is ours now
    try:
        s.bind((host, int(port)))
        bindable = True
    except OSError:
        bindable = False
seen = {"tf_config": tf_config, "node_id": os.environ.get("MODELYARD_RAY_NODE_ID"), "pid": os.getpid(),
        "bindable": bindable, "cluster_spec": json.loads(os.environ["CLUSTER_SPEC"]),
        "job_id": os.environ.get("CLOUD_ML_JOB_ID")}
name = f"{task['type']}-{task['index']}"
with open(os.path.join(os.environ["AIP_MODEL_DIR"], name + ".json"), "w") as f:
    json.dump(seen, f)
print(f"{name} on node {seen['node_id']}: {json.dumps(task)}", flush=True)
time.sleep(float(args.get("sleep", 0)))
if args.get("fail"):
    print(f"{name}: failing on purpose", flush=True)
    sys.exit(int(args["fail"]))
