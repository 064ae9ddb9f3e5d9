"""Training loops of modelyard's own, for what Keras' fit cannot do: the model's stages on
devices (``model_parallel``, training/pipeline.py) and parameter-server training driven by
modelyard's coordinator (``backup_workers``, ``staleness``, training/ps_training.py).

Each writes ``metrics.json`` after every epoch, prints one line per epoch, and exports the
model at the end, as the trainer's Keras path does.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

from modelyard.training import data as data_mod
from modelyard.training import strategy as strategy_mod
from modelyard.training.config import ConfigError, TrainConfig, check_coordinated
from modelyard.training.progress import write_json
from modelyard.training.job import Role, build_model, count_steps, dataset_fns, export, placement


def _finish(cfg: TrainConfig, module: ModuleType, model, role: Role, info: dict[str, Any],
            epochs: list[dict[str, Any]]) -> dict[str, Any]:
    """Export when asked, write the final metrics.json, return what it holds."""
    summary: dict[str, Any] = {"completed": True, "epochs_completed": len(epochs)}
    if cfg.export_to:
        version = export(cfg, module, model)
        summary["exported"] = str(version)
        print(f"{role.name}: exported {version}", flush=True)
    write_json(cfg.job_dir / "metrics.json", {**info, **summary, "epochs": epochs})
    return info | summary | {"epochs": epochs}


def run_model_parallel(cfg: TrainConfig, module: ModuleType, role: Role) -> dict[str, Any]:
    """``model_parallel``: the model's stages on their devices, GPipe or PipeDream's 1F1B over micro-batches
    (training/pipeline.py)."""
    from modelyard.training import pipeline

    options = cfg.model_parallel
    model = build_model(module)
    train_fn, val_fn = dataset_fns(cfg, module)
    steps = count_steps(cfg, module, "train", cfg.steps_per_epoch)
    if not steps:
        raise ConfigError("model_parallel needs steps_per_epoch with a make_dataset() of unknown length")
    val_steps = count_steps(cfg, module, "validation", cfg.validation_steps) if val_fn else None
    cfg.job_dir.mkdir(parents=True, exist_ok=True)
    (cfg.job_dir / "config.resolved.json").write_text(json.dumps(cfg.raw, indent=2))
    info: dict[str, Any] = {
        "task": role.name, "strategy": "model_parallel", "stages": len(options["devices"]),
        "devices": options["devices"], "micro_batches": options["micro_batches"],
        "schedule": options["schedule"], "weight_stashing": options["weight_stashing"],
        "global_batch_size": cfg.global_batch_size, "epochs_planned": cfg.epochs,
    }
    epochs: list[dict[str, Any]] = []
    validation = val_fn(None) if val_fn and val_steps else None

    def on_epoch(record: dict[str, Any]) -> None:
        if validation is not None:
            values = model.evaluate(validation, steps=val_steps, verbose=0, return_dict=True)
            record.update({f"val_{k}": float(v) for k, v in values.items()})
        epochs.append(record)
        write_json(cfg.job_dir / "metrics.json", {**info, "epochs": epochs})
        if cfg.verbose:
            shown = "  ".join(f"{k} {record[k]:.4f}" for k in ("loss", "accuracy", "val_loss", "val_accuracy")
                              if k in record)
            per_stage = f"  inputs held per stage {record['stashed_inputs_peak']}"
            if "staleness_mean" in record:
                per_stage += (f"  weight versions per stage {record['weight_versions_peak']}  staleness per stage "
                              f"mean {[round(t, 2) for t in record['staleness_mean']]} max {record['staleness_max']}")
            print(f"epoch {record['epoch']}/{cfg.epochs}  {steps} steps  {shown}  {record['samples_per_sec']:.0f} "
                  f"samples/s  bubble {record['bubble']:.2f} (GPipe theory {record['bubble_theoretical']:.2f})"
                  f"{per_stage}", flush=True)

    stashing = {"1f1b": f", weight stashing {'on' if options['weight_stashing'] else 'off'}"}.get(options["schedule"], "")
    print(f"{role.name}: training {Path(cfg.model).name} in {len(options['devices'])} stages on "
          f"{', '.join(options['devices'])}, {options['micro_batches']} micro-batch(es) per batch of "
          f"{cfg.global_batch_size}, schedule {options['schedule']}{stashing}", flush=True)
    runner = pipeline.Pipeline(model, options["stages"], options["devices"], options["micro_batches"],
                               schedule=options["schedule"], weight_stashing=options["weight_stashing"])
    pipeline.fit(runner, train_fn(None), cfg.epochs, steps, on_epoch=on_epoch)
    info["stage_devices"] = [stage.output_device for stage in runner.stages]
    return _finish(cfg, module, model, role, info, epochs)


def run_coordinated(cfg: TrainConfig, module: ModuleType, role: Role) -> dict[str, Any]:
    """Parameter-server training in modelyard's loop: backup workers, or asynchronous with
    staleness control (training/ps_training.py)."""
    import numpy as np
    import tensorflow as tf

    from modelyard.training import ps_training

    workers = len(role.cluster.get("worker", []))
    staleness = cfg.strategy.get("staleness")
    backup = cfg.strategy.get("backup_workers", 0)
    required = check_coordinated(cfg, workers)  # gradients averaged per update
    strategy = strategy_mod.make(cfg.strategy)
    with strategy.scope():
        model = build_model(module)
    per_worker = cfg.global_batch_size // required  # each step averages N gradients of this many examples
    user = getattr(module, "make_dataset", None)
    if callable(user) and not cfg.data:
        worker_fn = lambda ctx: user(ctx, "train")  # noqa: E731
    else:
        worker_fn = ps_training.distinct_per_worker(
            data_mod.builtin_dataset_fn(cfg.data, "train", per_worker, cfg.seed), workers)
    steps = count_steps(cfg, module, "train", cfg.steps_per_epoch)
    if not steps:
        raise ConfigError("backup_workers needs steps_per_epoch (its workers read an endless dataset)")
    _, val_fn = dataset_fns(cfg, module)
    val_steps = count_steps(cfg, module, "validation", cfg.validation_steps) if val_fn else None

    def evaluate() -> dict[str, float]:
        if not val_steps:
            return {}
        losses, correct, seen = [], 0, 0
        for x, y in val_fn(None).take(val_steps):
            y_pred = model(x, training=False)
            losses.append(float(tf.reduce_mean(keras_loss(y, y_pred))))
            if y_pred.shape[-1] > 1:
                correct += int(np.sum(np.argmax(y_pred, axis=-1) == np.reshape(y, -1)))
            seen += int(np.size(y))
        return {"val_loss": float(np.mean(losses)), "val_accuracy": correct / max(seen, 1)}

    import tf_keras as keras

    keras_loss = keras.losses.get(model.loss)
    source = ps_training.GradientSource(strategy, model, worker_fn)
    if staleness is not None:
        policy = ps_training.StalenessPolicy(staleness.get("drop_older_than"), staleness.get("scale", "none"),
                                             float(staleness.get("single_replica_epochs", 0)))
        trainer = ps_training.AsyncTrainer(source, model, workers, policy)
        mode = (f"asynchronously over {workers} workers (drop_older_than {policy.drop_older_than}, "
                f"scale {policy.scale}, single_replica_epochs {policy.single_replica_epochs:g})")
    else:
        trainer = ps_training.SyncTrainer(source, model, workers, backup)
        mode = (f"synchronously, {workers} workers of which {backup} backup: each step applies the first "
                f"{required} fresh gradients")
    cfg.job_dir.mkdir(parents=True, exist_ok=True)
    (cfg.job_dir / "config.resolved.json").write_text(json.dumps(cfg.raw, indent=2))
    info: dict[str, Any] = {"task": role.name, "strategy": "parameter_server", "workers": workers,
                            "mode": "asynchronous" if staleness is not None else "synchronous",
                            "backup_workers": backup, "gradients_per_step": required,
                            "global_batch_size": cfg.global_batch_size, "epochs_planned": cfg.epochs,
                            "variable_placement": placement(model)}
    epochs: list[dict[str, Any]] = []
    summaries = tf.summary.create_file_writer(str(cfg.job_dir / "tensorboard" / "train")) if cfg.tensorboard else None

    def on_epoch(record: dict[str, Any], stats) -> None:
        epochs.append(record)
        write_json(cfg.job_dir / "metrics.json", {**info, "epochs": epochs})
        if summaries is not None:
            with summaries.as_default(step=record["epoch"]):
                tf.summary.scalar("epoch_loss", record["loss"])
                if stats.staleness:  # the distribution of tau over the epoch's gradients
                    tf.summary.histogram("staleness", np.array(stats.staleness, np.float64))
            summaries.flush()
        if cfg.verbose:
            shown = "  ".join(f"{k} {record[k]:.4f}" for k in ("loss", "val_loss", "val_accuracy") if k in record)
            tau = f", staleness mean {record['staleness_mean']:.2f} max {record['staleness_max']}" \
                if "staleness_mean" in record else ""
            print(f"epoch {record['epoch']}/{cfg.epochs}  {steps} steps  {shown}  {record['steps_per_sec']:.1f} steps/s  "
                  f"gradients applied {record['applied']}, dropped {record['dropped']}{tau}", flush=True)

    print(f"{role.name}: training {Path(cfg.model).name} with parameter_server {mode}", flush=True)
    ps_training.fit(trainer, cfg.epochs, steps, evaluate, on_epoch)
    return _finish(cfg, module, model, role, info, epochs)
