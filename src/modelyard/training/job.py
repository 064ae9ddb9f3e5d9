"""What every training loop needs to know about its job, in one place both the trainer
(Keras' ``fit``) and modelyard's own loops (training/loops.py) import: this process's role
from TF_CONFIG, the user's model module and its compiled model, the datasets and step counts
of a config, where variables live, and the export of the trained model.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from modelyard.training import uri_paths
from modelyard.training import data as data_mod
from modelyard.training.config import ConfigError, TrainConfig


class TrainError(RuntimeError):
    """Training could not run or finish; the message says what to do next."""


@dataclass(frozen=True)
class Role:
    """This process's place in the job, from TF_CONFIG (absent: a one-process job)."""

    type: str
    index: int
    cluster: dict[str, list[str]]

    @property
    def name(self) -> str:
        return f"{self.type}:{self.index}"

    @property
    def is_chief(self) -> bool:
        if self.type == "chief":
            return True
        return self.type == "worker" and self.index == 0 and not self.cluster.get("chief")

    @property
    def num_workers(self) -> int:
        return len(self.cluster.get("chief", [])) + len(self.cluster.get("worker", [])) or 1


def current_role() -> Role:
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return Role("chief", 0, {})
    try:
        conf = json.loads(raw)
        task = conf.get("task", {})
        return Role(task.get("type", "worker"), int(task.get("index", 0)), conf.get("cluster", {}))
    except (ValueError, TypeError, AttributeError) as exc:
        raise TrainError(f"TF_CONFIG is not valid JSON ({exc}); let `modelyard launch` set it") from None


def load_user_module(model: str) -> ModuleType:
    """Import the config's model file (``.py`` path) or module name."""
    if model.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"modelyard_user_{Path(model).stem}", model)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(Path(model).parent))  # let the file import its neighbours
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(model)
        except ModuleNotFoundError as exc:
            raise ConfigError(f"model: cannot import {model!r} ({exc}); give a .py file or an importable module") from None
    if not callable(getattr(module, "build_model", None)):
        raise ConfigError(f"model: {model} defines no build_model(); add one returning a compiled tf_keras model")
    return module


def build_model(module: ModuleType):
    """The compiled tf_keras model of the module's ``build_model()``, checked."""
    import tf_keras as keras

    model = module.build_model()
    if not isinstance(model, keras.Model):
        raise TrainError(f"build_model() returned {type(model).__name__}, not a tf_keras model "
                         "(use `import tf_keras as keras`)")
    if model.optimizer is None:
        raise TrainError("build_model() returned an uncompiled model; call model.compile(optimizer, loss) before returning it")
    return model


def dataset_fns(cfg: TrainConfig, module: ModuleType) -> tuple[Callable, Callable | None]:
    """The train and validation dataset functions (``input_context -> dataset``) of a config."""
    user = getattr(module, "make_dataset", None)
    if callable(user) and not cfg.data:
        return (lambda ctx: user(ctx, "train")), (lambda ctx: user(ctx, "validation"))
    train = data_mod.builtin_dataset_fn(cfg.data, "train", cfg.global_batch_size, cfg.seed)
    validation = data_mod.builtin_dataset_fn(cfg.data, "validation", cfg.global_batch_size, None)
    workers = len(current_role().cluster.get("worker", []))
    if cfg.strategy_name == "parameter_server" and workers > 1:
        from modelyard.training.ps_training import distinct_per_worker

        train = distinct_per_worker(train, workers)
    return train, validation


def count_steps(cfg: TrainConfig, module: ModuleType, split: str, configured: int | None) -> int | None:
    """Steps per epoch of ``split``: as configured, else the built-in source's size / global batch (None: unknown)."""
    if configured:
        return configured
    if callable(getattr(module, "make_dataset", None)) and not cfg.data:
        return None
    count = data_mod.count_examples(cfg.data, split)
    if count is None:
        return None
    steps = count // cfg.global_batch_size
    if not steps:
        raise ConfigError(f"global_batch_size {cfg.global_batch_size} is larger than the {count} {split} examples")
    return steps


def placement(model) -> dict[str, str]:
    """The device of each variable (a partitioned variable shows as its parts, ``kernel/part_0`` ...)."""
    return {variable.name: variable.device for variable in model.variables}


def export(cfg: TrainConfig, module: ModuleType, model) -> Path:
    """Export a strategy-free copy, so the SavedModel has plain variables a server can load."""
    import modelyard

    plain = build_model(module)
    plain.set_weights(model.get_weights())
    if uri_paths.is_uri(cfg.export_to):
        return uri_paths.export(plain, cfg.export_to)
    return modelyard.export(plain, cfg.export_to, quiet=True)  # run() prints it with the task name
