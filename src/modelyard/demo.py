"""The demo model: a digit classifier to serve, query and convert with no setup.

``ensure_demo_model()`` trains two versions of ``my_mnist_model`` on the built-in
digits (``modelyard.datasets``) the first time it is called and reuses them after,
so a quick start needs no download and no training script. Clients get real
inputs from ``demo_instances()`` and a ready-to-paste request from
``demo_curl_command()``.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Callable

import numpy as np

from modelyard.datasets import DIGITS_SHAPE, load_digits_28
from modelyard.model.export import export, version_dir_name

MODEL_NAME = "my_mnist_model"
INPUT_NAME = "image"
OUTPUT_NAME = "probabilities"
# version -> hidden layer widths: version 2 is the "improved" model a server picks up.
VERSIONS: dict[int, tuple[int, ...]] = {1: (100,), 2: (100, 50)}
SEED = 42
EPOCHS = 10


def default_cache_dir() -> Path:
    """$MODELYARD_CACHE, else $XDG_CACHE_HOME/modelyard, else ~/.cache/modelyard."""
    if os.environ.get("MODELYARD_CACHE"):
        return Path(os.environ["MODELYARD_CACHE"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "modelyard"
    return Path.home() / ".cache" / "modelyard"


def _has_version(base_path: Path, version: int) -> bool:
    return (base_path / version_dir_name(version) / "saved_model.pb").is_file()


def _build_and_train(hidden: tuple[int, ...]):
    import tensorflow as tf  # after modelyard's import: tf.keras is tf_keras

    keras = tf.keras
    keras.utils.set_random_seed(SEED)  # same weights on every machine and every run
    inputs = keras.Input(DIGITS_SHAPE, dtype="uint8", name=INPUT_NAME)
    # Rescaling inside the model so clients send raw uint8 pixels, as MNIST clients do.
    x = keras.layers.Rescaling(1 / 255.0, name="rescale")(inputs)
    x = keras.layers.Flatten(name="flatten")(x)
    for i, units in enumerate(hidden, 1):
        x = keras.layers.Dense(units, activation="relu", name=f"hidden_{i}")(x)
    outputs = keras.layers.Dense(10, activation="softmax", name=OUTPUT_NAME)(x)
    model = keras.Model(inputs, outputs, name=f"{MODEL_NAME}_{len(hidden)}_hidden")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    images, labels = load_digits_28("train")
    model.fit(images, labels, epochs=EPOCHS, batch_size=32, verbose=0)
    test_images, test_labels = load_digits_28("test")
    _, accuracy = model.evaluate(test_images, test_labels, verbose=0)
    return model, float(accuracy)


def ensure_demo_model(cache_dir: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """Return ``<cache>/models/my_mnist_model`` holding versions 0001 and 0002, building them once.

    Safe to call from several processes at once: one builds while the others wait on
    a lock, then find the versions in place.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    base_path = cache / "models" / MODEL_NAME
    if all(_has_version(base_path, v) for v in VERSIONS):
        return base_path  # the common case: no lock, no TensorFlow import

    base_path.parent.mkdir(parents=True, exist_ok=True)
    # The lock sits beside the base path, not in it, so servers watching it never see it.
    lock_path = base_path.parent / f".{MODEL_NAME}.lock"
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("waiting for another process that is building the demo model...")
            fcntl.flock(lock, fcntl.LOCK_EX)
        # Released when the file closes, also if this process dies mid-build.
        for version, hidden in VERSIONS.items():
            if _has_version(base_path, version):
                continue  # built by whoever held the lock before us
            stray = base_path / version_dir_name(version)
            if stray.exists():
                # export() is atomic, so this was made by hand; refuse to guess.
                raise FileExistsError(
                    f"{stray} exists but holds no saved_model.pb; delete it to rebuild the demo model"
                )
            log(f"building demo model version {version} (first run only, ~5s)...")
            started = time.monotonic()
            model, accuracy = _build_and_train(hidden)
            path = export(model, base_path, version=version, quiet=True)  # logged below
            log(
                f"demo model version {version}: {len(hidden)} hidden layer(s), "
                f"test accuracy {accuracy:.3f}, built in {time.monotonic() - started:.1f}s -> {path}"
            )
    return base_path


def _one_of_each_digit_in_turn(labels: np.ndarray) -> np.ndarray:
    """Indices of every test image, ordered 0, 1, ..., 9, 0, 1, ... (the split starts 6, 6, 6)."""
    by_digit = [list(np.flatnonzero(labels == digit)) for digit in np.unique(labels)]
    order = [bucket[i] for i in range(max(map(len, by_digit))) for bucket in by_digit if i < len(bucket)]
    return np.asarray(order, dtype=np.int64)


def demo_instances(n: int) -> np.ndarray:
    """``n`` digit images (uint8 [n, 28, 28]) from the test split: digits 0, 1, 2, ... in turn.

    Consecutive images show different digits, so a few predictions show the model telling
    them apart; past the end of the split the sequence repeats.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    images, labels = load_digits_28("test")
    order = _one_of_each_digit_in_turn(labels)
    return np.ascontiguousarray(images[order[np.arange(n) % len(order)]])


def demo_predict_body(n: int = 1) -> str:
    """A REST predict body for ``n`` demo images: compact JSON, as clients send it."""
    return json.dumps({"instances": demo_instances(n).tolist()}, separators=(",", ":"))


def demo_curl_command(rest_port: int, model_name: str = MODEL_NAME) -> str:
    """A ready-to-paste ``curl`` predict request for one real digit image."""
    body = demo_predict_body(1)
    return (
        f"curl -s -X POST http://localhost:{rest_port}/v1/models/{model_name}:predict "
        f"-H 'Content-Type: application/json' -d '{body}'"
    )
