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
