"""The study file (``study.yaml``): read, checked and resolved before any trial runs.

The ``study_spec`` section follows Vertex AI's StudySpec (``metrics``, ``parameters`` with
``double_value_spec`` / ``integer_value_spec`` / ``discrete_value_spec`` /
``categorical_value_spec``, ``scale_type``, ``conditional_parameter_specs``,
``measurement_selection_type``, ``algorithm``, ``median_automated_stopping_spec``); keys may be
written in snake_case or in the camelCase of Vertex's JSON, so a spec copied from a Vertex job
works. The rest says how to run one trial::

    display_name: digits-mlp
    study_spec:
      metrics: [{metric_id: val_accuracy, goal: MAXIMIZE}]
      parameters:
        - parameter_id: learning_rate
          double_value_spec: {min_value: 0.0001, max_value: 0.1}
          scale_type: UNIT_LOG_SCALE
    max_trial_count: 8
    parallel_trial_count: 2
    trial:
      command: python3 train.py         # gets --learning_rate=0.003 (AI Platform's convention)
      # or, run in warm worker processes: objective(params, report) in train.py
      # function: train.py:objective

Every check is plain Python, so a wrong file fails in well under a second.
"""
from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SCALES = ("UNIT_LINEAR_SCALE", "UNIT_LOG_SCALE", "UNIT_REVERSE_LOG_SCALE")
# The SDK's spelling (hpt.DoubleParameterSpec(scale='log')) and the short names.
_SCALE_ALIASES = {
    "linear": "UNIT_LINEAR_SCALE", "log": "UNIT_LOG_SCALE", "reverse_log": "UNIT_REVERSE_LOG_SCALE",
    "UNIT_LINEAR": "UNIT_LINEAR_SCALE", "UNIT_LOG": "UNIT_LOG_SCALE", "UNIT_REVERSE_LOG": "UNIT_REVERSE_LOG_SCALE",
    "SCALE_TYPE_UNSPECIFIED": "UNIT_LINEAR_SCALE",
}
GOALS = ("MAXIMIZE", "MINIMIZE")
SELECTIONS = ("LAST_MEASUREMENT", "BEST_MEASUREMENT")
# Vertex's algorithm names, and the engine's own (tuning.designers). Vertex's default is Vizier's
# Gaussian-process bandit; Optuna's TPE stays available by name.
ALGORITHMS = {
    "ALGORITHM_UNSPECIFIED": "gp_bandit", "GRID_SEARCH": "grid", "RANDOM_SEARCH": "random",
    "gp_bandit": "gp_bandit", "tpe": "tpe", "grid": "grid", "random": "random",
}
PARAMS_AS = ("flags", "env", "both")
METRIC_SOURCES = ("auto", "modelyard", "tensorboard", "hypertune")
_GRID_LIMIT = 10_000

_TOP_KEYS = {
    "display_name", "study_spec", "max_trial_count", "parallel_trial_count", "max_failed_trial_count",
    "trial", "job_dir", "storage", "seed",
    # A Vertex AI HyperparameterTuningJob resource (its JSON) is a study file too.
    "trial_job_spec", "base_output_directory", "labels",
}
_SPEC_KEYS = {
    "metrics", "parameters", "algorithm", "measurement_selection_type", "median_automated_stopping_spec",
    "hyperband_stopping_spec", "observation_noise", "decay_curve_stopping_spec", "convex_stop_config",
}
_PARAM_KEYS = {
    "parameter_id", "double_value_spec", "integer_value_spec", "discrete_value_spec", "categorical_value_spec",
    "scale_type", "conditional_parameter_specs",
}
_TRIAL_KEYS = {"command", "function", "params_as", "metric_source", "hyperparameter_metric_tag", "env",
               "timeout_seconds", "workdir", "memory_limit_mb", "warm_start"}
_COMMAND_ONLY = ("params_as", "metric_source")
_PARENT_KEYS = {
    "parent_discrete_values": "DISCRETE", "parent_int_values": "INTEGER", "parent_categorical_values": "CATEGORICAL",
}


class SpecError(ValueError):
    """The study file is wrong; the message names the key and what to do."""


