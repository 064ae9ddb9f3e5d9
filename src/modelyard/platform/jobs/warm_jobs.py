"""Warm training jobs: a custom job whose one replica is a TensorFlow Python command (what
``modelyard jobs submit`` makes of a ``modelyard train`` config) starts from the platform's warm
interpreter instead of a fresh Python that imports TensorFlow.

The mechanism is the tuner's (tuning.forkserver, tuning.warm): the job runner of the leading
platform starts one fork server, the first time such a job comes (the job waits for its import,
at most ``READY_WAIT_S``, then starts cold), and keeps it while the platform runs (one that dies
is started again by the next job; one that dies while importing is not, and jobs start cold). The
server forks the job's process (``job_child``), which has TensorFlow imported and has run no op,
so it forks the replica in turn (custom_jobs) rather than starting a fresh Python. Logs, exit codes, cancel (SIGTERM
to the process group, SIGKILL after the grace), and the job's variables are those of a cold start.

How the platform finds them: a cold job's processes carry ``MODELYARD_JOB_ID`` in the environment
they were started with (``/proc/PID/environ``); a forked process shows its server's instead. So
each warm process's pid (and start time) is recorded in the job's ``warm.pids`` before the job
runs (forkserver.record_pid); the runner's adoption after a restart and its leftover scan read
that file as well as the environment (``job_runner``); cancel signals the job process's group, as
for a cold job (each forked process leads its own session, as ``start_new_session`` gives). The server itself carries no platform
marker: the jobs it forks must survive a restart of the platform, which kills the server (its
parent-death signal) but not them.

``blocker`` says why a job cannot start warm; the runner writes it to the job's log and starts it
cold: Ray engine, several replicas or pools, packages to install, a command that is not a Python
script or module of the platform's interpreter importing TensorFlow, or variables read when
Python starts or imports TensorFlow that differ from the server's (forkserver.warm_blocker).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

PIDS_FILE = "warm.pids"  # in a job's work dir: the processes forked for it, ``pid start_ticks`` a line
READY_WAIT_S = 60.0  # how long a job waits for the server's first import before it starts cold
# Imported by the server after TensorFlow, as every training job's processes import them next: the
# job's own process, then what `modelyard train` imports (tuning.preload.train_modules: its CLI, the
# trainer, the demo's digits). (Not job_child itself: it runs as __main__, which runpy warns of when
# the module is imported already.)
JOB_MODULES = ("modelyard.platform.jobs.job_runner", "modelyard.platform.jobs.custom_jobs")


def blocker(pools: list[dict], engine: dict | None, work_dir: Path) -> str | None:
    """Why a custom job (its checked pools: custom_jobs.check_job_spec) cannot start from the warm
    interpreter (None: it can)."""
    from modelyard.tuning.forkserver import imports_tensorflow, is_warm_command, warm_blocker

    if (engine or {}).get("name") == "ray":
        return "its replicas run on Ray nodes"
    if len(pools) != 1 or pools[0]["replicas"] != 1:
        return "it has several replicas (each is started cold by the launcher)"
    pool = pools[0]
    if pool["packages"]:
        return "python_package_spec: its packages are installed into the job's own Python"
    command = pool["command"]
    if not is_warm_command(command):
        return "its command is not a Python script or module run by the platform's interpreter"
    if not imports_tensorflow(command, work_dir):
        return "its script does not import TensorFlow (nothing to gain)"
    base = server_env()
    return warm_blocker({**base, **pool["env"]}, base)


class WarmJobs:
    """The job runner's fork server: started on demand, kept while the platform runs."""

    def __init__(self, state_dir: Path) -> None:
        self.log_path = state_dir / "warm" / "forkserver.log"
        self.server = None
        self.failed = False  # a server died before it had imported: jobs start cold from then on
        self._asked: dict[str, float] = {}  # job id -> when it started waiting for the server

    def _check(self) -> None:
        """Drop a server that died (the next job starts a new one), unless it never got ready."""
        server = self.server
        if server is None:
            return
        server.pump()
        if server.broken or not server.alive():
            if not server.ready:
                self.failed = True
                log.warning("the warm interpreter for training jobs died while importing (log: %s): training "
                            "jobs start cold", self.log_path)
            else:
                log.warning("the warm interpreter for training jobs died (log: %s): the next job starts another",
                            self.log_path)
            self.close()

    def hold(self, job_id: str) -> bool:
        """True while a warm-capable job should wait for the server's first import (started here)."""
        self._check()
        if self.failed or (self.server is not None and self.server.ready):
            self._asked.pop(job_id, None)
            return False
        if self.server is None:
            from modelyard.tuning.preload import train_modules
            from modelyard.tuning.warm import ForkServer

            log.info("starting the warm interpreter for training jobs (log: %s)", self.log_path)
            self.server = ForkServer(server_env(), self.log_path, JOB_MODULES + train_modules())
        first = self._asked.setdefault(job_id, time.monotonic())
        if time.monotonic() - first > READY_WAIT_S:
            self._asked.pop(job_id, None)
            return False
        return True

    def spawn(self, job_id: str, argv: list[str], env: dict[str, str], work_dir: Path, log_file: Path):
        """The job's process forked from the server (a warm.WarmChild), or ``(None, why)``."""
        self._check()
        server = self.server
        if self.failed:
            return None, f"the warm interpreter could not import TensorFlow (its log: {self.log_path})"
        if server is None or not server.ready:
            return None, f"the warm interpreter was not ready after {READY_WAIT_S:g} s"
        from modelyard.training.launcher import TASK_ENV_DEFAULTS

        env = {**TASK_ENV_DEFAULTS, **env}  # as the server's (its tasks get them anyway)
        why = server.refusal(env)
        if why is not None:
            return None, why
        child = server.spawn(job_id, argv, env, work_dir, log_file, None, detach=True,
                             pidfile=str(work_dir / PIDS_FILE))
        if child is None:
            return None, "the warm interpreter did not fork it"
        return child, None

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server = None


def server_env() -> dict[str, str]:
    """The warm interpreter's environment: the platform's, with the defaults every launched task gets."""
    from modelyard.training.launcher import TASK_ENV_DEFAULTS

    from modelyard.platform.jobs.job_identity import without_admin_token

    # The jobs it forks show its environment in /proc: the platform's token must not be in it.
    return {**TASK_ENV_DEFAULTS, **without_admin_token(os.environ)}


def local_blocker(command: list[str], env: dict[str, str]) -> str | None:
    """In a job's warm process: why its replica (``command`` with ``env``) cannot be forked from it."""
    import threading

    from modelyard.tuning.forkserver import is_warm_command, warm_blocker

    if not is_warm_command(command):
        return "its command is not a Python script or module run by the platform's interpreter"
    if threading.active_count() > 1:  # a fork copies their locks, held or not
        return f"the job's process runs {threading.active_count() - 1} other thread(s)"
    # What this process started with (/proc shows the environment it was started with: the warm
    # interpreter's) is what TensorFlow was imported under.
    try:
        with open("/proc/self/environ", "rb") as f:
            started = dict(v.decode(errors="replace").split("=", 1) for v in f.read().split(b"\0") if b"=" in v)
    except OSError as exc:
        return f"cannot read the environment it started with: {exc}"
    return warm_blocker(env, started)


def in_warm_process() -> bool:
    """This process was forked from a warm interpreter: TensorFlow is imported (and no op run: the
    job's process runs none) before the job's command ran."""
    return "tensorflow" in sys.modules
