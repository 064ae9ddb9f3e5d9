"""The V2 tests' SavedModels, written by a child process (the test process never imports TensorFlow).

``digits``: uint8 ``image [-1, 28, 28]`` -> FP32 ``probabilities [-1, 10]`` and INT64 ``digit [-1]``.
``multi``: FP32 ``a [-1, 3]``, INT32 ``b [-1]``, BYTES ``tag [-1]`` -> FP32 ``scaled [-1, 3]``
(a * b), FP64 ``total [-1]`` (row sums of ``scaled``), BYTES ``echo [-1]`` (tag + "!").
Run as ``python tests/serving/v2_models.py OUT``.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def build(out: Path) -> Path:
    subprocess.run([sys.executable, __file__, str(out)], check=True, capture_output=True, timeout=300,
                   env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    return out


def _write(out: Path) -> None:
    import numpy as np
    import tensorflow as tf

    weights = tf.constant(np.random.default_rng(7).normal(size=(784, 10)).astype("float32") / 10)

    class Digits(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 28, 28], tf.uint8, name="image")])
        def serve(self, image):
            flat = tf.reshape(tf.cast(image, tf.float32) / 255.0, [-1, 784])
            probabilities = tf.nn.softmax(tf.matmul(flat, weights))
            return {"probabilities": probabilities, "digit": tf.argmax(probabilities, axis=1)}

    class Multi(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="a"),
                                      tf.TensorSpec([None], tf.int32, name="b"),
                                      tf.TensorSpec([None], tf.string, name="tag")])
        def serve(self, a, b, tag):
            scaled = a * tf.cast(b, tf.float32)[:, None]
            return {"scaled": scaled, "total": tf.reduce_sum(tf.cast(scaled, tf.float64), axis=1),
                    "echo": tf.strings.join([tag, "!"])}

    for name, module in (("digits", Digits()), ("multi", Multi())):
        tf.saved_model.save(module, str(out / name / "1"), signatures={"serving_default": module.serve})


if __name__ == "__main__":
    _write(Path(sys.argv[1]))
