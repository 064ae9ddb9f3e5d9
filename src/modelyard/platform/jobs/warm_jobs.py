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

**Pipeline tasks** (the custom jobs a ``pipelineJobs`` run makes, labelled ``modelyard-pipeline-job``)
start from a second server, the *task server* (``WarmJobs(..., tensorflow=False)``): it imports what
a job's process imports (``task_preload``: the job runner's modules, the launcher, the gateway's
certificates, KFP's executor), not TensorFlow, and is started when a run starts. The job's process
is forked from it as above (pid file, own session, limits, cancel, adoption); its replica, when it is
a KFP lightweight component (``sh -ec 'program_path=$(mktemp -d) ... python3 -m kfp.dsl.executor_main
...'`` with no ``pip install`` left: ``pipeline_spec.without_satisfied_install``), is forked from the
job's process too (``fork_replica``): the program written to a fresh ``mktemp -d`` folder as the
shell would, then ``kfp_task`` makes the fork the job's own Python (its venv: ``sys.executable``,
prefix, site directory and ``.pth`` files) and runs KFP's executor as ``python3 -m`` would. Anything
else (a container component, ``pip install`` still to run, variables read at start-up that differ)
starts cold, saying why in the job's log.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
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
TASK_PRELOAD = "modelyard.platform.jobs.task_preload"  # the task server's imports (and its mark)
TASK_READY_WAIT_S = 30.0  # a pipeline task waits this long for the task server's imports, then starts cold
PIPELINE_LABEL = "modelyard-pipeline-job"  # on the custom job of each pipeline task (pipeline_jobs)
# KFP's lightweight component: its command's shell script (kfp.dsl.component_factory, kfp 2.x), once the
# platform has dropped the pip install in front of it.
_KFP_SCRIPT = re.compile(r'\s*program_path=\$\(mktemp -d\)'
                         r'\s+printf "%s" "\$0" > "\$program_path/ephemeral_component\.py"'
                         r'\s+_KFP_RUNTIME=true python3 -m (?P<module>[A-Za-z_][\w.]*)\s+--component_module_path\s+'
                         r'"\$program_path/ephemeral_component\.py"\s+"\$@"\s*')


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
    """The job runner's fork server: started on demand, kept while the platform runs. The default is
    the training jobs' (TensorFlow imported); ``tensorflow=False`` is the pipeline tasks' task server."""

    def __init__(self, state_dir: Path, tensorflow: bool = True) -> None:
        self.tensorflow = tensorflow
        self.what = "training jobs" if tensorflow else "pipeline tasks"
        self.ready_wait_s = READY_WAIT_S if tensorflow else TASK_READY_WAIT_S
        self.log_path = state_dir / "warm" / ("forkserver.log" if tensorflow else "taskserver.log")
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
                log.warning("the warm interpreter for %s died while importing (log: %s): they start cold",
                            self.what, self.log_path)
            else:
                log.warning("the warm interpreter for %s died (log: %s): the next one starts another",
                            self.what, self.log_path)
            self.close()

    def hold(self, job_id: str) -> bool:
        """True while a warm-capable job should wait for the server's first import (started here)."""
        self._check()
        if self.failed or (self.server is not None and self.server.ready):
            self._asked.pop(job_id, None)
            return False
        self.start()
        first = self._asked.setdefault(job_id, time.monotonic())
        if time.monotonic() - first > self.ready_wait_s:
            self._asked.pop(job_id, None)
            return False
        return True

    def start(self) -> None:
        """Start the server now (it imports meanwhile), unless it runs or could not import."""
        self._check()
        if self.server is not None or self.failed:
            return
        from modelyard.tuning.warm import ForkServer

        log.info("starting the warm interpreter for %s (log: %s)", self.what, self.log_path)
        if self.tensorflow:
            from modelyard.tuning.preload import train_modules

            self.server = ForkServer(server_env(), self.log_path, JOB_MODULES + train_modules())
        else:
            self.server = ForkServer(server_env(), self.log_path, (TASK_PRELOAD,), tensorflow=False)

    def spawn(self, job_id: str, argv: list[str], env: dict[str, str], work_dir: Path, log_file: Path):
        """The job's process forked from the server (a warm.WarmChild), or ``(None, why)``."""
        self._check()
        server = self.server
        if self.failed:
            return None, f"the warm interpreter for {self.what} could not import (its log: {self.log_path})"
        if server is None or not server.ready:
            return None, f"the warm interpreter was not ready after {self.ready_wait_s:g} s"
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
    """This process was forked from a warm interpreter: TensorFlow (and no op run: the job's process
    runs none), or the task server's modules, imported before the job's command ran."""
    return "tensorflow" in sys.modules or TASK_PRELOAD in sys.modules


