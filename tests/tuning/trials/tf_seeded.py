"""A seeded TensorFlow trial for warm-vs-cold starts: a tiny Keras regression on fixed data, its
validation loss reported per epoch with cloudml-hypertune. Writes start.json first: whether
TensorFlow was already imported (a warm start) and the parent's pid."""
import argparse
import json
import os
import sys

# Before the script's own imports: a warm server imported TensorFlow, and the script's top-level
# imports (hypertune here: tuning.preload), before it forked this trial.
warm, preloaded = "tensorflow" in sys.modules, "hypertune" in sys.modules

import hypertune  # noqa: E402

with open(os.path.join(os.environ["MODELYARD_JOB_DIR"], "start.json"), "w") as f:
    json.dump({"warm": warm, "hypertune_imported": preloaded, "ppid": os.getppid(),
               "pid": os.getpid(), "argv": sys.argv}, f)

import numpy as np  # noqa: E402
import tf_keras as keras  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--learning_rate", type=float, required=True)
parser.add_argument("--units", type=int, required=True)
args = parser.parse_args()

keras.utils.set_random_seed(0)
x = np.random.RandomState(0).normal(size=(256, 4)).astype("float32")
y = (x @ np.array([1.0, -2.0, 0.5, 3.0], dtype="float32"))[:, None]
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(args.units, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(args.learning_rate), loss="mse")
hpt = hypertune.HyperTune()
for epoch in range(1, 4):
    model.fit(x[:192], y[:192], epochs=1, batch_size=32, verbose=0, shuffle=False)
    loss = float(model.evaluate(x[192:], y[192:], verbose=0))
    hpt.report_hyperparameter_tuning_metric(hyperparameter_metric_tag="val_loss", metric_value=loss, global_step=epoch)
