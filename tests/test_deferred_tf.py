"""modelyard._deferred_tf: TensorFlow's messages without its import, and one real import when needed,
whichever way and from however many threads it is first needed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# In a fresh process: defer, import the messages, then let threads need TensorFlow at once, each its own way.
_RACE = r"""
import json, sys, threading
from modelyard import _deferred_tf
assert _deferred_tf.defer()
from tensorflow_serving.apis import predict_pb2
from tensorflow.core.framework import tensor_pb2
assert _deferred_tf.deferred(), "messages alone must not load TensorFlow"
mapped = "_pywrap_tensorflow_internal" in open("/proc/self/maps").read()
barrier, seen, errors = threading.Barrier(6), [], []

def attribute():
    import tensorflow as tf
    seen.append(int(tf.reduce_sum(tf.constant([1, 2])).numpy()))

def submodule():
    from tensorflow.python.framework import tensor_util
    seen.append(tensor_util.MakeNdarray(tensor_util.make_tensor_proto([3])).tolist())

def message():
    from tensorflow.core.protobuf import config_pb2
    seen.append(config_pb2.ConfigProto(intra_op_parallelism_threads=1).intra_op_parallelism_threads)

def run(job):
    try:
        barrier.wait()
        job()
    except BaseException as exc:
        errors.append(repr(exc))

threads = [threading.Thread(target=run, args=(job,)) for job in (attribute, submodule, message) * 2]
for t in threads:
    t.start()
for t in threads:
    t.join(240)
import tensorflow as tf
print(json.dumps({"mapped_before": mapped, "hung": sum(t.is_alive() for t in threads), "errors": errors,
                  "seen": sorted(map(str, seen)), "deferred": _deferred_tf.deferred(),
                  "one_module": sys.modules["tensorflow"] is tf and tf.make_ndarray.__module__.startswith("tensorflow"),
                  "same_messages": tf.compat.v1.ConfigProto.__module__ == "tensorflow.core.protobuf.config_pb2"}))
"""


def test_threads_needing_tensorflow_at_once_share_one_import():
    done = subprocess.run([sys.executable, "-c", _RACE], env={"PYTHONPATH": str(SRC), "TF_CPP_MIN_LOG_LEVEL": "2",
                                                               "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {"mapped_before": False, "hung": 0, "errors": [], "seen": ["1", "1", "3", "3", "[3]", "[3]"],
                    "deferred": False, "one_module": True, "same_messages": True}, said
