"""The trainer that runs inside every task: strategy, model, data, fit, checkpoints, export.

One entry point, ``run(cfg)``. The task's role comes from TF_CONFIG (set by
``modelyard launch``): parameter-server workers and ps tasks just serve, the
evaluator evaluates checkpoints, everyone else calls ``fit``. The chief (or worker 0
when there is no chief) writes ``metrics.json`` and exports the model.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from modelyard.training import devices as devices_mod
from modelyard.training import strategy as strategy_mod
from modelyard.training import uri_paths
from modelyard.training.config import ConfigError, TrainConfig, check_batch, uses_storage
from modelyard.training.job import (  # what the loops of training/loops.py share with this one
    Role, TrainError, build_model, count_steps, current_role, dataset_fns, export, load_user_module, placement,
)


def _serve_forever(role: Role, cfg: TrainConfig) -> int:
    """ParameterServerStrategy workers and ps tasks only host a server for the coordinator."""
    import tensorflow as tf

    from modelyard.training.ps_training import expose_task

    expose_task(role.type, role.index)  # what a worker's graph ops read to know which worker runs them
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=role.type, task_index=role.index,
        protocol=resolver.rpc_layer or "grpc", start=True,
    )
    print(f"{role.name} serving for the coordinator at {server.target}", flush=True)
    server.join()
    return 0


def _run_evaluator(cfg: TrainConfig, module: ModuleType) -> int:
    """Side-car evaluation: evaluate each checkpoint the chief writes, until the last epoch."""
    import tf_keras as keras

    model = build_model(module)
    _, val_fn = dataset_fns(cfg, module)
    steps = count_steps(cfg, module, "validation", cfg.validation_steps)
    keras.utils.SidecarEvaluator(
        model=model, data=val_fn(None), checkpoint_dir=str(cfg.job_dir / "checkpoints"),
        steps=steps, max_evaluations=cfg.epochs,
        callbacks=[keras.callbacks.TensorBoard(log_dir=str(cfg.job_dir / "tensorboard" / "evaluator"))],
    ).start()
    return 0


def _resumable(job_dir: Path | uri_paths.UriPath) -> bool:
    backup = job_dir / "backup"
    return backup.is_dir() and any(backup.iterdir())


def _input_report(train_fn: Callable, strategy, global_batch: int, train_rate: float, steps: int | None) -> dict[str, Any]:
    """Time the input pipeline alone and compare it with what training consumed."""
    import tensorflow as tf

    pipelines = strategy.extended._num_workers if hasattr(strategy.extended, "_num_workers") else 1
    context = tf.distribute.InputContext(pipelines, 0, strategy.num_replicas_in_sync)
    per_replica = context.get_per_replica_batch_size(global_batch)
    batches = min(steps or 50, 50)
    iterator = iter(train_fn(context))
    next(iterator)  # warm up (build the pipeline, fill buffers) outside the timing
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    rate = batches * per_replica * pipelines / max(time.perf_counter() - start, 1e-9)
    # The share of a training step's time that producing its input takes by itself. Without
    # overlap (no prefetch) that time adds to every step; with overlap a share near 1 means
    # the pipeline cannot keep up. Either way, from 40 % on a faster input pipeline pays off.
    share = train_rate / max(rate, 1e-9)
    bound = share >= 0.4
    detail = (f"the input pipeline alone gives {rate:.0f} samples/s, training ran at {train_rate:.0f}: "
              f"producing a step's input takes {min(share, 9.99):.0%} of a step's time")
    verdict = (
        f"input-bound: {detail}; parallelise the decode (num_parallel_calls), cache after it, prefetch "
        "(modelyard.training.data.pipeline does all three)"
        if bound else f"not input-bound: {detail}"
    )
    return {"input_samples_per_sec": rate, "train_samples_per_sec": train_rate, "input_share": share,
            "input_bound": bound, "verdict": verdict}


def _explain(exc: Exception, me: str = "") -> TrainError:
    import tensorflow as tf

    if isinstance(exc, (tf.errors.DeadlineExceededError, tf.errors.UnavailableError, tf.errors.CancelledError,
                        tf.errors.AbortedError)):
        import re

        # TF names the failed peer as /job:worker/replica:0/task:1 (or without the replica part).
        found = re.findall(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)", str(exc))
        peers = sorted({f"{job}:{index}" for job, index in found} - {me})
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        # TF's message opens with "Graph execution error:" and a stack; the cause is further down.
        cause = re.compile(r"reset|refused|unhealthy|heartbeat|unavailable|deadline|timed out|closed|unreachable|down", re.I)
        detail = next((line for line in lines[1:] if cause.search(line) and not line.startswith("File ")),
                      lines[0] if lines else "")
        who = f"peer task {', '.join(peers)} is" if peers else "a peer task is"
        return TrainError(
            f"{who} gone or not responding ({type(exc).__name__}: {detail[:200]}); "
            "check the other tasks' output, then rerun (`modelyard launch --max-restarts K` restarts from the last checkpoint)"
        )
    return TrainError(f"training failed: {type(exc).__name__}: {exc}")


def run(cfg: TrainConfig) -> dict[str, Any]:
    """Train as this process's role demands; returns the metrics written (empty for servers)."""
    role = current_role()
    name = cfg.strategy_name
    if role.cluster and name not in ("multi_worker_mirrored", "parameter_server") and role.num_workers > 1:
        raise ConfigError(f"strategy {name} runs in one process; for a cluster use multi_worker_mirrored or parameter_server")
    if name == "multi_worker_mirrored" and not role.cluster:
        # Without a cluster TensorFlow would quietly train one replica: say so instead.
        raise ConfigError(
            "strategy multi_worker_mirrored needs a cluster and this process has none (no TF_CONFIG): "
            "run it under modelyard launch --workers N -- modelyard train CONFIG, or set TF_CONFIG on each "
            "host (modelyard launch --print-tf-config shows it); on one process use mirrored"
        )
    if name == "parameter_server" and not role.cluster.get("ps"):
        raise ConfigError(
            "strategy parameter_server needs ps tasks and this process has none (no TF_CONFIG, or one without "
            "ps tasks): run it under "
            "modelyard launch --workers N --ps M -- modelyard train CONFIG, or set TF_CONFIG with ps tasks"
        )
    if uses_storage(cfg):  # before TensorFlow's first gs:// call
        uri_paths.route()
    import tensorflow as tf  # after the checks above, so a wrong set-up fails at once
    import tf_keras as keras

    check_batch(cfg, workers=role.num_workers)
    module = load_user_module(cfg.model)
    devices_mod.configure(cfg.devices)
    if name == "parameter_server" and role.type in ("worker", "ps"):
        return {"served": _serve_forever(role, cfg)}
    if role.type == "evaluator":
        _run_evaluator(cfg, module)
        return {}
    if cfg.seed is not None:
        keras.utils.set_random_seed(cfg.seed)
    if cfg.deterministic:
        tf.config.experimental.enable_op_determinism()
    if cfg.model_parallel:
        from modelyard.training import loops

        return loops.run_model_parallel(cfg, module, role)
    if name == "parameter_server" and ("backup_workers" in cfg.strategy or "staleness" in cfg.strategy):
        from modelyard.training import loops

        return loops.run_coordinated(cfg, module, role)

    strategy = strategy_mod.make(cfg.strategy)
    job_dir = cfg.job_dir
    job_dir.mkdir(parents=True, exist_ok=True)
    resumed = _resumable(job_dir)
    if role.is_chief:
        (job_dir / "config.resolved.json").write_text(json.dumps(cfg.raw, indent=2))

    with strategy.scope():
        model = build_model(module)
    from modelyard.training import train_step

    recompute = cfg.recompute
    if isinstance(recompute, list):
        recompute = tuple(tuple(b) if isinstance(b, list) else (b,) for b in recompute)
    step_options = train_step.StepOptions(cfg.accumulate_steps, cfg.gradient_dtype, recompute)
    train_step.install(model, step_options)
    train_fn, val_fn = dataset_fns(cfg, module)
    steps = count_steps(cfg, module, "train", cfg.steps_per_epoch)
    val_steps = count_steps(cfg, module, "validation", cfg.validation_steps) if val_fn else None
    if name == "parameter_server":
        if not steps:
            raise ConfigError("parameter_server needs steps_per_epoch (its workers read an endless dataset)")
        train = keras.utils.experimental.DatasetCreator(train_fn)
        validation = keras.utils.experimental.DatasetCreator(val_fn) if val_fn and val_steps else None
    else:
        train = strategy.distribute_datasets_from_function(train_fn)
        validation = strategy.distribute_datasets_from_function(val_fn) if val_fn and val_steps else None

    from modelyard.training.progress import EpochTimer, MetricsWriter, Progress, WarmupAndScaling

    timer = EpochTimer(cfg.global_batch_size)
    watchdog = None
    metrics_name = "metrics.json" if role.is_chief else f"metrics.{role.type}-{role.index}.json"
    info = {
        "task": role.name, "strategy": name, "replicas": strategy.num_replicas_in_sync,
        "global_batch_size": cfg.global_batch_size, "epochs_planned": cfg.epochs, "resumed": resumed,
        "accumulate_steps": cfg.accumulate_steps, "gradient_dtype": cfg.gradient_dtype,
    }
    if name == "parameter_server":
        info["variable_placement"] = placement(model)
    if strategy.num_replicas_in_sync > 1 and name in ("mirrored", "multi_worker_mirrored"):
        # What each replica hands to the all-reduce per step; bench/scaling.py measures the wire.
        info["allreduce_bytes_per_step"] = train_step.gradient_bytes_per_step(model, cfg.gradient_dtype)
    writer = MetricsWriter(job_dir / metrics_name, timer, info, resumed)
    # The timer's end hook runs first and its start hook last, so the time it measures is
    # the training steps alone, as a plain script's timer measures them; checkpoint and
    # summary writes at the epoch boundary are recorded apart (epoch_seconds).
    callbacks: list = [timer]
    if name == "multi_worker_mirrored" and cfg.strategy.get("collective_timeout"):
        from modelyard.training.watchdog import CollectiveWatchdog

        watchdog = CollectiveWatchdog(cfg.strategy["collective_timeout"], role.name)
        callbacks.append(watchdog)
    factor = cfg.global_batch_size / cfg.base_batch_size if cfg.learning_rate_scaling == "linear" else 1.0
    if factor != 1.0 or cfg.warmup_epochs:
        callbacks.append(WarmupAndScaling(factor, cfg.warmup_epochs, steps))
    initial_epoch = 0
    if name in ("default", "mirrored", "multi_worker_mirrored"):
        # Keras' own callback knows how to save consistently from several workers.
        callbacks.append(keras.callbacks.BackupAndRestore(str(job_dir / "backup")))
    else:
        from modelyard.training.progress import EpochCheckpoint

        resume = EpochCheckpoint(job_dir / "backup", model)
        initial_epoch = resume.restore()
        callbacks.append(resume)
    if role.is_chief or name != "parameter_server":
        callbacks.append(keras.callbacks.ModelCheckpoint(str(job_dir / "checkpoints" / "ckpt-{epoch:04d}"),
                                                         save_weights_only=True))
    if cfg.tensorboard:
        callbacks.append(keras.callbacks.TensorBoard(str(job_dir / "tensorboard"), profile_batch=0))
    callbacks.append(writer)
    if cfg.verbose:
        callbacks.append(Progress(timer, cfg.epochs))
    callbacks.append(timer.start_hook)

    print(f"{role.name}: training {Path(cfg.model).name} with {name} on {strategy.num_replicas_in_sync} replica(s), "
          f"global batch {cfg.global_batch_size}{' (resuming from checkpoint)' if resumed else ''}", flush=True)
    try:
        history = model.fit(train, epochs=cfg.epochs, steps_per_epoch=steps, validation_data=validation,
                            validation_steps=val_steps, callbacks=callbacks, verbose=0,
                            initial_epoch=initial_epoch)
    except tf.errors.OpError as exc:
        if watchdog is not None and watchdog.fired:
            raise TrainError(watchdog.fired) from exc
        raise _explain(exc, role.name) from exc
    finally:
        if watchdog is not None:
            watchdog.stop()
    rates = [r["samples_per_sec"] for e, r in sorted(timer.records.items()) if e > 0] or \
            [r["samples_per_sec"] for r in timer.records.values()]
    summary: dict[str, Any] = {"completed": True, "epochs_completed": len(writer.epochs)}
    if rates:
        summary["samples_per_sec"] = sorted(rates)[len(rates) // 2]
        cpu_rates = [r["samples_per_cpu_sec"] for e, r in sorted(timer.records.items()) if e > 0] or \
                    [r["samples_per_cpu_sec"] for r in timer.records.values()]
        summary["samples_per_cpu_sec"] = sorted(cpu_rates)[len(cpu_rates) // 2]
    if role.is_chief and cfg.input_report and name != "parameter_server" and rates:
        report = _input_report(train_fn, strategy, cfg.global_batch_size, summary["samples_per_sec"], steps)
        summary["input_report"] = report
        print(f"{role.name}: {report['verdict']}", flush=True)
    if role.is_chief and cfg.export_to:
        version = export(cfg, module, model)
        summary["exported"] = str(version)
        print(f"{role.name}: exported {version}", flush=True)
    writer.flush(**summary)
    del history
    return writer.info | {"epochs": writer.epochs}


def clean_job_dir(job_dir: Path | uri_paths.UriPath) -> None:
    """Remove a job directory's state so the next run starts from scratch."""
    if uri_paths.is_uri(job_dir):
        uri_paths.route()
        job_dir.rmtree()
    else:
        shutil.rmtree(job_dir, ignore_errors=True)
