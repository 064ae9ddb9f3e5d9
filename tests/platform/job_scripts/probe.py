"""A training command for the job tests: records what the platform gave it, then sleeps or fails.

Writes AIP_MODEL_DIR/<task>.json with its argv, pid and the Vertex environment variables (through
google-cloud-storage when AIP_MODEL_DIR is a gs:// URI, as a script on Vertex would).
--sleep=S waits S seconds; with --until=FILE it ends its wait as soon as FILE exists, with
--records=N as soon as AIP_MODEL_DIR (local) holds N records: what the test waits on, not a guess.
"""
import json
import os
import sys
import time

args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:] if "=" in a)
task = json.loads(os.environ["CLUSTER_SPEC"])["task"]
name = f"{task['type']}-{task['index']}"
model_dir = os.environ["AIP_MODEL_DIR"]
record = json.dumps({"argv": sys.argv[1:], "pid": os.getpid(), "env": {k: os.environ.get(k) for k in (
    "AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR", "TF_CONFIG", "CLUSTER_SPEC",
    "CLOUD_ML_JOB_ID", "CLOUD_ML_PROJECT_ID", "GREETING")}})
if model_dir.startswith("gs://"):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    blob = storage.Blob.from_uri(model_dir + name + ".json",
                                    client=storage.Client(project="local", credentials=AnonymousCredentials()))
    blob.upload_from_string(record)
else:
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, name + ".json")
    with open(path + ".tmp", "w") as f:  # whole when counted (--records counts *.json)
        f.write(record)
    os.replace(path + ".tmp", path)
print(f"{name}: started with {sys.argv[1:]}", flush=True)
end = time.monotonic() + float(args.get("sleep", 0))
while time.monotonic() < end:
    if "until" in args and os.path.exists(args["until"]):
        break
    if "records" in args and len([f for f in os.listdir(model_dir) if f.endswith(".json")]) >= int(args["records"]):
        break
    time.sleep(min(0.05, max(0.0, end - time.monotonic())))
if args.get("fail"):
    print(f"{name}: failing on purpose", flush=True)
    sys.exit(int(args["fail"]))
