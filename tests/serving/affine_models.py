"""Tiny SavedModels built at test time: ``y = a * x + b``, so each version answers distinctly."""
from __future__ import annotations

from pathlib import Path

import modelyard  # noqa: F401
import tensorflow as tf


class Affine(tf.Module):
    def __init__(self, a: float, b: float):
        super().__init__()
        self.a = tf.Variable(a, dtype=tf.float32)
        self.b = tf.Variable(b, dtype=tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
    def serve(self, x):
        return {"y": self.a * x + self.b}


def save_affine(path: Path, a: float, b: float) -> Path:
    module = Affine(a, b)
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


class PerRow(tf.Module):
    """Three outputs, each row computed from its own input row only (so batching cannot change them).

    ``y = x * a + b`` (float32 [n, 3]), ``s = sum(x * w, axis=1)`` (float32 [n]) and
    ``k = round(100 * x[:, 0])`` (int32 [n]): distinct rows give distinct answers, so a row
    answered to the wrong request, or a padding row handed back, shows.
    """

    def __init__(self):
        super().__init__()
        self.a = tf.Variable([1.5, -0.3, 2.7], dtype=tf.float32)
        self.b = tf.Variable([0.1, 7.0, -3.3], dtype=tf.float32)
        self.w = tf.Variable([0.7, 1.9, -0.45], dtype=tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def serve(self, x):
        return {
            "y": x * self.a + self.b,
            "s": tf.reduce_sum(x * self.w, axis=1),
            "k": tf.cast(tf.round(100.0 * x[:, 0]), tf.int32),
        }


def save_per_row(path: Path) -> Path:
    module = PerRow()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


class Sleepy(tf.Module):
    """``y = 2 * x[:, :1] + 1``, after sleeping (without using a core) the batch's largest ``x[:, 1]`` seconds.

    The sleep is a TF op (tf.data's SleepDataset), so it survives the SavedModel round trip and
    holds the server's batch thread for as long as a test asks, per request.
    """

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def serve(self, x):
        from tensorflow.python.data.experimental.ops import testing

        # SleepDataset sleeps before each element and again before end-of-sequence: twice here.
        micros = tf.cast(tf.reduce_max(x[:, 1]) * 0.5e6, tf.int64)
        slept = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).apply(testing.sleep(micros))
        done = slept.reduce(tf.constant(0, tf.int64), lambda total, value: total + value)
        with tf.control_dependencies([done]):
            return {"y": 2.0 * x[:, :1] + 1.0}


def save_sleepy(path: Path) -> Path:
    module = Sleepy()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


class BatchProbe(tf.Module):
    """Shows the batch the model really ran: ``y = x``, ``n`` = rows in the batch, ``i`` = row index in it.

    Served with batching, ``n`` and ``i`` expose padding and merging from outside: a
    request's own rows come back with the size and position of the batch they ran in.
    """

    @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
    def serve(self, x):
        rows = tf.shape(x)[0]
        return {"y": tf.identity(x), "n": tf.fill([rows], rows), "i": tf.range(rows)}


def save_batch_probe(path: Path) -> Path:
    module = BatchProbe()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path
