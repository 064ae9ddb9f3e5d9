"""A training script for the pipeline tests, written as a script for Vertex AI would be.

Each replica records its Vertex environment in AIP_CHECKPOINT_DIR/<task>.json; the chief copies the
SavedModel named by SOURCE_MODEL (a local directory) into AIP_MODEL_DIR, as "training" output. Both
directories are gs:// URIs, written with google-cloud-storage (STORAGE_EMULATOR_HOST reaches the
platform's storage). REQUIRE names a module that must import (a requirement of the package);
--sleep=S waits (ended as soon as the file --until=FILE names exists), --fail=N fails with exit code N.
"""
import importlib
import json
import os
import sys
import time
from pathlib import Path

from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:] if "=" in a)
task = json.loads(os.environ["CLUSTER_SPEC"])["task"]
name = f"{task['type']}-{task['index']}"
client = storage.Client(project=os.environ["CLOUD_ML_PROJECT_ID"], credentials=AnonymousCredentials())
required = os.environ.get("REQUIRE")
if required:
    module = importlib.import_module(required)
    print(f"{name}: {required} imported from {module.__file__}", flush=True)
record = {"argv": sys.argv[1:], "pid": os.getpid(), "python": sys.executable, "env": {k: os.environ.get(k) for k in (
    "AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR", "TF_CONFIG", "CLUSTER_SPEC",
    "CLOUD_ML_JOB_ID", "CLOUD_ML_PROJECT_ID", "STORAGE_EMULATOR_HOST", "GREETING")}}
storage.Blob.from_uri(os.environ["AIP_CHECKPOINT_DIR"] + name + ".json", client=client).upload_from_string(
    json.dumps(record))
print(f"{name}: started with {sys.argv[1:]}", flush=True)
end = time.monotonic() + float(args.get("sleep", 0))
while time.monotonic() < end and not ("until" in args and os.path.exists(args["until"])):
    time.sleep(min(0.05, max(0.0, end - time.monotonic())))
if args.get("fail"):
    print(f"{name}: failing on purpose", flush=True)
    sys.exit(int(args["fail"]))
if task["type"] == "workerpool0" and os.environ.get("SOURCE_MODEL"):
    source = Path(os.environ["SOURCE_MODEL"])
    for f in source.rglob("*"):
        if f.is_file():
            uri = os.environ["AIP_MODEL_DIR"] + f.relative_to(source).as_posix()
            storage.Blob.from_uri(uri, client=client).upload_from_filename(str(f))
    print(f"{name}: model written to {os.environ['AIP_MODEL_DIR']}", flush=True)
