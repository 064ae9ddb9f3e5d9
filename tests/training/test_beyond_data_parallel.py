"""Training past plain data parallelism (issue 18): gradient accumulation, bf16 gradients,
model and pipeline parallelism, and the config errors that stop impossible combinations.

Equality tests compare against training the same model on the same batches without the
option; everything runs through ``modelyard train`` / ``modelyard launch`` except the
accumulation check of the train step itself, which trains in this process.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from modelyard.training import config as config_mod
from tests.training.conftest import model_weights, run, write_config


def _train(tmp, name, **values):
    config = write_config(tmp, name, **values)
    result = run(["train", str(config)], timeout=200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((tmp / f"job-{name}" / "metrics.json").read_text()), result


def _losses(metrics) -> np.ndarray:
    return np.array([epoch["loss"] for epoch in metrics["epochs"]])


# -- gradient accumulation ------------------------------------------------------------------

def test_accumulated_micro_batches_make_the_large_batch_update():
    import tf_keras as keras

    from modelyard.training import demo, train_step

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (256, 28, 28)).astype("uint8")
    y = rng.integers(0, 10, 256)
    weights = {}
    for k in (1, 4):
        keras.utils.set_random_seed(7)
        model = demo.build_model(hidden=32)
        train_step.install(model, train_step.StepOptions(accumulate_steps=k))
        history = model.fit(x, y, batch_size=64, epochs=3, shuffle=False, verbose=0)
        weights[k] = (model.get_weights(), history.history["loss"])
    (big, big_loss), (accumulated, accumulated_loss) = weights[1], weights[4]
    for a, b in zip(big, accumulated):
        np.testing.assert_allclose(a, b, atol=2e-5)
    np.testing.assert_allclose(big_loss, accumulated_loss, rtol=1e-5)
    assert max(np.abs(a).max() for a in big) > 0


@pytest.mark.parametrize("named", [False, True], ids=["sqrt(L) blocks", "one named block"])
def test_recompute_gives_the_same_gradients_and_weights(named):
    import tensorflow as tf
    import tf_keras as keras

    from modelyard.training import demo, train_step

    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (128, 28, 28)).astype("uint8")
    y = rng.integers(0, 10, 128)
    results = {}
    for recomputing in (False, True):
        keras.utils.set_random_seed(11)
        model = demo.build_model(hidden=32)
        names = [layer.name for layer in model.layers]  # rescaling, flatten, dense, dense_1 (numbered in-process)
        mode = ((tuple(names[1:3]),) if named else True) if recomputing else False
        with tf.GradientTape() as tape:  # the gradients themselves, through the same forward pass the step uses
            loss = model.compute_loss(x, tf.constant(y), train_step._forward(model, tf.constant(x),
                                                                train_step._recomputed_layers(model, mode)))
        grads = tape.gradient(loss, model.trainable_variables)
        train_step.install(model, train_step.StepOptions(recompute=mode))
        model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        results[recomputing] = ([g.numpy() for g in grads], model.get_weights())
    (plain_grads, plain_weights), (rc_grads, rc_weights) = results[False], results[True]
    for a, b in zip(plain_grads + plain_weights, rc_grads + rc_weights):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert max(np.abs(g).max() for g in plain_grads) > 0


def test_recompute_naming_no_layer_of_the_model_is_refused():
    from modelyard.training import demo, train_step

    with pytest.raises(config_mod.ConfigError, match="recompute: no layer named nope; the model's layers are"):
        train_step.install(demo.build_model(hidden=8), train_step.StepOptions(recompute=("nope",)))


# Through `modelyard train` under every strategy, with bf16 gradients and accumulation equal
# to the whole batch under mirrored and multi-worker mirrored: tests/training/test_matrix.py.


# -- model and pipeline parallelism ---------------------------------------------------------

STAGES_COMMON = dict(global_batch_size=64, epochs=2, steps_per_epoch=10, seed=3)


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    """The reference both stage layouts are compared with, trained once: (metrics, export dir)."""
    tmp = tmp_path_factory.mktemp("one-device")
    single, _ = _train(tmp, "single", export_to=str(tmp / "single"), **STAGES_COMMON)
    return single, tmp / "single"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("micro_batches", [1, 4], ids=["model parallel", "pipeline of 4 micro-batches"])
def test_stages_on_two_devices_train_as_one_device(tmp_path, micro_batches, one_device):
    single, single_export = one_device
    stages = [["rescaling", "flatten", "dense"], ["dense_1"]]
    parallel, result = _train(tmp_path, "parallel", devices={"logical_cpus": 2}, export_to=str(tmp_path / "parallel"),
                              model_parallel={"stages": stages, "devices": ["CPU:0", "CPU:1"],
                                              "micro_batches": micro_batches}, **STAGES_COMMON)
    assert "in 2 stages on CPU:0, CPU:1" in result.stdout
    np.testing.assert_allclose(_losses(parallel), _losses(single), rtol=1e-4)
    one, other = model_weights(single_export / "0001"), model_weights(tmp_path / "parallel" / "0001")
    for name in one:
        assert np.max(np.abs(one[name] - other[name])) <= 1e-4, name
    # Where each stage's output tensor was: the stage really ran on its own device.
    assert [d.rsplit("/", 1)[-1] for d in parallel["stage_devices"]] == ["device:CPU:0", "device:CPU:1"]
    for epoch in parallel["epochs"]:
        assert 0.0 <= epoch["bubble"] < 1.0
        assert epoch["bubble_theoretical"] == pytest.approx(1 / (micro_batches + 1))


# -- configs refused before anything starts -------------------------------------------------

@pytest.mark.parametrize("values, message", [
    (dict(accumulate_steps=0), "accumulate_steps: must be an integer >= 1, got 0"),
    (dict(accumulate_steps=5, global_batch_size=64), "accumulate_steps 5 does not divide the per-replica batch 64"),
    (dict(gradient_dtype="bfloat16", strategy="one_device"),
     "gradient_dtype: bfloat16 compresses the gradients' all-reduce, and strategy one_device has none"),
    (dict(gradient_dtype="float8"), "gradient_dtype: 'float8' is not one of float32, bfloat16"),
    (dict(model_parallel={"stages": [["dense"], []]}), "model_parallel.stages[1] has no layers"),
    (dict(model_parallel={"stages": 1}), "model_parallel.stages: 1 stage(s); model parallelism needs at least 2"),
    (dict(model_parallel={"stages": 2, "devices": ["CPU:0"]}), "model_parallel.devices: give one device per stage (2)"),
    (dict(model_parallel={"stages": 2}, strategy="mirrored"), "it runs with the default strategy, not mirrored"),
    (dict(model_parallel={"stages": 2, "micro_batches": 5}), "micro_batches 5 must divide global_batch_size 64"),
    (dict(model_parallel={"stages": 2, "micro_batches": 4}, accumulate_steps=2), "use model_parallel.micro_batches"),
    (dict(model_parallel={"stages": 2, "schedule": "interleaved"}),
     "model_parallel.schedule: 'interleaved' is not one of gpipe, 1f1b, 1f1b-flush"),
    (dict(model_parallel={"stages": 2, "weight_stashing": False}),
     "model_parallel.weight_stashing: only schedule 1f1b updates weights between"),
    (dict(model_parallel={"stages": 2}, recompute=True), "the pipeline already recomputes"),
    (dict(recompute="yes"), "recompute: true (about sqrt(L) blocks of layers), false, or a list of blocks"),
])
def test_impossible_configs_are_refused_up_front(tmp_path, values, message):
    values.setdefault("global_batch_size", 64)
    with pytest.raises(config_mod.ConfigError) as info:
        config_mod.load(write_config(tmp_path, "bad", **values))
    assert message in str(info.value)


def test_a_stage_naming_no_layer_of_the_model_is_refused(tmp_path):
    config = write_config(tmp_path, "names", model_parallel={"stages": [["dense"], ["nope"]]}, devices={"logical_cpus": 2},
                          global_batch_size=64, epochs=1, steps_per_epoch=2)
    result = run(["train", str(config)], timeout=120)
    assert result.returncode != 0
    assert "model_parallel.stages: no layer named nope; the model's layers are rescaling, flatten, dense, dense_1" \
        in result.stderr, result.stderr[-2000:]
