"""The training config: a YAML file, checked and resolved before TensorFlow starts.

Example::

    model: my_model.py            # build_model() and optionally make_dataset(input_context, split)
    data: {source: digits}        # or a .npz / .csv / .tfrecord file (see modelyard.training.data)
    strategy: {name: mirrored, devices: [CPU:0, CPU:1]}
    devices: {logical_cpus: 2}
    global_batch_size: 64
    epochs: 5
    job_dir: runs/mnist
    export_to: models/my_mnist_model

``job_dir``, ``export_to`` and data files may be ``gs://`` URIs of the platform's storage (``uri_paths``).
Every check here is plain Python (the model file is parsed, not run), so a wrong config
fails in well under a second and before ``modelyard launch`` starts any process.
"""
from __future__ import annotations

import ast
import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from modelyard.training import uri_paths

STRATEGIES = ("default", "one_device", "mirrored", "central_storage", "multi_worker_mirrored", "parameter_server")
MULTI_WORKER = ("multi_worker_mirrored", "parameter_server")
CROSS_DEVICE_OPS = ("nccl", "hierarchical_copy", "reduce_to_one")
COMMUNICATION = ("auto", "ring", "nccl")
BUILTIN_MODELS = {"demo": "modelyard.training.demo"}

_TOP_KEYS = {
    "model", "data", "strategy", "devices", "global_batch_size", "epochs", "steps_per_epoch",
    "validation_steps", "learning_rate_scaling", "base_batch_size", "warmup_epochs", "seed",
    "deterministic", "job_dir", "export_to", "verbose", "input_report", "tensorboard",
    "accumulate_steps", "gradient_dtype", "model_parallel", "recompute",
}
# gradient_dtype: bfloat16 compresses the all-reduce between replicas, which only these have.
ALL_REDUCE_STRATEGIES = ("mirrored", "multi_worker_mirrored")
_MODEL_PARALLEL_KEYS = {"stages", "devices", "micro_batches", "schedule", "weight_stashing"}
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "1f1b-flush")  # training/pipeline.py
_STRATEGY_KEYS = {
    "name", "device", "devices", "cross_device_ops", "compute_devices", "parameter_device",
    "communication", "collective_timeout", "num_shards", "min_shard_bytes", "backup_workers", "staleness",
}
_STALENESS_KEYS = {"drop_older_than", "scale", "single_replica_epochs"}
_DEVICE_KEYS = {"visible", "logical_cpus", "logical_gpus", "gpu_memory_growth", "gpu_memory_limit_mb", "log_placement"}
_DATA_KEYS = {
    "source", "train", "validation", "label", "x_key", "y_key", "shape", "shuffle_buffer", "cache",
    "validation_fraction",
}


class ConfigError(ValueError):
    """The training config is wrong; the message names the key and what to do."""


@dataclass
class TrainConfig:
    """A checked config. ``raw`` is the resolved mapping written to the job directory."""

    path: Path
    model: str  # a .py path or an importable module name
    data: dict[str, Any]
    strategy: dict[str, Any]
    devices: dict[str, Any]
    global_batch_size: int
    epochs: int
    steps_per_epoch: int | None
    validation_steps: int | None
    learning_rate_scaling: str
    base_batch_size: int | None
    warmup_epochs: float
    seed: int | None
    deterministic: bool
    job_dir: Path | uri_paths.UriPath  # a local directory, or a gs:// one of the platform's storage
    export_to: Path | uri_paths.UriPath | None
    verbose: bool
    input_report: bool
    tensorboard: bool
    accumulate_steps: int = 1
    gradient_dtype: str = "float32"
    recompute: bool | list[str] = False  # layers whose activations the backward pass recomputes
    model_parallel: dict[str, Any] | None = None  # stages, devices, micro_batches (see training/pipeline.py)
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def strategy_name(self) -> str:
        return self.strategy["name"]


def _int(raw: dict, key: str, default: int | None, minimum: int = 1) -> int | None:
    value = raw.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}: must be an integer >= {minimum}, got {value!r}")
    return value


