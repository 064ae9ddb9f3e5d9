"""A trainer for the Ray job tests on machines that share no disk, written as a script for Vertex AI is.

Every replica finds its credentials and project as on Vertex (``google.auth.default()``: the metadata
server its node runs for it) and records them, its Ray node, its interpreter and its Vertex environment
in AIP_CHECKPOINT_DIR/<workerpool>-<index>.json with a ``storage.Client()`` given nothing. The chief
copies the SavedModel under SOURCE_MODEL (a gs:// prefix) into AIP_MODEL_DIR with TensorFlow's own
``tf.io.gfile`` (through the node's storage gateway) as its "training" output.
"""
import json
import os
import sys

import google.auth
import google.auth.transport.requests
from google.cloud import storage

task = json.loads(os.environ["CLUSTER_SPEC"])["task"]
name = f"{task['type']}-{task['index']}"
credentials, project = google.auth.default()
credentials.refresh(google.auth.transport.requests.Request())
client = storage.Client()
record = {"argv": sys.argv[1:], "pid": os.getpid(), "python": sys.executable, "cwd": os.getcwd(),
          "node_id": os.environ.get("MODELYARD_RAY_NODE_ID"), "project": project,
          "credentials": type(credentials).__name__, "token": credentials.token,
          "env": {k: os.environ.get(k) for k in ("AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "TF_CONFIG",
                                                 "STORAGE_EMULATOR_HOST", "GCE_METADATA_HOST", "HTTPS_PROXY",
                                                 "CLOUD_ML_PROJECT_ID")}}
storage.Blob.from_uri(os.environ["AIP_CHECKPOINT_DIR"] + name + ".json", client=client).upload_from_string(
    json.dumps(record))
print(f"{name}: recorded on node {record['node_id']}", flush=True)
if task["type"] == "workerpool0":
    import tensorflow as tf

    source = os.environ["SOURCE_MODEL"].rstrip("/") + "/"
    target = os.environ["AIP_MODEL_DIR"]
    copied = 0
    for parent, _dirs, files in tf.io.gfile.walk(source):
        for f in files:
            rel = (parent.rstrip("/") + "/" + f)[len(source):]
            tf.io.gfile.makedirs(os.path.dirname(target + rel))
            tf.io.gfile.copy(source + rel, target + rel, overwrite=True)
            copied += 1
    print(f"{name}: wrote {copied} model files to {target} with tf.io.gfile", flush=True)
