"""Helpers for training tests: run modelyard in subprocesses, always cleaned up."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from tests.warm_process import popen_python, run_python

ENV = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
MODELYARD = [sys.executable, "-m", "modelyard"]


def write_config(directory: Path, name: str, **values) -> Path:
    values.setdefault("model", "demo")
    values.setdefault("job_dir", str(directory / f"job-{name}"))
    values.setdefault("tensorboard", False)
    values.setdefault("input_report", False)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def run(args: list[str], timeout: float = 240, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m modelyard ARGS`` in its own process group, forked warm (tests/warm_process.py);
    stop it (and a launcher's tasks) whatever happens."""
    return run_python(MODELYARD + args, ENV, timeout, cwd=cwd, stop=stop_launcher)


class Launched:
    """``python -m modelyard ARGS`` started as ``run`` starts it (forked warm: a launcher forked so
    forks its tasks' warm interpreter from itself, training.warm_tasks), its output (stdout and
    stderr together, as ``Popen(stdout=PIPE, stderr=STDOUT)`` gives) read line by line as written;
    ``lines``: every line read so far, without its newline."""

    def __init__(self, args: list[str], log: Path):
        self.log = log
        self.log.touch()
        self.proc = popen_python(MODELYARD + args, ENV, self.log)
        self._file = open(self.log, "rb")
        self._partial = b""
        self.lines: list[str] = []

    def next_line(self, timeout: float) -> str | None:
        """The next whole line; None at the end of the output, or if none came within ``timeout``."""
        line = self._read_line(timeout)
        if line is not None:
            self.lines.append(line.rstrip("\n"))
        return line

    def _read_line(self, timeout: float) -> str | None:
        deadline, ended = time.monotonic() + timeout, False
        while True:
            chunk = self._file.readline()
            self._partial += chunk
            if self._partial.endswith(b"\n"):
                line, self._partial = self._partial, b""
                return line.decode(errors="replace")
            if chunk:
                continue  # half a line so far
            if ended:  # all it wrote is read
                line, self._partial = self._partial, b""
                return line.decode(errors="replace") or None
            if self.proc.poll() is not None:
                ended = True  # read to the end once more: nothing is written after this
                continue
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)  # a file has no readiness to wait on: poll it, briefly

    def __iter__(self):
        """Every line until the output ends (a launch's own timeouts bound it; pytest-timeout too)."""
        while (line := self.next_line(3600)) is not None:
            yield line

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        """The first line so far or to come (within ``timeout``) that matches ``pattern``."""
        deadline = time.monotonic() + timeout
        for line in self.lines:
            if (found := re.search(pattern, line)):
                return found
        while (line := self.next_line(max(0.0, deadline - time.monotonic()))) is not None:
            if (found := re.search(pattern, line)):
                return found
        raise AssertionError(f"no line matching {pattern!r} within {timeout}s:\n" + "\n".join(self.lines[-40:]))

    def all_lines(self, timeout: float) -> list[str]:
        """Every line, once the output has ended (within ``timeout``)."""
        deadline = time.monotonic() + timeout
        while not self._file.closed and self.next_line(max(0.0, deadline - time.monotonic())) is not None:
            pass
        return self.lines

    def stop(self) -> None:
        """Stop the launch and its tasks, then read what they wrote last."""
        stop_launcher(self.proc)
        self.all_lines(10)
        self._file.close()


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def stop_launcher(proc: subprocess.Popen, timeout: float = 20) -> None:
    """Stop a ``modelyard launch`` the way Ctrl-C does, so it stops its tasks (each in its own
    session, out of reach of ``kill_group``); SIGKILL its group if it does not exit in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc)


def model_weights(version_dir: Path) -> dict[str, "object"]:
    """Variables of an exported SavedModel, read from its checkpoint (no graph loaded)."""
    import modelyard  # noqa: F401  (TF env before TF)
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(version_dir / "variables" / "variables"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.startswith("layer_with_weights-")}


SLOW_MODEL = textwrap.dedent('''
    """Digits MLP whose epochs take a few seconds, so a test can kill a task mid-training."""
    from modelyard.training.demo import build_model  # noqa: F401
''')


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    return tmp_path