def _unknown(section: str, mapping: dict, allowed: set[str]) -> None:
    extra = sorted(set(mapping) - allowed)
    if extra:
        raise ConfigError(f"{section}: unknown key(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


def _mapping(raw: dict, key: str) -> dict:
    value = raw.get(key) or {}
    if isinstance(value, str) and key == "strategy":
        value = {"name": value}
    if isinstance(value, str) and key == "data":
        value = {"source": value}
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: must be a mapping")
    return dict(value)


def _check_uris(paths: dict[str, Any]) -> None:
    """A URI is never read as a relative path (``<config dir>/gs:/b/run``): a ``gs://`` one is the
    storage's (uri_paths), refused naming the key when no storage is named; other schemes are refused."""
    for key, value in paths.items():
        if uri_paths.is_uri(value):
            try:
                uri_paths.check(key, value)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None


def _resolve_path(base: Path, value: str | None) -> str | None:
    if value is None:
        return None
    if uri_paths.is_uri(value):  # gs://: the storage's, as written
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path))


def _dir(base: Path, value: str) -> Path | uri_paths.UriPath:
    """A job dir or export base: a local ``Path``, or a ``gs://`` ``UriPath`` with the same methods."""
    return uri_paths.UriPath(value) if uri_paths.is_uri(value) else Path(_resolve_path(base, value))


def check_model_file(model: str, base: Path) -> str:
    """Resolve ``model`` and make sure it defines ``build_model`` (parsed, not executed)."""
    model = BUILTIN_MODELS.get(model, model)
    if not model.endswith(".py"):
        return model  # an importable module; checked at import time in the task
    path = Path(_resolve_path(base, model))
    if not path.is_file():
        raise ConfigError(f"model: file {path} not found; give a .py file that defines build_model()")
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as exc:
        raise ConfigError(f"model: {path} has a syntax error at line {exc.lineno}: {exc.msg}") from None
    names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    names |= {a.asname or a.name for node in tree.body if isinstance(node, ast.ImportFrom) for a in node.names}
    if "build_model" not in names:
        raise ConfigError(
            f"model: {path} defines no build_model(); add `def build_model():` returning a compiled tf_keras model"
        )
    return str(path)


def _check_strategy(strategy: dict) -> None:
    _unknown("strategy", strategy, _STRATEGY_KEYS)
    name = strategy.setdefault("name", "default")
    if name not in STRATEGIES:
        raise ConfigError(f"strategy.name: {name!r} is not one of {', '.join(STRATEGIES)}")
    ops = strategy.get("cross_device_ops")
    if ops is not None and ops not in CROSS_DEVICE_OPS:
        raise ConfigError(f"strategy.cross_device_ops: {ops!r} is not one of {', '.join(CROSS_DEVICE_OPS)}")
    comm = strategy.setdefault("communication", "auto")
    if comm not in COMMUNICATION:
        raise ConfigError(f"strategy.communication: {comm!r} is not one of {', '.join(COMMUNICATION)}")
    for key in ("devices", "compute_devices"):
        if key in strategy and not (isinstance(strategy[key], list) and strategy[key]):
            raise ConfigError(f"strategy.{key}: must be a non-empty list such as [CPU:0, CPU:1]")
    if "backup_workers" in strategy:
        backup = strategy["backup_workers"]
        if isinstance(backup, bool) or not isinstance(backup, int) or backup < 0:
            raise ConfigError(f"strategy.backup_workers: must be an integer >= 0, got {backup!r}")
        if backup and name != "parameter_server":
            raise ConfigError(f"strategy.backup_workers: backup workers are a parameter-server technique (the "
                              f"coordinator applies the first N gradients); strategy {name} has none: use "
                              "name: parameter_server, or drop backup_workers")
    if "staleness" in strategy:
        _check_staleness(strategy, name)
    timeout = strategy.setdefault("collective_timeout", 300)
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ConfigError("strategy.collective_timeout: must be a number of seconds > 0, or null for none")


def _check_staleness(strategy: dict, name: str) -> None:
    """strategy.staleness: asynchronous parameter-server training's policy for stale gradients."""
    staleness = strategy["staleness"]
    if name != "parameter_server":
        raise ConfigError(f"strategy.staleness: staleness control is for asynchronous parameter-server training; "
                          f"strategy {name} is synchronous: use name: parameter_server, or drop staleness")
    if "backup_workers" in strategy:
        raise ConfigError("strategy.staleness and strategy.backup_workers: backup workers are synchronous training, "
                          "staleness control asynchronous; choose one")
    if staleness is None:
        staleness = strategy["staleness"] = {}
    if not isinstance(staleness, dict):
        raise ConfigError("strategy.staleness: must be a mapping such as {drop_older_than: 4, scale: inverse}")
    _unknown("strategy.staleness", staleness, _STALENESS_KEYS)
    drop = staleness.get("drop_older_than")
    if drop is not None and (isinstance(drop, bool) or not isinstance(drop, int) or drop < 0):
        raise ConfigError(f"strategy.staleness.drop_older_than: must be an integer >= 0, got {drop!r}")
    if staleness.get("scale", "none") not in ("none", "inverse"):
        raise ConfigError(f"strategy.staleness.scale: {staleness['scale']!r} is not one of none, inverse (1/tau)")
    epochs = staleness.get("single_replica_epochs", 0)
    if isinstance(epochs, bool) or not isinstance(epochs, (int, float)) or epochs < 0:
        raise ConfigError("strategy.staleness.single_replica_epochs: must be a number >= 0")


