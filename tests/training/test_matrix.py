"""Every training option with every strategy (issue 28): each cell trains (and the loss goes
down) or is refused up front with a one-line error saying what to change; a traceback fails.

Cheap by design: the single-process strategies' cells all run in ONE process
(tests/training/matrix_runner.py, 2 logical CPUs), the multi-worker cells in ONE
``modelyard launch --workers 2``; the demo model, a few steps each. Accumulation is also
checked against the whole batch's update under mirrored and multi-worker mirrored: same
losses and same weights (the epoch checkpoints every cell writes).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from modelyard.training import config as config_mod
from tests.training.conftest import run, write_config

RUNNER = str(Path(__file__).with_name("matrix_runner.py"))
TWO_CPUS = {"logical_cpus": 2}

OPTIONS = {
    "plain": {},
    "accumulate": {"accumulate_steps": 2},
    "recompute": {"recompute": True},
    "accumulate+recompute": {"accumulate_steps": 2, "recompute": True},
    "bf16": {"gradient_dtype": "bfloat16"},
    "bf16+accumulate": {"gradient_dtype": "bfloat16", "accumulate_steps": 2},
}
# One process for all of them: every cell splits the CPU in two the same way (TensorFlow
# fixes its devices once per process).
IN_PROCESS = {
    "default": {"devices": TWO_CPUS},
    "one_device": {"strategy": {"name": "one_device", "device": "CPU:0"}, "devices": TWO_CPUS},
    "mirrored": {"strategy": {"name": "mirrored", "devices": ["CPU:0", "CPU:1"]}, "devices": TWO_CPUS},
    "central_storage": {"strategy": {"name": "central_storage", "compute_devices": ["CPU:0", "CPU:1"],
                                     "parameter_device": "CPU:0"}, "devices": TWO_CPUS},
}
# bfloat16 compresses an all-reduce between replicas: the strategies without one refuse it.
BF16_REFUSED = "gradient_dtype: bfloat16 compresses the gradients' all-reduce, and strategy {} has none; " \
               "use it with mirrored or multi_worker_mirrored, or drop it"
# The cells each strategy trains. Each option alone where it changes what crosses between
# replicas (mirrored, multi-worker); elsewhere the combined cell, which runs every code path
# of both options (the options alone are tested one layer down, in test_beyond_data_parallel).
# Refusals cost nothing (the config is refused before TensorFlow starts), so every one is listed.
CELLS = {
    "default": ["accumulate+recompute", "bf16", "bf16+accumulate"],
    "one_device": ["accumulate+recompute", "bf16", "bf16+accumulate"],
    "mirrored": ["plain", "accumulate", "recompute", "accumulate+recompute", "bf16", "bf16+accumulate"],
    "central_storage": ["accumulate", "accumulate+recompute", "bf16", "bf16+accumulate"],
    "multi_worker_mirrored": ["plain", "accumulate", "accumulate+recompute", "bf16", "bf16+accumulate"],
    # The dearest cluster (a chief, 2 workers, a ps): its short version, one cell that trains.
    "parameter_server": ["accumulate+recompute", "bf16"],
}
EXPORTED = {("mirrored", "accumulate+recompute"), ("multi_worker_mirrored", "accumulate+recompute")}
COMMON = dict(global_batch_size=64, epochs=2, steps_per_epoch=4, validation_steps=1, seed=3, tensorboard=True,
              verbose=False)


def _expected(strategy: str, option: str) -> str | None:
    """None: trains; else the refusal's message."""
    if "bf16" in option and strategy not in config_mod.ALL_REDUCE_STRATEGIES:
        return BF16_REFUSED.format(strategy)
    return None


def _write_cells(tmp: Path, strategies: dict, **extra) -> dict[tuple[str, str], Path]:
    cells = {}
    for strategy, strategy_values in strategies.items():
        for option in CELLS[strategy]:
            name = f"{strategy}-{option}".replace("+", "_")
            values = {**COMMON, **strategy_values, **OPTIONS[option], **extra}
            if (strategy, option) in EXPORTED:  # export works from a plain copy: one cell per process shows it
                values["export_to"] = str(tmp / f"models-{name}")
            cells[(strategy, option)] = write_config(tmp, name, **values)
    return cells


def _results(stdout: str, prefix: str = "") -> dict[str, dict]:
    found = {}
    for line in stdout.splitlines():
        if line.startswith(prefix + "MATRIX "):
            record = json.loads(line[len(prefix + "MATRIX "):])
            found[record["cell"]] = record
    return found


