"""The benchmark's digits MLP as a function trial (``trial: {function: digits_function.py:objective}``).

The same network (digits_mlp.build, tf_keras), the same tf.data input as `modelyard train` and the
in-process peers (peers._datasets, built once per warm worker), Keras' seed 0 before each trial,
and the best epoch's val_accuracy as the trial's value, as bench/tuning_trial/peers.py's Optuna
script does. Epochs per trial: $DIGITS_EPOCHS (default 20).
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tf_keras as keras  # noqa: E402

from digits_mlp import build  # noqa: E402
from peers import STEPS, VALIDATION_STEPS, _datasets  # noqa: E402

TRAIN, VALIDATION = _datasets()  # once per worker


def objective(params, report):
    keras.utils.set_random_seed(0)
    model = build(keras, params["learning_rate"], params["width"], params["dropout"])
    seen = []

    class Report(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(float(logs["val_accuracy"]))
            report(epoch + 1, seen[-1])  # raises TrialPruned out of fit() when the study stops the trial

    model.fit(TRAIN, epochs=int(os.environ.get("DIGITS_EPOCHS", "20")), steps_per_epoch=STEPS,
              validation_data=VALIDATION, validation_steps=VALIDATION_STEPS, verbose=0, callbacks=[Report()])
    return max(seen)
