"""A trainer for the Ray job tests on machines that share no disk, written as a script for Vertex AI is.

Every replica records its Ray node, its interpreter and its Vertex environment in
AIP_CHECKPOINT_DIR/<workerpool>-<index>.json; the chief copies the SavedModel under SOURCE_MODEL (a
gs:// prefix) into AIP_MODEL_DIR as its "training" output. Both directories are gs:// URIs, written
with google-cloud-storage (STORAGE_EMULATOR_HOST reaches the platform's storage from any node):
TensorFlow's own gs:// file system would talk to Google, not to the platform.
"""
import json
import os
import sys

from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

task = json.loads(os.environ["CLUSTER_SPEC"])["task"]
name = f"{task['type']}-{task['index']}"
client = storage.Client(project=os.environ["CLOUD_ML_PROJECT_ID"], credentials=AnonymousCredentials())
record = {"argv": sys.argv[1:], "pid": os.getpid(), "python": sys.executable, "cwd": os.getcwd(),
          "node_id": os.environ.get("MODELYARD_RAY_NODE_ID"),
          "env": {k: os.environ.get(k) for k in ("AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "TF_CONFIG",
                                                 "STORAGE_EMULATOR_HOST")}}
storage.Blob.from_uri(os.environ["AIP_CHECKPOINT_DIR"] + name + ".json", client=client).upload_from_string(
    json.dumps(record))
print(f"{name}: recorded on node {record['node_id']}", flush=True)
if task["type"] == "workerpool0":
    source = os.environ["SOURCE_MODEL"].rstrip("/") + "/"
    bucket, prefix = source[len("gs://"):].split("/", 1)
    target = os.environ["AIP_MODEL_DIR"]
    copied = 0
    for blob in client.list_blobs(bucket, prefix=prefix):
        rel = blob.name[len(prefix):]
        storage.Blob.from_uri(target + rel, client=client).upload_from_string(blob.download_as_bytes())
        copied += 1
    print(f"{name}: wrote {copied} model files to {target}", flush=True)
