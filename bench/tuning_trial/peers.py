"""The peers of `modelyard tune` in the tuning benchmark, each one in-process study in this process:

    python3 bench/tuning_trial/peers.py kerastuner|optuna --trials 30 --epochs 20 --workdir DIR

- ``kerastuner``: KerasTuner's Hyperband (``pip install keras-tuner``), max_epochs = --epochs,
  factor 3, its own trials (KerasTuner drives Keras 3, so the network is built with ``keras``).
- ``optuna``: a plain Optuna script, the way its docs show it: TPE (seed 0), MedianPruner with its
  defaults, one ``fit`` per trial whose epoch callback reports and stops a pruned trial.

Both train the benchmark's digits MLP (digits_mlp.build) on the same input as `modelyard train`
(its own tf.data pipeline: batch 64, 22 steps an epoch, 5 validation steps), with Keras' seed 0
set before each trial as `modelyard train` does. Every epoch prints one JSON line
``{"event": "epoch", "t": unix time, "trial": n, "epoch": e, "val_accuracy": v}`` so the caller
can time when a study first reached an accuracy; a last ``{"event": "done", ...}`` line sums up.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

STEPS, VALIDATION_STEPS, BATCH = 22, 5, 64


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def _datasets():
    """The train and validation datasets exactly as `modelyard train` builds them for digits."""
    from modelyard.training import data

    train = data.builtin_dataset_fn({"source": "digits"}, "train", BATCH, 0)(None)
    validation = data.builtin_dataset_fn({"source": "digits"}, "validation", BATCH, None)(None)
    return train, validation


def _epoch_logger(keras, trial_number: int, on_epoch=None):
    """A callback printing each epoch's val_accuracy; ``on_epoch(step, value)`` may stop training."""

    class EpochLog(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            value = float((logs or {})["val_accuracy"])
            _emit("epoch", trial=trial_number, epoch=epoch + 1, val_accuracy=value)
            if on_epoch is not None and on_epoch(epoch + 1, value):
                self.model.stop_training = True

    return EpochLog()


def run_kerastuner(trials: int, epochs: int, workdir: Path) -> dict[str, Any]:
    """KerasTuner Hyperband; ``trials`` sets hyperband_iterations so it tries about that many points."""
    import keras
    import keras_tuner as kt

    from digits_mlp import build

    train, validation = _datasets()
    iterations = max(1, round(trials / _hyperband_configs(epochs, 3)))

    def model_fn(hp):
        keras.utils.set_random_seed(0)
        return build(keras, hp.Float("learning_rate", 1e-4, 0.3, sampling="log"),
                     hp.Int("width", 8, 256, sampling="log"), hp.Float("dropout", 0.0, 0.6))

    class Logged(kt.Hyperband):
        def run_trial(self, trial, *args, **kwargs):
            kwargs["callbacks"] = list(kwargs.get("callbacks", [])) + [_epoch_logger(keras, int(trial.trial_id))]
            return super().run_trial(trial, *args, **kwargs)

    tuner = Logged(model_fn, objective="val_accuracy", max_epochs=epochs, factor=3,
                   hyperband_iterations=iterations, seed=0, directory=str(workdir), project_name="kt",
                   overwrite=True)
    tuner.search(train, steps_per_epoch=STEPS, validation_data=validation, validation_steps=VALIDATION_STEPS,
                 verbose=0)
    # A Hyperband round that carries a point on is a new KerasTuner trial with the same values.
    names = ("learning_rate", "width", "dropout")
    points = {tuple(t.hyperparameters.values.get(n) for n in names) for t in tuner.oracle.trials.values()}
    return {"trials": len(tuner.oracle.trials), "points": len(points), "hyperband_iterations": iterations}


def _hyperband_configs(max_epochs: int, factor: int) -> int:
    """Points one Hyperband iteration of KerasTuner starts (its brackets' first rounds)."""
    import math

    s_max = int(math.log(max_epochs, factor) + 1e-9)
    return sum(math.ceil((s_max + 1) / (s + 1) * factor ** s) for s in range(s_max + 1))


def run_optuna(trials: int, epochs: int) -> dict[str, Any]:
    """A plain Optuna script: TPE, MedianPruner, the trial's best epoch as its value."""
    import optuna
    import tf_keras as keras

    from digits_mlp import build

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    train, validation = _datasets()

    def objective(trial: optuna.Trial) -> float:
        _emit("trial_start", trial=trial.number)
        keras.utils.set_random_seed(0)
        model = build(keras, trial.suggest_float("learning_rate", 1e-4, 0.3, log=True),
                      trial.suggest_int("width", 8, 256, log=True), trial.suggest_float("dropout", 0.0, 0.6))
        seen: list[float] = []

        def report(step: int, value: float) -> bool:
            seen.append(value)
            trial.report(value, step)
            return trial.should_prune()

        model.fit(train, epochs=epochs, steps_per_epoch=STEPS, validation_data=validation,
                  validation_steps=VALIDATION_STEPS, verbose=0, callbacks=[_epoch_logger(keras, trial.number, report)])
        if len(seen) < epochs:
            raise optuna.TrialPruned()
        return max(seen)

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0),
                                pruner=optuna.pruners.MedianPruner())
    study.optimize(objective, n_trials=trials)
    pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)
    return {"trials": len(study.trials), "points": len(study.trials), "pruned": pruned}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tool", choices=("kerastuner", "optuna"))
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--workdir", default="peers-work")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.tool == "kerastuner":
        summary = run_kerastuner(args.trials, args.epochs, Path(args.workdir))
    else:
        summary = run_optuna(args.trials, args.epochs)
    _emit("done", **summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
