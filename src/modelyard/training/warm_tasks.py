"""Warm launched tasks: ``modelyard launch`` forks its tasks from one interpreter that has
imported TensorFlow, instead of starting a fresh Python per task that imports it again.

One fork server per launch (tuning.forkserver, tuning.warm.ForkServer) is started once the config
is checked (a bad one starts no process); the launcher waits for it (at most ``READY_WAIT_S``) and
then asks it to fork each task, and each restarted one (``--max-restarts``, a parameter-server
worker restarted in place). The child runs the command as ``python`` would (runpy), in its own
session and process group, with its task's variables (TF_CONFIG, MODELYARD_TASK, ...) set before
TensorFlow runs its first op. Its first line is the fork server's ``[modelyard] warm start: ...``.

A launcher that is itself a warm process (forked by the platform, the tuner or the test suite from
an interpreter that imported TensorFlow and ran no op) forks that server from itself
(``ForkServer.start``, ``fork_here``) instead of starting a fresh Python that imports TensorFlow again; only when
nothing differs: TensorFlow imported, no op run, one thread, the same start-up variables.

Its output reaches the launcher through a pipe as a cold task's does: the launcher makes the pipe
and the child opens the write end by ``/proc/<launcher pid>/fd/<n>`` (the server that forks it
cannot be handed a descriptor); the launcher keeps its own copy of that end until the child has
written its first line (or is gone), so the pipe ends when the task and everything it started end.
Its exit status comes from the server, which is its parent.

What can start warm: a Python script or module run by this interpreter (``python -m modelyard
...``; the ``modelyard`` command, when it is this interpreter's entry point, counts as that) that
imports TensorFlow, with no variable read at start-up or import differing from the server's
(forkserver.warm_blocker). Anything else, or a server that died or was not ready in time, starts
cold as before, and the launcher says why once per task.
"""
from __future__ import annotations

import os
import select
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from modelyard.tuning.forkserver import imports_tensorflow, is_warm_command

if TYPE_CHECKING:
    from modelyard.tuning.warm import WarmChild

READY_WAIT_S = 180.0  # the first import of TensorFlow on a loaded machine; cold tasks would pay it too


def _entry_point_of_this_python(path: str) -> bool:
    """``path`` is a console script run by this interpreter that calls modelyard's CLI."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode(errors="replace")
    except OSError:
        return False
    first = head.split("\n", 1)[0]
    if not first.startswith("#!"):
        return False
    interpreter = first[2:].strip().split()[0] if first[2:].strip() else ""
    return (os.path.realpath(interpreter) == os.path.realpath(sys.executable)
            and "from modelyard.cli import main" in head)


def warm_argv(command: list[str], env: dict[str, str]) -> list[str] | None:
    """``command`` as ``PYTHON -m module``/``PYTHON script.py`` with this interpreter, or None."""
    if command and os.sep not in command[0]:  # `python3 train.py`: the python3 that PATH names
        found = shutil.which(command[0], path=env.get("PATH"))
        if found and os.path.realpath(found) == os.path.realpath(sys.executable):
            command = [sys.executable, *command[1:]]
    if is_warm_command(command):
        return list(command)
    if command and Path(command[0]).name == "modelyard":
        found = shutil.which(command[0], path=env.get("PATH"))
        if found and _entry_point_of_this_python(found):
            return [sys.executable, "-m", "modelyard", *command[1:]]
    return None


def command_blocker(command: list[str], env: dict[str, str]) -> str | None:
    """Why ``command`` cannot start warm whatever its variables (None: it can)."""
    argv = warm_argv(command, env)
    if argv is None:
        return "its command is not a Python script or module run by this interpreter"
    if not imports_tensorflow(argv, Path.cwd()):
        return "its command does not import TensorFlow (nothing to gain)"
    return None


class _Output:
    """The read end of a warm task's output pipe, read as ``Popen(stdout=PIPE).stdout`` is. The
    launcher's write end stays open until the task has opened its own (it has written a line) or
    is gone: closed earlier, the task's open of ``/proc/<launcher>/fd/<n>`` would fail."""

    def __init__(self, read: int, write: int, pid: int) -> None:
        self._file = os.fdopen(read, "rb")
        self._write, self._pid = write, pid

    def _release(self) -> None:
        write, self._write = self._write, -1
        if write >= 0:
            os.close(write)

    def readline(self) -> bytes:
        while self._write >= 0:  # only the reading thread gets here
            ready, _, _ = select.select([self._file], [], [], 0.2)
            if ready:
                line = self._file.readline()
                self._release()
                return line
            try:
                os.kill(self._pid, 0)  # its parent, the server, reaps it at once: gone means ended
            except ProcessLookupError:
                self._release()
        return self._file.readline()

    def close(self) -> None:
        self._release()
        self._file.close()


class WarmTask:
    """A task forked by the server: the parts of ``subprocess.Popen`` the supervisor uses."""

    def __init__(self, child: WarmChild, stdout: _Output) -> None:
        self._child, self.stdout, self.pid = child, stdout, child.pid

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    def poll(self) -> int | None:
        return self._child.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        return self._child.wait(timeout)


class WarmTasks:
    """The launch's fork server, kept across restarts; ``spawn`` forks one task from it."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        """``env``: the server's, what every task's shares (the launcher's, with its task defaults)."""
        self.env = dict(env)
        self.argv = warm_argv(command, self.env)
        self.why: str | None = command_blocker(command, self.env)  # why tasks start cold (None: they need not)
        self.server = None  # a tuning.warm.ForkServer
        self._dir: Path | None = None
        self._keep_log = False
        self._seq = 0
        if self.why is None:
            # Here, not at the top: the tuner's modules take a second to import, which a launch that
            # starts cold (or prints TF_CONFIG) should not pay.
            from modelyard.tuning.warm import ForkServer

            self._dir = Path(tempfile.mkdtemp(prefix="modelyard-launch-"))
            self.log = self._dir / "forkserver.log"
            # modelyard's own modules take 0.1 s more: no preload
            self.server = ForkServer.start(self.env, self.log)

    def wait_ready(self, stop: threading.Event, timeout: float = READY_WAIT_S) -> None:
        """Wait for the server's import (or its death, the timeout, a stop request); sets ``why``."""
        server = self.server
        if server is None:
            return
        deadline = time.monotonic() + timeout
        while not server.ready:
            server.pump()
            if server.ready:
                break
            if server.broken or not server.alive():
                self.why = f"the warm interpreter died while importing TensorFlow (its log: {self.log})"
                self._keep_log = True
                return
            if time.monotonic() > deadline:
                self.why = f"the warm interpreter was not ready after {timeout:g} s"
                server.shutdown()  # its import would only slow the tasks' own
                return
            if stop.wait(0.1):
                return

    def spawn(self, env: dict[str, str]) -> tuple[WarmTask | None, str | None]:
        """The task forked with ``env``, or ``(None, why it starts cold)``."""
        server = self.server
        if self.why is not None or server is None:
            return None, self.why or "no warm interpreter"
        if not server.ready:
            return None, "the warm interpreter is not ready"
        why = server.refusal(env)
        if why is not None:
            return None, why
        read, write = os.pipe()
        self._seq += 1
        try:
            child = server.spawn(f"task-{self._seq}", self.argv, env, Path.cwd(),
                                 Path(f"/proc/{os.getpid()}/fd/{write}"), None, announce=True)
        except BaseException:
            os.close(read)
            os.close(write)
            raise
        if child is None:
            os.close(read)
            os.close(write)
            return None, "the warm interpreter did not fork it (it has stopped)"
        return WarmTask(child, _Output(read, write, child.pid)), None

    def close(self) -> None:
        """Stop the server (its tasks are stopped by then: the supervisor's stop); drop its log
        unless it died importing (then the message names it)."""
        if self.server is not None:
            self.server.shutdown()
            self.server = None
        if self._dir is not None and not self._keep_log:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