def _checkpoint(job_dir: Path, epoch: int) -> dict[str, np.ndarray]:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(job_dir / "checkpoints" / f"ckpt-{epoch:04d}"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.startswith("layer_with_weights-")}


def _check_cells(tmp: Path, cells: dict, results: dict[str, dict]) -> list[str]:
    """Every cell as expected; returns the table rows (for failure messages)."""
    problems = []
    for (strategy, option), path in cells.items():
        record = results.get(path.stem)
        expected = _expected(strategy, option)
        if record is None:
            problems.append(f"{strategy} x {option}: no result (the runner died before it)")
        elif record["outcome"] == "error":
            problems.append(f"{strategy} x {option}: broke mid-run:\n{record['message']}")
        elif expected is not None:
            if record["outcome"] != "refused" or record["message"] != expected or record["stage"] != "config":
                problems.append(f"{strategy} x {option}: expected refusal {expected!r}, got {record}")
        elif record["outcome"] != "trained":
            problems.append(f"{strategy} x {option}: expected to train, got {record}")
        else:
            losses = record["losses"]
            job_dir = tmp / f"job-{path.stem}"
            if not (len(losses) == COMMON["epochs"] and losses[-1] < losses[0]):
                problems.append(f"{strategy} x {option}: the loss did not go down: {losses}")
            if not (job_dir / "checkpoints" / "ckpt-0002.index").exists():
                problems.append(f"{strategy} x {option}: no epoch checkpoint")
            if not any((job_dir / "tensorboard" / "train").glob("events.out.tfevents.*")):
                problems.append(f"{strategy} x {option}: no TensorBoard events")
            epochs = json.loads((job_dir / "metrics.json").read_text())["epochs"]
            if not all("val_accuracy" in epoch for epoch in epochs):
                problems.append(f"{strategy} x {option}: metrics.json has no validation metrics: {epochs}")
            if (strategy, option) in EXPORTED and not record["exported"]:
                problems.append(f"{strategy} x {option}: not exported")
    return problems


def _assert_same_training(tmp: Path, cells: dict, strategy: str, option: str, worker_file: str = "metrics.json") -> None:
    """The option's cell trained exactly as the plain one (accumulation: the whole batch's update)."""
    plain, other = cells[(strategy, "plain")].stem, cells[(strategy, option)].stem
    losses = [[e["loss"] for e in json.loads((tmp / f"job-{name}" / worker_file).read_text())["epochs"]]
              for name in (plain, other)]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, err_msg=f"{strategy} x {option} losses")
    one, two = _checkpoint(tmp / f"job-{plain}", 2), _checkpoint(tmp / f"job-{other}", 2)
    assert one.keys() == two.keys() and len(one) == 4
    for name in one:
        np.testing.assert_allclose(two[name], one[name], atol=1e-5, err_msg=f"{strategy} x {option}: {name}")
    assert max(np.abs(v).max() for v in one.values()) > 0


@pytest.mark.timeout(600)
def test_every_option_with_every_single_process_strategy(tmp_path):
    cells = _write_cells(tmp_path, IN_PROCESS)
    result = _run_runner(list(cells.values()))
    results = _results(result.stdout)
    problems = _check_cells(tmp_path, cells, results)
    assert not problems, "\n".join(problems) + "\n" + result.stderr[-3000:]
    assert results[cells[("mirrored", "accumulate")].stem]["replicas"] == 2
    assert results[cells[("central_storage", "accumulate")].stem]["replicas"] == 2
    _assert_same_training(tmp_path, cells, "mirrored", "accumulate")
    _assert_same_training(tmp_path, cells, "mirrored", "accumulate+recompute")


def _run_runner(paths: list[Path]):
    from tests.training.conftest import ENV
    from tests.warm_process import run_python

    return run_python([sys.executable, RUNNER, *map(str, paths)], ENV, timeout=540)


