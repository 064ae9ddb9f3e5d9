"""Builds the tiny SavedModels the platform tests deploy, and their own predictions.

Run as a script (so TensorFlow stays out of the pytest process):
    python build_models.py OUT_DIR
writes OUT_DIR/tiny{1,2}/0001 (4 floats in, 3 softmax probabilities out, different weights) and
OUT_DIR/expected.json: each model's own Keras predictions for INSTANCES.
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
        json.dump({"instances": INSTANCES, "models": expected}, f)


if __name__ == "__main__":
    main(sys.argv[1])