def _check_devices(devices: dict) -> None:
    _unknown("devices", devices, _DEVICE_KEYS)
    for key in ("logical_cpus", "logical_gpus", "gpu_memory_limit_mb"):
        _int(devices, key, None)
    if "visible" in devices and not isinstance(devices["visible"], list):
        raise ConfigError("devices.visible: must be a list such as [GPU:0, GPU:1]")


def replicas_per_worker(cfg: TrainConfig) -> int:
    """Replicas this config puts on one worker, known without starting TensorFlow."""
    strategy, logical = cfg.strategy, cfg.devices.get("logical_cpus")
    name = strategy["name"]
    if name == "mirrored":
        if "devices" in strategy:
            return len(strategy["devices"])
        return cfg.devices.get("logical_gpus") or logical or 1
    if name == "central_storage":
        if "compute_devices" in strategy:
            return len(strategy["compute_devices"])
        return cfg.devices.get("logical_gpus") or logical or 1
    return 1


def check_batch(cfg: TrainConfig, workers: int = 1) -> int:
    """Per-replica batch size; raise ConfigError if the global batch does not divide evenly."""
    replicas = replicas_per_worker(cfg) * (workers if cfg.strategy_name == "multi_worker_mirrored" else 1)
    if cfg.global_batch_size % replicas:
        lower = cfg.global_batch_size - cfg.global_batch_size % replicas
        raise ConfigError(
            f"global_batch_size {cfg.global_batch_size} does not divide across {replicas} replicas; "
            f"use a multiple of {replicas} (e.g. {lower or replicas} or {lower + replicas})"
        )
    per_replica = cfg.global_batch_size // replicas
    if per_replica % cfg.accumulate_steps:
        raise ConfigError(
            f"accumulate_steps {cfg.accumulate_steps} does not divide the per-replica batch {per_replica} "
            f"(global_batch_size {cfg.global_batch_size} over {replicas} replica(s)); pick a divisor of {per_replica}"
        )
    return per_replica


def check_coordinated(cfg: TrainConfig, workers: int) -> int:
    """For modelyard's parameter-server loop (``backup_workers``, ``staleness``) on ``workers`` workers:
    how many gradients each update averages; raise ConfigError if the workers cannot give them. Checked
    by ``modelyard launch`` before anything starts and by the chief's loop (a cluster spec from elsewhere)."""
    staleness = cfg.strategy.get("staleness")
    backup = cfg.strategy.get("backup_workers", 0)
    if not workers:
        raise ConfigError("parameter-server training needs workers: start them with launch --workers N")
    if backup >= workers:
        raise ConfigError(f"strategy.backup_workers {backup} leaves no worker whose gradient is waited for "
                          f"({workers} workers): use at most {workers - 1}, or start more with launch --workers")
    required = 1 if staleness is not None else workers - backup  # gradients averaged per update
    if cfg.global_batch_size % required:
        raise ConfigError(f"global_batch_size {cfg.global_batch_size} must divide across the {required} gradients "
                          f"each step averages ({workers} workers - {backup} backup)")
    return required


def load(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read, check and resolve a YAML config. Paths in it are relative to the file."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config {path} must be a YAML mapping with at least `model:`")
    raw = copy.deepcopy(raw)
    raw.update(overrides or {})
    return from_mapping(raw, path)


