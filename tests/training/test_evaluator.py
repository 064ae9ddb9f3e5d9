"""The side-car evaluator: `launch --evaluator` scores the checkpoints the workers write."""
from __future__ import annotations

import re

import pytest

from .conftest import MODELYARD, run, write_config

pytestmark = pytest.mark.timeout(240)


def test_evaluator_scores_the_final_checkpoint(tmp_path):
    config = write_config(tmp_path, "ev", strategy="multi_worker_mirrored", global_batch_size=64, epochs=2,
                          tensorboard=True)
    result = run(["launch", "--workers", "2", "--evaluator", "--", *MODELYARD, "train", str(config)])
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    # The workers' last validation and the evaluator's last score are the same numbers:
    # the evaluator scored the final checkpoint on the validation split.
    val_loss = re.findall(r"worker:0 \| epoch 2/2 .* val_loss (\d+\.\d+)", output)
    scores = re.findall(r"evaluator:0 \| .*loss: (\d+\.\d+) - accuracy", output)
    assert val_loss and scores, output[-3000:]
    assert abs(float(scores[-1]) - float(val_loss[-1])) <= 1e-3
    events = list((tmp_path / "job-ev" / "tensorboard" / "evaluator").rglob("events.out.tfevents.*"))
    assert events, "the evaluator wrote no TensorBoard events"
