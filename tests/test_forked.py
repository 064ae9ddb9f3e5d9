"""The forked-child handle (modelyard.forked) as tf_gcs.start_process(fork=True) gives it: a child forked by
``tf_gcs._forked`` that runs this module's ``main``. Milliseconds each: no Python starts, no gateway runs."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from modelyard import tf_gcs

pytestmark = pytest.mark.e2e  # forks a child (the reading classifier does not follow modelyard's own code)


def main(args: list[str]) -> int:
    """The forked child's entry (``tf_gcs._forked`` calls ``MODULE.main(args)``): sleep, or exit with a status."""
    if args == ["sleep"]:
        time.sleep(60)
    return int(args[0])


def _fork(*args: str):
    return tf_gcs._forked(__name__, list(args), dict(os.environ), [])


def test_wait_gives_the_status_and_times_out_like_popen():
    assert _fork("3").wait(10) == 3
    child = _fork("sleep")
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(0.05)
    finally:
        child.terminate()
    assert child.wait(10) == -signal.SIGTERM
    child.kill()  # reaped: not signalled again (its pid may be another process's by now)


def test_a_child_reaped_elsewhere_is_gone_not_an_error():
    """A caller that ignores SIGCHLD or reaps all children (a reaper thread) takes the status first: the
    handle says the child is gone (-SIGKILL: its status is lost) instead of raising ChildProcessError."""
    child = _fork("0")
    os.waitpid(child.pid, 0)
    assert child.poll() == -signal.SIGKILL
    assert child.wait(1) == -signal.SIGKILL
    child.terminate()