def from_mapping(raw: dict[str, Any], path: Path) -> TrainConfig:
    """Check and resolve an already-parsed config (``path`` anchors relative paths)."""
    base = path.resolve().parent
    _unknown("config", raw, _TOP_KEYS)
    if "model" not in raw:
        raise ConfigError("model: missing; name a .py file with build_model(), or `demo` for the digits MLP")
    model = check_model_file(str(raw["model"]), base)
    data = _mapping(raw, "data")
    _unknown("data", data, _DATA_KEYS)
    _check_uris({"job_dir": raw.get("job_dir"), "export_to": raw.get("export_to"),
                       **{f"data.{k}": data.get(k) for k in ("source", "train", "validation")}})
    for key in ("source", "train", "validation"):
        if key in data and data[key] != "digits":
            data[key] = _resolve_path(base, data[key])
    strategy = _mapping(raw, "strategy")
    _check_strategy(strategy)
    devices = _mapping(raw, "devices")
    _check_devices(devices)
    scaling = raw.get("learning_rate_scaling", "none")
    if scaling not in ("none", "linear"):
        raise ConfigError("learning_rate_scaling: use `none` or `linear`")
    base_batch = _int(raw, "base_batch_size", None)
    if scaling == "linear" and base_batch is None:
        raise ConfigError("learning_rate_scaling: linear needs base_batch_size (the batch the learning rate was tuned for)")
    warmup = raw.get("warmup_epochs", 0)
    if not isinstance(warmup, (int, float)) or warmup < 0:
        raise ConfigError("warmup_epochs: must be a number >= 0")
    job_dir = _dir(base, str(raw.get("job_dir") or f"runs/{path.stem}"))
    export_to = raw.get("export_to")
    cfg = TrainConfig(
        path=path,
        model=model,
        data=data,
        strategy=strategy,
        devices=devices,
        global_batch_size=_int(raw, "global_batch_size", 64),
        epochs=_int(raw, "epochs", 1),
        steps_per_epoch=_int(raw, "steps_per_epoch", None),
        validation_steps=_int(raw, "validation_steps", None),
        learning_rate_scaling=scaling,
        base_batch_size=base_batch,
        warmup_epochs=float(warmup),
        seed=_int(raw, "seed", 0, minimum=0),
        deterministic=bool(raw.get("deterministic", False)),
        job_dir=job_dir,
        export_to=_dir(base, str(export_to)) if export_to else None,
        verbose=bool(raw.get("verbose", True)),
        input_report=bool(raw.get("input_report", True)),
        tensorboard=bool(raw.get("tensorboard", True)),
    )
    train_source = str(data.get("train") or data.get("source", ""))
    if train_source.endswith((".tfrecord", ".tfrecords")) or "*" in train_source:
        if cfg.steps_per_epoch is None:
            # The helper repeats the records; with no count an epoch would never end.
            raise ConfigError("steps_per_epoch: needed for TFRecord sources, whose size is not known up front")
    _check_step_options(cfg, raw)
    check_batch(cfg)
    cfg.raw = resolved_mapping(cfg)
    return cfg


