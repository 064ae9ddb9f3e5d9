"""A forked child's handle: the part of ``subprocess.Popen`` (pid, poll, wait, signals) that callers of a
process this one forked itself use, so a forked process stands in wherever a ``Popen`` would.

``ForkedChild`` is the rule every such handle shares: wait by polling (a deadline raises Popen's
``TimeoutExpired``), and never signal a child once reaped, since its pid may by then be another
process's. ``ReapedChild`` is a child of this process, reaped here with ``waitpid``; a child whose status
arrives another way (the tuner's fork server reports it) subclasses ``ForkedChild`` with its own ``poll``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

# wait()'s polling step: from 1 ms (a child told to stop usually ends within a few), doubling up to
# 20 ms (a long wait costs a poll every 20 ms, not a busy loop).
_FIRST_STEP_S, _LAST_STEP_S = 0.001, 0.02


class ForkedChild:
    """The part of ``subprocess.Popen`` a forked process offers; ``poll`` is how its status arrives."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        step = _FIRST_STEP_S
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(step)
            step = min(step * 2, _LAST_STEP_S)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # once reaped, the pid may be another process's
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ReapedChild(ForkedChild):
    """A child of this process, reaped here (``waitpid``); ``stdout``: what the caller reads its output from."""

    def __init__(self, pid: int, stdout: Any = None) -> None:
        self.pid, self.stdout = pid, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored, a reaper thread): its status is lost, it is gone
                self.returncode = -signal.SIGKILL
                return self.returncode
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode
