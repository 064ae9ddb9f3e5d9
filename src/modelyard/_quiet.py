"""Filtering what TensorFlow and LiteRT write to stderr before their own log level applies.

Some lines are written while TensorFlow's shared libraries load, before TensorFlow reads
TF_CPP_MIN_LOG_LEVEL, once per library (oneDNN, "Could not find cuda drivers"); the first
device lookup logs "failed call to cuInit" as an error on a machine without a GPU; LiteRT
says "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." when the first interpreter
allocates. So the first ``import tensorflow`` (with a device lookup) and LiteRT's first
allocation run with fd 2 caught in a file, and every line TF_CPP_MIN_LOG_LEVEL keeps is
passed on afterwards (all of them on an exception); the cuInit line counts as a warning.
``install()`` puts the import hook in place; ``modelyard._tfenv`` calls it.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading

# An absl/TF C++ log line: severity letter, MMDD, time ("I0000 00:00:1795517796.746867 ...").
_CPP_LINE = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:")
_ABSL_PREAMBLE = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}  # by first letter, also of TFLite's INFO/WARNING/ERROR
_NO_GPU = re.compile(rb"failed call to cuInit")
# TFLite/LiteRT's own log lines: "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."
_LITE_LINE = re.compile(rb"^(INFO|WARNING|ERROR): ")


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
        match = _CPP_LINE.match(line) or _LITE_LINE.match(line)
        severity = _SEVERITY[match.group(1)[:1]] if match else None
        if severity is not None and _NO_GPU.search(line):
            severity = min(severity, 1)  # logged as an error, but only says this machine has no GPU
        if severity is not None and severity < threshold:
            continue
        kept.append(line)
    return b"".join(kept)


_capture_lock = threading.Lock()


@contextlib.contextmanager
def _filtered_stderr():
    """Catch what is written to fd 2 meanwhile; pass on what the level keeps (all of it on error)."""
    threshold = _cpp_threshold()
    # fd 2 is process-wide: a second window opened meanwhile (another thread) would save the
    # first one's file as "stderr" and restore it, so only one window is open at a time.
    if not _capture_lock.acquire(blocking=False):
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        _capture_lock.release()
        yield  # no usable fd 2 (embedded interpreter): nothing to filter
        return
    failed = True
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
            failed = False
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            _capture_lock.release()
            capture.seek(0)
            shown = capture.read() if failed else filter_import_noise(capture.read(), threshold)
            if shown:
                os.write(2, shown)


def _find_devices(tf) -> None:
    """Look for GPUs now, inside the filtered window: on a machine without one, the first
    device lookup logs "failed call to cuInit" as an error, whichever command makes it."""
    try:
        tf.config.list_physical_devices()  # physical only: thread and logical-device settings stay open
    except Exception:  # a broken device set-up surfaces later, where the command uses devices
        pass


def _quiet_tensorflow(exec_module):
    """The first ``import tensorflow`` (and a device lookup) with its start-up lines filtered."""

    def run(module) -> None:
        with _filtered_stderr():
            exec_module(module)
            _find_devices(module)
        for hook in _after_tensorflow:
            hook()

    return run


def _quiet_litert(exec_module):
    """LiteRT logs "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." once per process, when
    the first interpreter allocates its tensors: that first allocation runs with stderr filtered."""

    def run(module) -> None:
        exec_module(module)
        targets = [(module.Interpreter, "allocate_tensors"), (module.Interpreter, "invoke"),
                   (module.SignatureRunner, "__call__")]
        originals = {(cls, name): getattr(cls, name) for cls, name in targets if hasattr(cls, name)}

        done = threading.Event()
        # Held by the first call for as long as it runs: another thread's first call (a config file's
        # versions load side by side) waits for it, rather than allocating, and logging, before fd 2 is
        # caught. Re-entrant: a LiteRT method may call another wrapped one.
        first = threading.RLock()

        def first_call(original):
            def call(self, *args, **kwargs):
                if done.is_set():  # a bound method taken before the first call still lands here
                    return original(self, *args, **kwargs)
                with first:
                    if not done.is_set():
                        try:
                            with _filtered_stderr():
                                return original(self, *args, **kwargs)
                        finally:
                            done.set()
                            for (cls, name), method in originals.items():
                                setattr(cls, name, method)  # later lookups go straight to LiteRT
                return original(self, *args, **kwargs)
            return call

        for (cls, name), method in originals.items():
            setattr(cls, name, first_call(method))

    return run


# Modules whose first import is wrapped, and how.
_WRAPPERS = {"tensorflow": _quiet_tensorflow, "ai_edge_litert.interpreter": _quiet_litert}


class _QuietImports:
    """A meta path finder that wraps the loading of each module in _WRAPPERS, once."""

    def find_spec(self, name, path=None, target=None):
        wrap = _WRAPPERS.get(name)
        if wrap is None or name in _wrapped:
            return None
        _wrapped.add(name)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(name, path, target) if find else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader.exec_module = wrap(spec.loader.exec_module)
                return spec
        return None


_wrapped: set[str] = set()


_after_tensorflow: list = []  # callables run once TensorFlow is imported (install's argument)


def install(after_tensorflow=None) -> None:
    """Wrap the first import of each module in _WRAPPERS that is not imported yet; call
    ``after_tensorflow()`` once TensorFlow is in (to set its Python loggers)."""
    if after_tensorflow is not None and after_tensorflow not in _after_tensorflow:
        _after_tensorflow.append(after_tensorflow)
    _wrapped.update(name for name in _WRAPPERS if name in sys.modules)  # too late for those
    if not any(isinstance(f, _QuietImports) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietImports())
