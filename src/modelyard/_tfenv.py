"""Environment defaults that must be in place before TensorFlow is first imported.

tf_keras is the Keras used for training (Keras 3 lacks ParameterServerStrategy), so
TF_USE_LEGACY_KERAS=1 makes ``tf.keras`` resolve to it.

Log level. ``MODELYARD_LOG_LEVEL`` (``error``, ``warning`` (default), ``info``, ``debug``;
``modelyard --verbose`` means ``info``, ``-vv`` ``debug``) decides how much TensorFlow says:
below ``info``, its C++ info and warning lines are hidden (TF_CPP_MIN_LOG_LEVEL=2). A
TF_CPP_MIN_LOG_LEVEL the user set is kept unless MODELYARD_LOG_LEVEL (or --verbose) asks
for a level. Lines TensorFlow and LiteRT print before that level applies are filtered by
``modelyard._quiet``.
"""
from __future__ import annotations

import os
import sys

from modelyard import _quiet

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

LEVELS = ("error", "warning", "info", "debug")
# MODELYARD_LOG_LEVEL -> TF_CPP_MIN_LOG_LEVEL (0 info, 1 warning, 2 error, 3 fatal).
_TF_CPP_LEVEL = {"error": "2", "warning": "2", "info": "0", "debug": "0"}


def _chosen_level() -> str | None:
    level = os.environ.get("MODELYARD_LOG_LEVEL", "").strip().lower()
    return level if level in LEVELS else None


def set_level(level: str) -> None:
    """Choose the log level for this process and its children (call before TensorFlow loads)."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    os.environ["MODELYARD_LOG_LEVEL"] = level
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = _TF_CPP_LEVEL[level]
    if "tensorflow" in sys.modules:  # too late for the C++ side; the Python loggers still follow
        apply_python_levels()


def apply_python_levels() -> None:
    """Python-side loggers (TensorFlow's, absl's) follow the level; called once TF is imported."""
    import logging

    # The default ("warning") hides TensorFlow's Python info lines too, such as the "Assets written to: ..."
    # of every SavedModel save, which a command that sets up INFO logging for itself would print.
    python_level = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO,
                    "debug": logging.DEBUG}[_chosen_level() or "warning"]
    logging.getLogger("tensorflow").setLevel(python_level)
    logging.getLogger("absl").setLevel(python_level)


def _setup() -> None:
    level = _chosen_level()
    asked = os.environ.get("MODELYARD_LOG_LEVEL", "").strip()
    if asked and level is None:
        print(f"modelyard: warning: MODELYARD_LOG_LEVEL={asked} is not one of {', '.join(LEVELS)}; "
              "using the default (warning)", file=sys.stderr)
    if level is not None:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = _TF_CPP_LEVEL[level]
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _quiet.install(after_tensorflow=apply_python_levels)


_setup()