@pytest.mark.timeout(600)
def test_every_option_with_multi_worker_mirrored_on_two_workers(tmp_path):
    cells = _write_cells(tmp_path, {"multi_worker_mirrored": {"strategy": "multi_worker_mirrored"}})
    result = run(["launch", "--workers", "2", "--", sys.executable, RUNNER, *map(str, cells.values())], timeout=540)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    results = _results(result.stdout, "worker:0 | ")
    problems = _check_cells(tmp_path, cells, results)
    assert not problems, "\n".join(problems) + "\n" + result.stdout[-3000:]
    peer = _results(result.stdout, "worker:1 | ")
    for (strategy, option), path in cells.items():  # both workers applied the same updates
        assert peer[path.stem]["losses"] == results[path.stem]["losses"], option
    assert results[cells[("multi_worker_mirrored", "accumulate")].stem]["replicas"] == 2
    _assert_same_training(tmp_path, cells, "multi_worker_mirrored", "accumulate")
    _assert_same_training(tmp_path, cells, "multi_worker_mirrored", "accumulate+recompute")
    # bf16 gradients: half the all-reduce's bytes, and bfloat16's 8 bits of mantissa keep
    # the losses within 2 % of float32 training (they do differ: the cast really happened).
    full, half = (json.loads((tmp_path / f"job-{cells[('multi_worker_mirrored', o)].stem}" / "metrics.json").read_text())
                  for o in ("plain", "bf16"))
    np.testing.assert_allclose(_losses(half), _losses(full), rtol=2e-2)
    assert not np.array_equal(_losses(half), _losses(full))
    assert half["gradient_dtype"] == "bfloat16"
    assert half["allreduce_bytes_per_step"] * 2 == full["allreduce_bytes_per_step"] == 4 * (784 * 100 + 100 + 1010)


def _losses(metrics: dict) -> np.ndarray:
    return np.array([epoch["loss"] for epoch in metrics["epochs"]])


@pytest.mark.timeout(400)
def test_accumulation_and_recompute_with_parameter_servers(tmp_path):
    cells = _write_cells(tmp_path, {"parameter_server": {"strategy": "parameter_server"}})
    result = run(["launch", "--workers", "2", "--ps", "1", "--", sys.executable, RUNNER, *map(str, cells.values())],
                 timeout=360)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    problems = _check_cells(tmp_path, cells, _results(result.stdout, "chief:0 | "))
    assert not problems, "\n".join(problems) + "\n" + result.stdout[-3000:]


# The strategies whose every cell would need a cluster of its own (parameter_server: a chief,
# workers and ps) or that place the model themselves (model_parallel), at the config level: which options each
# takes is decided there, before any process starts.
CONFIG_ONLY = {
    "parameter_server": ({"strategy": "parameter_server"}, {}),
    "parameter_server+backup_workers": ({"strategy": {"name": "parameter_server", "backup_workers": 1}}, {
        "accumulate": "accumulate_steps with strategy.backup_workers: modelyard's parameter-server coordinator",
        "recompute": "recompute with strategy.backup_workers: modelyard's parameter-server coordinator",
        "accumulate+recompute": "accumulate_steps and recompute with strategy.backup_workers"}),
    "parameter_server+staleness": ({"strategy": {"name": "parameter_server", "staleness": {"drop_older_than": 2}}}, {
        "accumulate": "accumulate_steps with strategy.staleness: modelyard's parameter-server coordinator",
        "recompute": "recompute with strategy.staleness: modelyard's parameter-server coordinator",
        "accumulate+recompute": "accumulate_steps and recompute with strategy.staleness"}),
    "model_parallel": ({"model_parallel": {"stages": 2, "micro_batches": 4}}, {
        "accumulate": "use model_parallel.micro_batches instead",
        "recompute": "the pipeline already recomputes each stage's forward pass in its backward pass; drop recompute",
        "accumulate+recompute": "the pipeline already recomputes"}),
}


@pytest.mark.parametrize("strategy", list(CONFIG_ONLY))
@pytest.mark.parametrize("option", list(OPTIONS))
def test_every_option_with_the_cluster_strategies_is_taken_or_refused_up_front(tmp_path, strategy, option):
    values, refusals = CONFIG_ONLY[strategy]
    config = write_config(tmp_path, "cell", **{**COMMON, **values, **OPTIONS[option]})
    expected = refusals.get(option)
    if "bf16" in option:  # no all-reduce in either: the parameter servers apply each gradient
        expected = BF16_REFUSED.format("default" if strategy == "model_parallel" else "parameter_server")
    if expected is None:
        config_mod.load(config)
        return
    with pytest.raises(config_mod.ConfigError) as info:
        config_mod.load(config)
    assert expected in str(info.value)
    assert "\n" not in str(info.value)  # one line