def may_fork_here() -> bool:
    """This is a pipeline task's job process, forked from the task server (its metadata server's modules
    imported already), and runs no other thread, native ones included: what it starts besides its replica
    (its metadata server: job_identity) may be forked from it rather than be a fresh Python."""
    try:
        alone = len(os.listdir("/proc/self/task")) == 1
    except OSError:
        alone = False
    return TASK_PRELOAD in sys.modules and alone


def task_blocker(row: dict, engine: dict | None) -> str | None:
    """Why a job cannot start from the task server (None: it can): only pipeline tasks do, on this host."""
    if (row.get("labels") or {}).get(PIPELINE_LABEL) is None:
        return "not a pipeline task"
    if (engine or {}).get("name") == "ray":
        return "its replicas run on Ray nodes"
    return None


def kfp_form(command: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]] | None:
    """A KFP lightweight component's command (its shell script, its program, its arguments) as the Python
    command the script would run, for a fork: the program written to a new ``mktemp -d`` folder (in the
    replica's ``TMPDIR``, as mktemp does), ``python3`` as ``PATH`` finds it, run through ``kfp_task``
    (which makes the fork that Python); None when ``command`` is not one."""
    if len(command) < 4 or command[:2] != ["sh", "-ec"]:
        return None
    m = _KFP_SCRIPT.fullmatch(command[2])
    python = shutil.which("python3", path=env.get("PATH", ""))
    if m is None or python is None or not _sees_platform(env.get("VIRTUAL_ENV")):
        return None
    folder = tempfile.mkdtemp(dir=env.get("TMPDIR") or "/tmp")
    program = os.path.join(folder, "ephemeral_component.py")
    with open(program, "w") as f:  # printf "%s" "$0": the program as it is
        f.write(command[3])
    argv = [python, "-m", "modelyard.platform.jobs.kfp_task", m.group("module"), "--component_module_path",
            program, *command[4:]]
    return argv, {**env, "_KFP_RUNTIME": "true"}


def _sees_platform(venv: str | None) -> bool:
    """The job's virtual environment (None: none) sees the platform's packages (job_env.PythonEnv), so a
    fork of the platform's interpreter finds what its own Python would; not a Python of the job's own."""
    if not venv:
        return True
    try:
        with open(os.path.join(venv, "pyvenv.cfg")) as f:
            cfg = dict(line.split("=", 1) for line in f if "=" in line)
    except OSError:
        return False
    return {k.strip(): v.strip() for k, v in cfg.items()}.get("include-system-site-packages") == "true"


def fork_replica(command: list[str], env: dict[str, str], cwd: Path, pidfile: Path):
    """In a warm job's process: its one replica forked from it (a ``forkserver.LocalChild``) and None, or
    None and why it must start cold. A KFP lightweight component is forked in its Python form (``kfp_form``)."""
    kfp = kfp_form(command, env)
    if kfp is not None:
        command, env = kfp
    why = local_blocker(command, env)
    if why is not None:
        if kfp is not None:  # the cold start's shell writes its own
            shutil.rmtree(os.path.dirname(command[5]), ignore_errors=True)
        return None, why
    from modelyard.tuning.forkserver import fork_local

    return fork_local(command, env, cwd, pidfile), None