def _check_step_options(cfg: TrainConfig, raw: dict[str, Any]) -> None:
    """accumulate_steps, gradient_dtype and model_parallel: refused before anything starts when they cannot work."""
    cfg.accumulate_steps = _int(raw, "accumulate_steps", 1)
    dtype = raw.get("gradient_dtype", "float32")
    if dtype not in ("float32", "bfloat16"):
        raise ConfigError(f"gradient_dtype: {dtype!r} is not one of float32, bfloat16")
    if dtype == "bfloat16" and cfg.strategy_name not in ALL_REDUCE_STRATEGIES:
        raise ConfigError(
            f"gradient_dtype: bfloat16 compresses the gradients' all-reduce, and strategy {cfg.strategy_name} has "
            f"none; use it with {' or '.join(ALL_REDUCE_STRATEGIES)}, or drop it")
    cfg.gradient_dtype = dtype
    recompute = raw.get("recompute", False)
    def block_ok(block) -> bool:
        return isinstance(block, str) or (isinstance(block, list) and block and all(isinstance(n, str) for n in block))

    if not (isinstance(recompute, bool) or (isinstance(recompute, list) and recompute
                                            and all(block_ok(b) for b in recompute))):
        raise ConfigError("recompute: true (about sqrt(L) blocks of layers), false, or a list of blocks, each a list "
                          "of consecutive layer names ([[dense, dense_1], [dense_2, dense_3]])")
    cfg.recompute = recompute
    coordinated = [key for key in ("backup_workers", "staleness") if key in cfg.strategy]
    asked = [name for name, on in (("accumulate_steps", cfg.accumulate_steps > 1), ("recompute", recompute)) if on]
    if cfg.strategy_name == "parameter_server" and coordinated and asked:
        # modelyard's coordinator (training/ps_training.py) computes each gradient in one pass
        # of its own; it would silently ignore these options, so refuse them.
        raise ConfigError(
            f"{' and '.join(asked)} with strategy.{coordinated[0]}: modelyard's parameter-server coordinator computes "
            f"each worker's gradient in one pass over its batch; drop {' and '.join(asked)}, or drop "
            f"{coordinated[0]} (plain parameter_server, or multi_worker_mirrored, take them)")
    parallel = raw.get("model_parallel")
    if parallel is None:
        return
    if not isinstance(parallel, dict):
        raise ConfigError("model_parallel: must be a mapping such as {stages: [[dense_1], [dense_2, out]], "
                          "devices: [CPU:0, CPU:1]}")
    _unknown("model_parallel", parallel, _MODEL_PARALLEL_KEYS)
    stages = parallel.get("stages")
    if isinstance(stages, int):
        if stages < 2:
            raise ConfigError(f"model_parallel.stages: {stages} stage(s); model parallelism needs at least 2")
    elif not (isinstance(stages, list) and len(stages) >= 2 and all(isinstance(s, list) for s in stages)):
        raise ConfigError("model_parallel.stages: give at least 2 lists of layer names ([[a, b], [c]]), "
                          "or a number of stages to split the layers evenly")
    else:
        for i, stage in enumerate(stages):
            if not stage:
                raise ConfigError(f"model_parallel.stages[{i}] has no layers; every stage needs at least one")
    count = stages if isinstance(stages, int) else len(stages)
    devices = parallel.get("devices")
    if devices is not None and (not isinstance(devices, list) or len(devices) != count):
        raise ConfigError(f"model_parallel.devices: give one device per stage ({count}), such as "
                          f"[{', '.join(f'CPU:{i}' for i in range(count))}]")
    micro = _int(parallel, "micro_batches", 1)
    schedule = parallel.get("schedule", "gpipe")
    if schedule not in PIPELINE_SCHEDULES:
        raise ConfigError(f"model_parallel.schedule: {schedule!r} is not one of {', '.join(PIPELINE_SCHEDULES)}")
    stashing = parallel.get("weight_stashing", True)
    if not isinstance(stashing, bool):
        raise ConfigError("model_parallel.weight_stashing: true or false")
    if "weight_stashing" in parallel and schedule != "1f1b":
        raise ConfigError(f"model_parallel.weight_stashing: only schedule 1f1b updates weights between a micro-batch's "
                          f"forward and backward passes; {schedule} never does, so drop weight_stashing")
    if cfg.strategy_name not in ("default", "one_device"):
        raise ConfigError(f"model_parallel places the model's stages on devices itself; it runs with the default "
                          f"strategy, not {cfg.strategy_name} (drop strategy:)")
    if cfg.recompute:
        raise ConfigError("recompute and model_parallel: the pipeline already recomputes each stage's forward pass "
                          "in its backward pass; drop recompute")
    if cfg.accumulate_steps > 1:
        raise ConfigError("accumulate_steps and model_parallel: the pipeline already splits each batch into "
                          "micro_batches; use model_parallel.micro_batches instead")
    if cfg.global_batch_size % micro:
        raise ConfigError(f"model_parallel.micro_batches {micro} must divide global_batch_size {cfg.global_batch_size}")
    cfg.model_parallel = {"stages": stages, "devices": devices or [f"CPU:{i}" for i in range(count)],
                          "micro_batches": micro, "schedule": schedule, "weight_stashing": stashing}


def uses_storage(cfg: TrainConfig) -> bool:
    """Whether the config names a ``gs://`` path (job dir, export base, data): TensorFlow's gs:// must
    reach the storage (``uri_paths.route``) before the first of them is touched."""
    return any(uri_paths.is_uri(v) for v in (cfg.job_dir, cfg.export_to,
                                             *(cfg.data.get(k) for k in ("source", "train", "validation"))))


def resolved_mapping(cfg: TrainConfig) -> dict[str, Any]:
    """The config with defaults filled in and paths absolute: what is saved in the job dir."""
    out = {
        key: getattr(cfg, key)
        for key in sorted(_TOP_KEYS)
        if key not in ("model", "data", "strategy", "devices")
    }
    out.update(model=cfg.model, data=cfg.data, strategy=cfg.strategy, devices=cfg.devices)
    return json.loads(json.dumps(out, default=str))