@dataclass
class Param:
    """One parameter of the search space; ``children`` are (parent values, child) pairs."""

    id: str
    kind: str  # DOUBLE | INTEGER | DISCRETE | CATEGORICAL
    scale: str = "UNIT_LINEAR_SCALE"
    min: float | None = None
    max: float | None = None
    values: list[Any] = field(default_factory=list)
    children: list[tuple[list[Any], "Param"]] = field(default_factory=list)

    def walk(self):
        """This parameter and every conditional descendant."""
        yield self
        for _, child in self.children:
            yield from child.walk()


@dataclass
class Metric:
    id: str
    goal: str  # MAXIMIZE | MINIMIZE
    tag: str  # the name looked for in the trial's output (hyperparameter_metric_tag)

    @property
    def direction(self) -> str:
        return "maximize" if self.goal == "MAXIMIZE" else "minimize"


@dataclass
class Study:
    """A checked study file. Paths are absolute."""

    path: Path
    name: str
    metrics: list[Metric]
    params: list[Param]
    algorithm: str  # gp_bandit | tpe | grid | random
    selection: str  # LAST_MEASUREMENT | BEST_MEASUREMENT
    stopping: dict[str, Any] | None  # {"method": "median"|"hyperband", ...} or None
    max_trials: int
    parallel: int
    max_failed: int
    command: list[str]
    params_as: str
    metric_source: str
    env: dict[str, str]
    timeout: float | None
    workdir: Path
    job_dir: Path
    storage: str
    seed: int | None
    fingerprint: dict[str, Any] = field(default_factory=dict)
    image_uri: str | None = None  # a Vertex job's container image: recorded, not used
    function: str | None = None  # FILE.py:NAME or module:NAME: a function trial (command is empty)
    memory_limit_mb: float | None = None  # a function trial's worker above this RSS is replaced
    warm_start: bool = True  # a Python command trial is forked from a server that imported TensorFlow

    @property
    def is_modelyard_train(self) -> bool:
        return is_modelyard_train(self.command)


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def _normalize(value: Any) -> Any:
    """Vertex JSON (camelCase) and YAML (snake_case) to one form; values are left alone."""
    if isinstance(value, dict):
        return {_snake(str(k)): _normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    return value


def _unknown(where: str, mapping: dict, allowed: set[str]) -> None:
    extra = sorted(set(mapping) - allowed)
    if extra:
        raise SpecError(f"{where}: unknown key(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


def _number(where: str, value: Any, integer: bool = False) -> float:
    # Vertex's JSON carries int64 as strings ("minValue": "16"), so numeric strings are taken.
    if isinstance(value, str):
        try:
            value = int(value) if integer else float(value)
        except ValueError:
            raise SpecError(f"{where}: {value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
        raise SpecError(f"{where}: must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not math.isfinite(value):
        raise SpecError(f"{where}: must be finite, got {value!r}")
    return int(value) if integer else float(value)


def _count(raw: dict, key: str, default: int, minimum: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"{key}: must be an integer >= {minimum}, got {value!r}")
    return value


def _parse_param(raw: Any, where: str, seen: set[str]) -> Param:
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: must be a mapping with parameter_id and one *_value_spec")
    _unknown(where, raw, _PARAM_KEYS)
    pid = raw.get("parameter_id")
    if not isinstance(pid, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", pid):
        raise SpecError(f"{where}: parameter_id must be a name such as learning_rate, got {pid!r}")
    where = f"{where} ({pid})"
    if pid in seen:
        raise SpecError(f"{where}: parameter_id {pid!r} is used twice")
    seen.add(pid)
    kinds = [k for k in ("double_value_spec", "integer_value_spec", "discrete_value_spec", "categorical_value_spec")
             if k in raw]
    if len(kinds) != 1:
        raise SpecError(f"{where}: give exactly one of double_value_spec, integer_value_spec, "
                        f"discrete_value_spec, categorical_value_spec")
    kind = kinds[0].split("_")[0].upper()
    body = raw[kinds[0]]
    if not isinstance(body, dict):
        raise SpecError(f"{where}: {kinds[0]} must be a mapping")
    scale_raw = raw.get("scale_type", "UNIT_LINEAR_SCALE")
    scale = _SCALE_ALIASES.get(str(scale_raw), _SCALE_ALIASES.get(str(scale_raw).lower(), str(scale_raw)))
    if scale not in SCALES:
        raise SpecError(f"{where}: scale_type {scale_raw!r} is unknown; use one of {', '.join(SCALES)} "
                        f"(or linear, log, reverse_log)")
    param = Param(id=pid, kind=kind, scale=scale)
    if kind in ("DOUBLE", "INTEGER"):
        _unknown(f"{where}.{kinds[0]}", body, {"min_value", "max_value", "default_value"})
        for key in ("min_value", "max_value"):
            if key not in body:
                raise SpecError(f"{where}: {kinds[0]}.{key} is missing")
        integer = kind == "INTEGER"
        param.min = _number(f"{where}: {kinds[0]}.min_value", body["min_value"], integer)
        param.max = _number(f"{where}: {kinds[0]}.max_value", body["max_value"], integer)
        if param.min > param.max:
            raise SpecError(f"{where}: min_value {param.min} is greater than max_value {param.max}")
        if scale != "UNIT_LINEAR_SCALE" and param.min <= 0:
            raise SpecError(f"{where}: {scale} needs min_value > 0 (a log scale cannot reach {param.min}); "
                            f"raise min_value or use UNIT_LINEAR_SCALE")
    else:
        _unknown(f"{where}.{kinds[0]}", body, {"values", "default_value"})
        values = body.get("values")
        if not isinstance(values, list) or not values:
            raise SpecError(f"{where}: {kinds[0]}.values must be a non-empty list")
        if kind == "DISCRETE":
            values = [_number(f"{where}: discrete value", v) for v in values]
            if any(b <= a for a, b in zip(values, values[1:])):
                raise SpecError(f"{where}: discrete_value_spec.values must be strictly increasing, got {values}")
            values = [int(v) if v.is_integer() and all(float(x).is_integer() for x in values) else v for v in values]
        else:
            if any(not isinstance(v, (str, int, float)) or isinstance(v, bool) for v in values):
                raise SpecError(f"{where}: categorical values must be strings, got {values}")
            values = [str(v) for v in values]
            if len(set(values)) != len(values):
                raise SpecError(f"{where}: categorical values repeat: {values}")
        if "scale_type" in raw and scale != "UNIT_LINEAR_SCALE":
            raise SpecError(f"{where}: scale_type applies to DOUBLE and INTEGER parameters only")
        param.values = values
    for i, cond in enumerate(raw.get("conditional_parameter_specs") or []):
        param.children.append(_parse_child(param, cond, f"{where}.conditional_parameter_specs[{i}]", seen))
    return param


def _parse_child(parent: Param, raw: Any, where: str, seen: set[str]) -> tuple[list[Any], Param]:
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: must be a mapping with parameter_spec and parent_*_values")
    _unknown(where, raw, set(_PARENT_KEYS) | {"parameter_spec"})
    parents = [k for k in _PARENT_KEYS if k in raw]
    if len(parents) != 1:
        raise SpecError(f"{where}: give exactly one of {', '.join(_PARENT_KEYS)}")
    key = parents[0]
    if _PARENT_KEYS[key] != parent.kind:
        raise SpecError(f"{where}: {key} needs a {_PARENT_KEYS[key]} parent; {parent.id} is {parent.kind}")
    body = raw[key]
    values = body.get("values") if isinstance(body, dict) else body
    if not isinstance(values, list) or not values:
        raise SpecError(f"{where}: {key}.values must be a non-empty list")
    if parent.kind == "CATEGORICAL":
        values = [str(v) for v in values]
        allowed = parent.values
    elif parent.kind == "INTEGER":
        values = [_number(f"{where}: {key}", v, integer=True) for v in values]
        allowed = None
        bad = [v for v in values if not parent.min <= v <= parent.max]
        if bad:
            raise SpecError(f"{where}: parent values {bad} are outside {parent.id}'s range [{parent.min}, {parent.max}]")
    else:
        values = [_number(f"{where}: {key}", v) for v in values]
        allowed = parent.values
    if allowed is not None:
        bad = [v for v in values if v not in allowed]
        if bad:
            raise SpecError(f"{where}: parent values {bad} are not values of {parent.id} ({allowed})")
    if "parameter_spec" not in raw:
        raise SpecError(f"{where}: parameter_spec is missing")
    return values, _parse_param(raw["parameter_spec"], f"{where}.parameter_spec", seen)


def _parse_metrics(raw: Any, tag: Any) -> list[Metric]:
    if not isinstance(raw, list) or not raw:
        raise SpecError("study_spec.metrics: give at least one {metric_id: NAME, goal: MAXIMIZE|MINIMIZE}")
    metrics = []
    for i, item in enumerate(raw):
        where = f"study_spec.metrics[{i}]"
        if not isinstance(item, dict):
            raise SpecError(f"{where}: must be a mapping with metric_id and goal")
        _unknown(where, item, {"metric_id", "goal", "safety_config"})
        mid, goal = item.get("metric_id"), str(item.get("goal", "")).upper()
        if not isinstance(mid, str) or not mid:
            raise SpecError(f"{where}: metric_id is missing")
        if goal not in GOALS:
            raise SpecError(f"{where} ({mid}): goal {item.get('goal')!r} is not one of {', '.join(GOALS)}")
        metrics.append(Metric(id=mid, goal=goal, tag=mid))
    if tag is not None:
        if not isinstance(tag, str) or not tag:
            raise SpecError("trial.hyperparameter_metric_tag: must be a tag name")
        metrics[0].tag = tag  # AI Platform's one metric tag names the first (primary) metric
    if len({m.id for m in metrics}) != len(metrics):
        raise SpecError("study_spec.metrics: a metric_id is listed twice")
    return metrics


def _parse_stopping(spec: dict, metrics: list[Metric]) -> dict[str, Any] | None:
    chosen = [k for k in ("median_automated_stopping_spec", "hyperband_stopping_spec", "decay_curve_stopping_spec",
                          "convex_stop_config") if spec.get(k) is not None]
    if not chosen:
        return None
    if len(chosen) > 1:
        raise SpecError(f"study_spec: give one early-stopping spec, not {', '.join(chosen)}")
    key = chosen[0]
    if key in ("decay_curve_stopping_spec", "convex_stop_config"):
        raise SpecError(f"study_spec.{key}: not supported; use median_automated_stopping_spec or hyperband_stopping_spec")
    if len(metrics) > 1:
        raise SpecError(f"study_spec.{key}: early stopping needs a single metric (this study has {len(metrics)})")
    body = spec[key] or {}
    if not isinstance(body, dict):
        raise SpecError(f"study_spec.{key}: must be a mapping (may be empty: {{}})")
    if key == "median_automated_stopping_spec":
        _unknown(f"study_spec.{key}", body, {"use_elapsed_duration", "min_completed_trials", "min_measurements"})
        if body.get("use_elapsed_duration"):
            raise SpecError(f"study_spec.{key}.use_elapsed_duration: only step-based stopping is supported; set it false")
        return {"method": "median",
                "min_completed_trials": _count(body, "min_completed_trials", 3, 0),
                "min_measurements": _count(body, "min_measurements", 1, 0)}
    _unknown(f"study_spec.{key}", body, {"min_resource", "max_resource", "reduction_factor"})
    out = {"method": "hyperband",
           "min_resource": _count(body, "min_resource", 1, 1),
           "reduction_factor": _count(body, "reduction_factor", 3, 2)}
    max_resource = body.get("max_resource", "auto")
    out["max_resource"] = max_resource if max_resource == "auto" else _count(body, "max_resource", 1, 1)
    return out


def is_modelyard_train(command: list[str]) -> bool:
    """``modelyard train ...`` or ``python -m modelyard train ...``."""
    if len(command) >= 2 and Path(command[0]).name == "modelyard" and command[1] == "train":
        return True
    return len(command) >= 4 and command[1:4] == ["-m", "modelyard", "train"]


def _check_command(command: list[str], workdir: Path, env: dict[str, str]) -> None:
    """The trial command must exist here, before any trial starts."""
    exe = command[0]
    path = os.environ.get("PATH", "") if "PATH" not in env else env["PATH"]
    if os.sep in exe:
        target = Path(exe) if Path(exe).is_absolute() else workdir / exe
        if not (target.is_file() and os.access(target, os.X_OK)):
            raise SpecError(f"trial.command: {exe} is not an executable file (looked at {target})")
    elif shutil.which(exe, path=path) is None:
        raise SpecError(f"trial.command: {exe!r} was not found on PATH; give the full path or install it")
    name = Path(exe).name
    if re.fullmatch(r"python[0-9.]*", name) and len(command) >= 2 and command[1].endswith(".py"):
        script = Path(command[1]) if Path(command[1]).is_absolute() else workdir / command[1]
        if not script.is_file():
            raise SpecError(f"trial.command: script {command[1]} not found (looked at {script})")


def _check_function(target: Any, workdir: Path) -> str:
    """``FILE.py:NAME`` (the file must exist) or ``module.path:NAME``; imported by the workers only."""
    if not isinstance(target, str) or ":" not in target:
        raise SpecError(f"trial.function: give FILE.py:NAME or module:NAME (e.g. train.py:objective), got {target!r}")
    where, _, name = target.rpartition(":")
    if not name or not all(part.isidentifier() for part in name.split(".")):
        raise SpecError(f"trial.function: {name!r} is not a Python name (in {target!r})")
    if where.endswith(".py"):
        path = Path(where) if Path(where).is_absolute() else workdir / where
        if not path.is_file():
            raise SpecError(f"trial.function: {where} not found (looked at {path})")
    elif not all(part.isidentifier() for part in where.split(".")):
        raise SpecError(f"trial.function: {where!r} is neither a .py file nor a module name")
    return target


def _parse_trial(raw: Any, base: Path) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise SpecError("trial: must be a mapping with `command:` or `function:`")
    _unknown("trial", raw, _TRIAL_KEYS)
    if "function" in raw:
        return _parse_function_trial(raw, base)
    if raw.get("memory_limit_mb") is not None:
        raise SpecError("trial.memory_limit_mb: applies to function trials (trial.function) only")
    command = raw.get("command")
    if isinstance(command, str):
        command = shlex.split(command)
    if not isinstance(command, list) or not command or not all(isinstance(c, (str, int, float)) for c in command):
        raise SpecError("trial.command: give the training command as a string or a list, e.g. python3 train.py")
    command = [str(c) for c in command]
    # The interpreter running modelyard is the one trials get for a bare `python`, so a venv works.
    if command[0] in ("python", "python3"):
        command[0] = sys.executable
    workdir = Path(raw.get("workdir") or base)
    workdir = (workdir if workdir.is_absolute() else base / workdir).resolve()
    env = raw.get("env") or {}
    if not isinstance(env, dict):
        raise SpecError("trial.env: must be a mapping of NAME: value")
    env = {str(k): str(v) for k, v in env.items()}
    _check_command(command, workdir, env)
    train = is_modelyard_train(command)
    params_as = raw.get("params_as", "env" if train else "flags")
    if params_as not in PARAMS_AS:
        raise SpecError(f"trial.params_as: {params_as!r} is not one of {', '.join(PARAMS_AS)}")
    if train and params_as != "env":
        raise SpecError("trial.params_as: `modelyard train` takes no hyperparameter flags; use params_as: env "
                        "and read them in build_model() with modelyard.tuning.trial_params()")
    source = raw.get("metric_source", "auto")
    if source not in METRIC_SOURCES:
        raise SpecError(f"trial.metric_source: {source!r} is not one of {', '.join(METRIC_SOURCES)}")
    timeout = raw.get("timeout_seconds")
    if timeout is not None:
        timeout = _number("trial.timeout_seconds", timeout)
        if timeout <= 0:
            raise SpecError("trial.timeout_seconds: must be > 0")
    warm = raw.get("warm_start", True)
    if not isinstance(warm, bool):
        raise SpecError(f"trial.warm_start: true or false, got {warm!r}")
    return {"command": command, "params_as": params_as, "metric_source": source, "env": env,
            "timeout": timeout, "workdir": workdir, "warm_start": warm}


def _parse_function_trial(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    if raw.get("command") is not None:
        raise SpecError("trial: give command or function, not both")
    extra = [k for k in (*_COMMAND_ONLY, "warm_start") if k in raw]
    if extra:
        raise SpecError(f"trial.{extra[0]}: applies to command trials; a function trial gets its parameters as a "
                        f"dict and reports with report(step, value)")
    workdir = Path(raw.get("workdir") or base)
    workdir = (workdir if workdir.is_absolute() else base / workdir).resolve()
    env = raw.get("env") or {}
    if not isinstance(env, dict):
        raise SpecError("trial.env: must be a mapping of NAME: value")
    timeout = raw.get("timeout_seconds")
    if timeout is not None:
        timeout = _number("trial.timeout_seconds", timeout)
        if timeout <= 0:
            raise SpecError("trial.timeout_seconds: must be > 0")
    limit = raw.get("memory_limit_mb")
    if limit is not None:
        limit = _number("trial.memory_limit_mb", limit)
        if limit <= 0:
            raise SpecError("trial.memory_limit_mb: must be > 0")
    return {"command": [], "function": _check_function(raw["function"], workdir), "params_as": "env",
            "metric_source": "auto", "env": {str(k): str(v) for k, v in env.items()}, "timeout": timeout,
            "workdir": workdir, "memory_limit_mb": limit}


def with_budget(study: Study, max_trials: int | None = None, parallel: int | None = None) -> Study:
    """The study with ``--max-trials`` / ``--parallel`` from the command line over the file's
    ``max_trial_count`` / ``parallel_trial_count`` (a grid still stops at its size)."""
    for flag, value in (("--max-trials", max_trials), ("--parallel", parallel)):
        if value is not None and value < 1:
            raise SpecError(f"{flag} {value}: must be at least 1")
    if max_trials is not None:
        study.max_trials = min(max_trials, grid_size(study.params)) if study.algorithm == "grid" else max_trials
    if parallel is not None:
        study.parallel = parallel
    return study


def grid_size(params: list[Param]) -> int:
    """How many points a grid over ``params`` has (conditional children multiply their branch)."""
    total = 1
    for param in params:
        total *= sum(_branch_size(param, v) for v in grid_values(param))
    return total


def _branch_size(param: Param, value: Any) -> int:
    active = [child for values, child in param.children if value in values]
    return grid_size(active) if active else 1


def grid_values(param: Param) -> list[Any]:
    """The values a grid takes for one parameter (Vertex's rule: no DOUBLE in a grid)."""
    if param.kind in ("DISCRETE", "CATEGORICAL"):
        return list(param.values)
    if param.kind == "INTEGER":
        return list(range(int(param.min), int(param.max) + 1))
    raise SpecError(f"study_spec.algorithm GRID_SEARCH: parameter {param.id} is DOUBLE; a grid needs INTEGER, "
                    f"DISCRETE or CATEGORICAL parameters (turn it into a discrete_value_spec)")


def load(path: str | Path, storage: str | None = None) -> Study:
    """Read and check a study file; ``storage`` (``--storage``) overrides the file's."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"study file {path} not found") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"study file {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"study file {path} must be a mapping with study_spec and trial")
    return from_mapping(raw, path, storage)


def _trial_from_job(job: Any) -> tuple[dict[str, Any], str | None]:
    """``trial:`` from a HyperparameterTuningJob's ``trial_job_spec``: its one worker pool's
    ``container_spec`` command + args (or ``python_package_spec``'s module) run here."""
    where = "trial_job_spec.worker_pool_specs"
    pools = job.get("worker_pool_specs") if isinstance(job, dict) else None
    pools = [p for p in pools or [] if p]  # the SDK sends empty pools as placeholders
    if len(pools) != 1:
        raise SpecError(f"{where}: give exactly one worker pool (a trial here is one process); got {len(pools)}")
    pool = pools[0]
    if int(pool.get("replica_count", 1)) != 1:
        raise SpecError(f"{where}[0].replica_count: a trial runs one replica here, got {pool['replica_count']}")
    if "container_spec" in pool:
        body = pool["container_spec"]
        if not body.get("command"):
            raise SpecError(f"{where}[0].container_spec.command: needed; the image's entrypoint cannot run here "
                            f"(the image is not pulled: the command runs on this machine)")
        command = [str(c) for c in body["command"]] + [str(a) for a in body.get("args") or []]
        image = body.get("image_uri")
    elif "python_package_spec" in pool:
        body = pool["python_package_spec"]
        if not body.get("python_module"):
            raise SpecError(f"{where}[0].python_package_spec.python_module: needed")
        command = [sys.executable, "-m", body["python_module"]] + [str(a) for a in body.get("args") or []]
        image = body.get("executor_image_uri")
    else:
        raise SpecError(f"{where}[0]: give container_spec or python_package_spec")
    env = {str(e.get("name")): str(e.get("value", "")) for e in body.get("env") or [] if isinstance(e, dict)}
    return {"command": command, "env": env}, image


def parse_search(spec: Any, tag: str | None = None) -> tuple[list[Metric], list[Param], str, str]:
    """A StudySpec's metrics, parameters, algorithm (the engine's name: ``designers.ALGORITHMS``)
    and measurement selection, checked; ``spec`` in snake_case or camelCase. Early stopping is the
    caller's (``modelyard tune`` and Vizier studies take different stopping specs)."""
    spec = _normalize(spec)
    if not isinstance(spec, dict):
        raise SpecError("study_spec: missing; give metrics and parameters (Vertex AI StudySpec)")
    _unknown("study_spec", spec, _SPEC_KEYS)
    metrics = _parse_metrics(spec.get("metrics"), tag)
    params_raw = spec.get("parameters")
    if not isinstance(params_raw, list) or not params_raw:
        raise SpecError("study_spec.parameters: give at least one parameter")
    seen: set[str] = set()
    params = [_parse_param(p, f"study_spec.parameters[{i}]", seen) for i, p in enumerate(params_raw)]
    algorithm_raw = spec.get("algorithm", "ALGORITHM_UNSPECIFIED")
    algorithm = ALGORITHMS.get(str(algorithm_raw))
    if algorithm is None:
        raise SpecError(f"study_spec.algorithm: {algorithm_raw!r} is not one of {', '.join(ALGORITHMS)}")
    selection = str(spec.get("measurement_selection_type", "LAST_MEASUREMENT")).upper()
    if selection == "MEASUREMENT_SELECTION_TYPE_UNSPECIFIED":
        selection = "LAST_MEASUREMENT"
    if selection not in SELECTIONS:
        raise SpecError(f"study_spec.measurement_selection_type: {selection!r} is not one of {', '.join(SELECTIONS)}")
    return metrics, params, algorithm, selection


def from_mapping(raw: dict[str, Any], path: Path, storage: str | None = None) -> Study:
    """Check an already-parsed study file (``path`` anchors relative paths)."""
    base = path.resolve().parent
    trial_raw = raw.get("trial")
    raw = _normalize({k: v for k, v in raw.items() if k != "trial"})
    _unknown("study file", raw, _TOP_KEYS)
    image_uri = None
    if "trial_job_spec" in raw:
        if trial_raw is not None:
            raise SpecError("give trial or trial_job_spec (a Vertex HyperparameterTuningJob's), not both")
        trial_raw, image_uri = _trial_from_job(raw["trial_job_spec"])
        prefix = (raw.get("base_output_directory") or {}).get("output_uri_prefix")
        if prefix and "job_dir" not in raw:
            if "://" in prefix:
                raise SpecError(f"base_output_directory.output_uri_prefix: {prefix} is not a local path")
            raw["job_dir"] = prefix
    spec = raw.get("study_spec")
    # trial: env names and commands keep their case, so only its keys are normalised.
    trial_raw = {_snake(str(k)): v for k, v in trial_raw.items()} if isinstance(trial_raw, dict) else trial_raw
    tag = trial_raw.get("hyperparameter_metric_tag") if isinstance(trial_raw, dict) else None
    metrics, params, algorithm, selection = parse_search(spec, tag)
    params_raw = spec["parameters"]
    stopping = _parse_stopping(spec, metrics)
    max_trials = _count(raw, "max_trial_count", 10, 1)
    if algorithm == "grid":
        size = grid_size(params)
        if size > _GRID_LIMIT:
            raise SpecError(f"study_spec: the grid has {size} points (more than {_GRID_LIMIT}); use RANDOM_SEARCH")
        max_trials = min(max_trials, size)
    parallel = _count(raw, "parallel_trial_count", 1, 1)
    # Vertex lets 0 mean "the service decides"; here that is 3 failures.
    max_failed = _count(raw, "max_failed_trial_count", 0, 0) or 3
    trial = _parse_trial(trial_raw, base)
    name = raw.get("display_name") or path.stem
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise SpecError(f"display_name: {name!r} must be letters, digits, _ . -")
    job_dir = Path(raw.get("job_dir") or f"runs/{name}")
    job_dir = (job_dir if job_dir.is_absolute() else base / job_dir).resolve()
    storage = storage or raw.get("storage") or f"sqlite:///{base / (name + '.tuning.db')}"
    seed = raw.get("seed", 0)
    if seed is not None:
        seed = _count(raw, "seed", 0, 0)
    # What must not change between runs of one study: its space, metrics and search.
    fingerprint = {"metrics": [[m.id, m.goal] for m in metrics], "algorithm": algorithm,
                   "parameters": _normalize(params_raw)}
    return Study(path=path.resolve(), name=name, metrics=metrics, params=params, algorithm=algorithm,
                 selection=selection, stopping=stopping, max_trials=max_trials, parallel=parallel,
                 max_failed=max_failed, job_dir=job_dir, storage=storage, seed=seed, fingerprint=fingerprint,
                 image_uri=image_uri, **trial)
