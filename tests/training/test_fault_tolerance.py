"""Must-show 4: a worker killed mid-training; with restarts the job resumes, without it fails fast."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from .conftest import ENV, MODELYARD, kill_group, write_config

COLLECTIVE_TIMEOUT = 600  # far longer than the test may run: only the supervisor can end it in time


def _launch(config, *extra):
    cmd = MODELYARD + ["launch", "--workers", "2", *extra, "--", sys.executable, "-m", "modelyard", "train", str(config)]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _kill_after(proc, task, epoch_line, lines):
    """Read output until ``task`` prints ``epoch_line``, then SIGKILL that task's process."""
    pids = {}
    for line in proc.stdout:
        lines.append(line)
        found = re.match(r"(\S+) \| \[modelyard\] started pid (\d+)", line)
        if found:
            pids[found.group(1)] = int(found.group(2))
        if line.startswith(f"{task} | {epoch_line}"):
            os.kill(pids[task], signal.SIGKILL)
            return time.monotonic()
    raise AssertionError("job ended before the kill point:\n" + "".join(lines[-40:]))


def _config(tmp, name):
    return write_config(tmp, name, strategy={"name": "multi_worker_mirrored", "collective_timeout": COLLECTIVE_TIMEOUT},
                        global_batch_size=64, epochs=4, steps_per_epoch=120, seed=1)


@pytest.mark.timeout(300)
def test_killed_worker_resumes_from_checkpoint_with_max_restarts(tmp):
    config = _config(tmp, "restart")
    proc = _launch(config, "--max-restarts", "1")
    lines: list[str] = []
    try:
        _kill_after(proc, "worker:1", "epoch 2/4", lines)
        lines += proc.stdout.readlines()
        assert proc.wait(timeout=240) == 0, "".join(lines[-40:])
    finally:
        kill_group(proc)
    out = "".join(lines)
    assert "task worker:1 exited with code -9 (killed by SIGKILL)" in out
    assert "restarting the job (restart 1 of 1)" in out
    assert "resuming from checkpoint" in out
    after_restart = out.split("restarting the job")[1]
    assert "worker:0 | epoch 3/4" in after_restart and "worker:0 | epoch 4/4" in after_restart
    assert "epoch 1/4" not in after_restart  # epochs 1-2 were not trained again
    metrics = json.loads((tmp / "job-restart" / "metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2, 3, 4]
    assert metrics["resumed"] is True and metrics["completed"] is True


@pytest.mark.timeout(240)
def test_killed_worker_without_restarts_fails_fast_naming_it(tmp):
    config = _config(tmp, "nofail")
    proc = _launch(config)
    lines: list[str] = []
    try:
        killed_at = _kill_after(proc, "worker:1", "epoch 1/4", lines)
        lines += proc.stdout.readlines()
        code = proc.wait(timeout=200)
        stopped_after = time.monotonic() - killed_at
    finally:
        kill_group(proc)
    out = "".join(lines)
    assert code == 1
    assert "task worker:1 exited with code -9 (killed by SIGKILL)" in out
    assert "rerun with --max-restarts" in out
    assert stopped_after < COLLECTIVE_TIMEOUT / 5  # the supervisor, not the collective timeout, ended it
