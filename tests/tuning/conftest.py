"""Helpers for tuning tests: write a study file, run `modelyard tune` as a real process, read
the study back from its database."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

TRIALS = Path(__file__).parent / "trials"
ENV = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
MODELYARD = [sys.executable, "-m", "modelyard"]


def write_study(directory: Path, name: str, parameters: list, script: str | list, metric: str = "score",
                goal: str = "MAXIMIZE", **top) -> Path:
    """A study file in ``directory`` whose trial runs ``script`` (a file under tests/tuning/trials)."""
    command = [sys.executable, str(TRIALS / script)] if isinstance(script, str) else script
    spec = {"metrics": [{"metric_id": metric, "goal": goal}], "parameters": parameters}
    spec.update(top.pop("study_spec", {}))
    trial = {"command": command}
    trial.update(top.pop("trial", {}))
    body = {"display_name": name, "study_spec": spec, "trial": trial, **top}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def start(args: list[str], cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(MODELYARD + args, env=ENV, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def run(args: list[str], timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m modelyard ARGS``; its process group is killed if it overruns or the test fails."""
    proc = start(args, cwd)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        kill_group(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def trials(study_file: Path):
    """The study's trials, read from its database with Optuna."""
    from modelyard.tuning import spec
    from modelyard.tuning.study import load_study

    return load_study(spec.load(study_file), create=False).get_trials(deepcopy=False)


def best(study_file: Path):
    from modelyard.tuning import spec
    from modelyard.tuning.report import best_trials

    return best_trials(spec.load(study_file), trials(study_file))[0]
