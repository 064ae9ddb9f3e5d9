"""Builds the tiny SavedModels the platform tests deploy, and their own predictions.

Run as a script (so TensorFlow stays out of the pytest process):
    python build_models.py OUT_DIR
writes OUT_DIR/tiny{1,2}/0001 (4 floats in, 3 softmax probabilities out, different weights) and
OUT_DIR/expected.json: each model's own Keras predictions for INSTANCES; and OUT_DIR/digits_uint8/0001,
a digits classifier on uint8 pixels (test_vertex_numbers.py), under "digits" with its first three
images and its own predictions of them. One process imports TensorFlow for all three.
"""
from __future__ import annotations

import json
import sys

INSTANCES = [[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 1.0], [-1.5, 0.5, 2.0, -3.0]]


def main(out: str) -> None:
    import numpy as np

    import modelyard
    import tf_keras as keras

    expected = {}
    for seed in (1, 2):
        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((4,), name="x"),
                                  keras.layers.Dense(3, activation="softmax", name="probabilities")])
        path = modelyard.export(model, f"{out}/tiny{seed}")
        expected[f"tiny{seed}"] = {"path": str(path),
                                   "predictions": model.predict(np.array(INSTANCES, np.float32), verbose=0).tolist()}
    with open(f"{out}/expected.json", "w") as f:
        json.dump({"instances": INSTANCES, "models": expected, "digits": digits_uint8(out)}, f)


def digits_uint8(out: str) -> dict:
    """load_digits' 0-16 pixels scaled to 0-240 as uint8, into Rescaling and a softmax Dense."""
    import numpy as np
    from sklearn.datasets import load_digits

    import modelyard
    import tf_keras as keras

    X, y = load_digits(return_X_y=True)
    X = (X * 15).astype(np.uint8)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,), dtype="uint8", name="pixels"), keras.layers.Rescaling(1 / 255),
                              keras.layers.Dense(10, activation="softmax", name="probabilities")])
    model.compile(loss="sparse_categorical_crossentropy", optimizer="adam")
    model.fit(X, y, epochs=2, verbose=0)
    path = modelyard.export(model, f"{out}/digits_uint8")
    return {"path": str(path), "instances": X[:3].tolist(), "predictions": model.predict(X[:3], verbose=0).tolist()}


if __name__ == "__main__":
    main(sys.argv[1])
