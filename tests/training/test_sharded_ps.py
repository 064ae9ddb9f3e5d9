"""Parameter-server training with two ps tasks: the big variables are split across both.

Under keras fit (asynchronous) it is shown by test_strategies.test_parameter_server_reaches_90_percent,
whose cluster has two ps tasks and which checks the shards with ``assert_split_across_two_ps``; here,
under modelyard's synchronous loop (``backup_workers: 0``), which builds its variables itself.
"""
from __future__ import annotations

import json
import sys

import pytest

from tests.training.conftest import run, write_config

SHARDED = {"name": "parameter_server", "min_shard_bytes": 64 << 10}
# Validation accuracy passes 0.9 from the second epoch on (0.93-0.94 in both loops): three leave a margin.
EPOCHS = dict(global_batch_size=64, epochs=3, steps_per_epoch=30, validation_steps=5)


def assert_split_across_two_ps(stdout: str, metrics: dict) -> None:
    """Both ps tasks served, and the 784x100 kernel (306 KiB, above min_shard_bytes) has one part on each."""
    assert "ps:0 | ps:0 serving" in stdout and "ps:1 | ps:1 serving" in stdout
    placement = metrics["variable_placement"]
    parts = {name: device for name, device in placement.items() if name.startswith("dense/kernel/part_")}
    assert len(parts) == 2, placement
    assert {device.split("/task:")[1][0] for device in parts.values()} == {"0", "1"}, placement
    assert all("/job:ps/" in device for device in placement.values()), placement


@pytest.mark.timeout(240)
def test_two_ps_tasks_hold_a_shard_each_and_the_synchronous_loop_reaches_90_percent(tmp_path):
    config = write_config(tmp_path, "sharded", strategy={**SHARDED, "backup_workers": 0}, **EPOCHS)
    result = run(["launch", "--workers", "2", "--ps", "2", "--", sys.executable, "-m", "modelyard", "train",
                  str(config)], timeout=200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    metrics = json.loads((tmp_path / "job-sharded" / "metrics.json").read_text())
    assert_split_across_two_ps(result.stdout, metrics)
    assert metrics["epochs"][-1]["val_accuracy"] >= 0.90
