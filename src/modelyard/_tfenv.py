"""Environment defaults that must be in place before TensorFlow is first imported.

tf_keras is the Keras used for training (Keras 3 lacks ParameterServerStrategy), so
TF_USE_LEGACY_KERAS=1 makes ``tf.keras`` resolve to it.

Log level. ``MODELYARD_LOG_LEVEL`` (``error``, ``warning`` (default), ``info``, ``debug``;
``modelyard --verbose`` means ``info``, ``-vv`` ``debug``) decides how much TensorFlow says:
below ``info``, its C++ info and warning lines are hidden (TF_CPP_MIN_LOG_LEVEL=2). A
TF_CPP_MIN_LOG_LEVEL the user set is kept unless MODELYARD_LOG_LEVEL (or --verbose) asks
for a level. Some lines (oneDNN, "Could not find cuda drivers") are written while
TensorFlow's shared libraries load, before TensorFlow reads TF_CPP_MIN_LOG_LEVEL, once per
library, and the first device lookup logs "failed call to cuInit" as an error on a machine
without a GPU. They are filtered here: stderr is caught around the first ``import
tensorflow`` and a device lookup, and every line the chosen level keeps is passed on (all
of them if the import fails); the cuInit line counts as a warning.
"""
from __future__ import annotations

import os
import re
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

LEVELS = ("error", "warning", "info", "debug")
# MODELYARD_LOG_LEVEL -> TF_CPP_MIN_LOG_LEVEL (0 info, 1 warning, 2 error, 3 fatal).
_TF_CPP_LEVEL = {"error": "2", "warning": "2", "info": "0", "debug": "0"}
# An absl/TF C++ log line: severity letter, MMDD, time ("I0000 00:00:1795517796.746867 ...").
_CPP_LINE = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:")
_ABSL_PREAMBLE = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}
_NO_GPU = re.compile(rb"failed call to cuInit")


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

    python_level = {"error": logging.ERROR, "debug": logging.DEBUG}.get(_chosen_level() or "")
    if python_level is not None:  # "warning" and "info" keep the loggers' own defaults
        logging.getLogger("tensorflow").setLevel(python_level)
        logging.getLogger("absl").setLevel(python_level)


def _cpp_threshold() -> int:
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


def filter_import_noise(captured: bytes, threshold: int) -> bytes:
    """The lines of ``captured`` that a TF_CPP_MIN_LOG_LEVEL of ``threshold`` lets through."""
    if threshold <= 0:
        return captured
    kept = []
    for line in captured.splitlines(keepends=True):
        if line.rstrip(b"\r\n") == _ABSL_PREAMBLE:
            continue  # absl's own notice that the (filtered) lines go to stderr
        match = _CPP_LINE.match(line)
        severity = _SEVERITY[match.group(1)] if match else None
        if severity is not None and _NO_GPU.search(line):
            severity = min(severity, 1)  # logged as an error, but only says this machine has no GPU
        if severity is not None and severity < threshold:
            continue
        kept.append(line)
    return b"".join(kept)


def _find_devices(tf) -> None:
    """Look for GPUs now, inside the filtered window: on a machine without one, the first
    device lookup logs "failed call to cuInit" as an error, whichever command makes it."""
    try:
        tf.config.list_physical_devices()  # physical only: thread and logical-device settings stay open
    except Exception:  # a broken device set-up surfaces later, where the command uses devices
        pass


def _quiet_exec(exec_module):
    """Wrap a loader's exec_module so stderr written meanwhile is filtered before it shows."""

    def run(module) -> None:
        import tempfile

        threshold = _cpp_threshold()
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):
            exec_module(module)  # no usable fd 2 (embedded interpreter): nothing to filter
            return
        failed = True
        with tempfile.TemporaryFile() as capture:
            os.dup2(capture.fileno(), 2)
            try:
                exec_module(module)
                failed = False
                _find_devices(module)
            finally:
                try:
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass
                os.dup2(saved, 2)
                os.close(saved)
                capture.seek(0)
                shown = capture.read() if failed else filter_import_noise(capture.read(), threshold)
                if shown:
                    os.write(2, shown)
        apply_python_levels()

    return run


class _QuietTensorFlowImport:
    """A one-shot meta path finder: the first ``import tensorflow`` runs under _quiet_exec."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader.exec_module = _quiet_exec(spec.loader.exec_module)
                return spec
        return None


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
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietTensorFlowImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowImport())


_setup()
