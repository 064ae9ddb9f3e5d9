"""One trial as a process: its command line, environment, job directory, device slot and log.

The trial gets its hyperparameters as ``--name=value`` flags (AI Platform's convention) and/or
as ``MODELYARD_TRIAL_PARAMS`` (JSON), plus the variables Vertex AI sets for a custom job
(``CLOUD_ML_TRIAL_ID``, ``CLOUD_ML_HP_METRIC_FILE``, ``AIP_MODEL_DIR``, ...), so code written
for Vertex runs unchanged. It runs in its own session (process group), so stopping it stops
everything it started; and it is tied to the tuning process by PR_SET_PDEATHSIG, so a tuning
process killed with -9 does not leave trials running.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelyard.tuning.devices import Slot
from modelyard.tuning.metrics import HYPERTUNE_FILE, TrialMetrics
from modelyard.tuning.spec import Study

LOG_NAME = "trial.log"
_PR_SET_PDEATHSIG = 1
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:  # not Linux: no parent-death signal, the resume path still cleans up
    _LIBC = None


def _child_setup(cpus: set[int] | None, parent: int):
    """Runs in the forked child before exec: only a syscall or two, nothing that takes a lock."""

    def setup() -> None:
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the tuner died before the signal was armed
                os._exit(1)
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


def trial_env(study: Study, trial_id: str, params: dict[str, Any], job_dir: Path, slot: Slot) -> dict[str, str]:
    """The trial's environment: ours, the study's ``trial.env``, the slot's, Vertex's variables."""
    env = dict(os.environ)
    env.update(study.env)
    env.update(slot.env())
    env.update({
        "CLOUD_ML_TRIAL_ID": trial_id,
        "CLOUD_ML_HP_METRIC_FILE": str(job_dir / HYPERTUNE_FILE),
        "CLOUD_ML_HP_METRIC_TAG": study.metrics[0].tag,
        "AIP_MODEL_DIR": str(job_dir / "model"),
        "AIP_CHECKPOINT_DIR": str(job_dir / "checkpoints"),
        "AIP_TENSORBOARD_LOG_DIR": str(job_dir / "tensorboard"),
        "MODELYARD_JOB_DIR": str(job_dir),
        "MODELYARD_TRIAL_ID": trial_id,
        "MODELYARD_STUDY": study.name,
    })
    if study.params_as in ("env", "both"):
        env["MODELYARD_TRIAL_PARAMS"] = json.dumps(params)
    return env


def trial_argv(study: Study, params: dict[str, Any], job_dir: Path, export_model: bool = False) -> list[str]:
    from modelyard.tuning.space import format_value  # here: space imports Optuna, which a warm
    # process started before the study opens (tuning.warm.start_warm) should not wait for

    argv = list(study.command)
    if study.is_modelyard_train:
        # Its metrics.json, TensorBoard events (and export, when the best will be exported)
        # land in the trial's own directory.
        argv.append(f"--job-dir={job_dir}")
        if export_model:
            argv.append(f"--export-to={job_dir / 'model'}")
    if study.params_as in ("flags", "both"):
        argv += [f"--{name}={format_value(value)}" for name, value in params.items()]
    return argv


@dataclass
class TrialProcess:
    """A started trial. ``poll`` reads its new measurements and says whether it has exited."""

    number: int
    trial_id: str
    params: dict[str, Any]
    job_dir: Path
    slot: Slot
    metrics: TrialMetrics
    proc: Any  # subprocess.Popen, or a warm.WarmChild (same pid/poll/returncode)
    started: float = field(default_factory=time.time)
    stop_reason: str | None = None  # "pruned", "timeout", "interrupted" once we decided to stop it
    stop_requested: float | None = None
    final: dict[str, float] | None = None  # a process reports no final measurement apart from its series
    note: str | None = None
    _term_sent: float | None = None

    @classmethod
    def start(cls, study: Study, number: int, params: dict[str, Any], job_dir: Path, slot: Slot,
              export_model: bool = False, forkserver: Any = None) -> "TrialProcess":
        trial_id = str(number + 1)  # Vertex numbers trials from 1
        job_dir.mkdir(parents=True, exist_ok=True)
        hypertune = job_dir / HYPERTUNE_FILE
        hypertune.parent.mkdir(parents=True, exist_ok=True)
        argv = trial_argv(study, params, job_dir, export_model)
        env = trial_env(study, trial_id, params, job_dir, slot)
        with open(job_dir / LOG_NAME, "ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
        proc = None
        if forkserver is not None:  # a warm start (tuning.warm); None: it could not, start cold
            proc = forkserver.spawn(trial_id, argv, env, study.workdir, job_dir / LOG_NAME, slot.cpus)
        if proc is None:
            proc = cls._popen(study, argv, env, job_dir, slot)
        metrics = TrialMetrics(job_dir, hypertune, study.metric_source)
        return cls(number, trial_id, params, job_dir, slot, metrics, proc)

    @staticmethod
    def _popen(study: Study, argv: list[str], env: dict[str, str], job_dir: Path, slot: Slot) -> subprocess.Popen:
        with open(job_dir / LOG_NAME, "ab") as log:
            return subprocess.Popen(
                argv, cwd=study.workdir, env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_child_setup(slot.cpus, os.getpid()),
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def stop(self, reason: str) -> None:
        """Ask the trial's whole process group to stop now (SIGTERM; SIGKILL after the grace)."""
        if self.stop_reason is None:
            self.stop_reason, self.stop_requested = reason, time.time()
        self._signal(signal.SIGTERM)
        self._term_sent = time.time()

    def enforce(self, grace: float) -> None:
        """SIGKILL a stopping trial that outlived its grace period."""
        if self._term_sent is not None and time.time() - self._term_sent > grace and not self.exited():
            self._signal(signal.SIGKILL)

    def kill_group(self) -> None:
        """After the leader exits, make sure nothing it started lingers."""
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    @property
    def exit_code(self) -> int | None:
        return self.proc.returncode

    def answer(self) -> None:
        """Nothing to answer: a process trial never waits for the pruner."""

    def failure(self, timeout: float | None) -> str | None:
        """Why the finished trial failed, or None."""
        if self.stop_reason == "timeout":
            return f"stopped after timeout_seconds {timeout:g}"
        code = self.proc.returncode
        if code != 0:
            return f"exit code {code}" if code > 0 else f"killed by signal {-code}"
        return None

    def log_tail(self, lines: int = 20) -> str:
        return read_tail(self.job_dir / LOG_NAME, lines)


def read_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a trial's log (its last 16 KiB read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
