"""Parameter-server training with two ps tasks: the big variables are split across both."""
from __future__ import annotations

import json
import sys

import pytest

from tests.training.conftest import run, write_config


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backup_workers", [None, 0], ids=["keras fit (asynchronous)", "modelyard's synchronous loop"])
def test_two_ps_tasks_hold_a_shard_each_and_training_reaches_90_percent(tmp_path, backup_workers):
    strategy = {"name": "parameter_server", "min_shard_bytes": 64 << 10}
    if backup_workers is not None:
        strategy["backup_workers"] = backup_workers
    config = write_config(tmp_path, "sharded", strategy=strategy, global_batch_size=64, epochs=4,
                          steps_per_epoch=30, validation_steps=5)
    result = run(["launch", "--workers", "2", "--ps", "2", "--", sys.executable, "-m", "modelyard", "train",
                  str(config)], timeout=200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "ps:0 | ps:0 serving" in result.stdout and "ps:1 | ps:1 serving" in result.stdout
    metrics = json.loads((tmp_path / "job-sharded" / "metrics.json").read_text())
    placement = metrics["variable_placement"]
    # The 784x100 kernel (306 KiB) is above min_shard_bytes: one part on each ps task.
    parts = {name: device for name, device in placement.items() if name.startswith("dense/kernel/part_")}
    assert len(parts) == 2, placement
    assert {device.split("/task:")[1][0] for device in parts.values()} == {"0", "1"}, placement
    assert all("/job:ps/" in device for device in placement.values()), placement
    assert metrics["epochs"][-1]["val_accuracy"] >= 0.90
