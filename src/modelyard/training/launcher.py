"""The launcher and supervisor: one process per task, output streamed, failures handled.

Each task runs in its own process group (so stopping it also stops anything it
spawned) with its TF_CONFIG. Output lines are prefixed with the task name. The job:

* succeeds when every finishing task exits 0: chief and workers for collective jobs,
  the chief (coordinator) alone when there are parameter servers, whose ps and
  workers serve until told to stop;
* fails at once when any task exits otherwise: all others are stopped and the dead
  task, its exit code and its last lines are named; with ``max_restarts`` the whole
  cluster is started again instead (the trainer resumes from its checkpoint);
* stops every process on Ctrl-C (or SIGTERM).

A task whose command is a TensorFlow Python command is forked from one warm interpreter per launch
(training.warm_tasks) unless ``cold``: one TensorFlow import for every task and restart.
"""
from __future__ import annotations

import collections
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from modelyard.training import cluster as cluster_mod
from modelyard.training.cluster import ClusterError, Task
from modelyard.training.warm_tasks import WarmTasks, command_blocker

_TAIL_LINES = 15
# What every task gets unless the environment says otherwise (a warm interpreter a task may be
# forked from starts with the same: platform.jobs.warm_jobs).
TASK_ENV_DEFAULTS = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
_EVALUATOR_GRACE = 60.0  # the evaluator may still be scoring the last checkpoint


class LaunchError(RuntimeError):
    """The job cannot be launched; the message says what to fix."""


@dataclass
class Running:
    task: Task
    process: subprocess.Popen
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=_TAIL_LINES))
    reader: threading.Thread | None = None


def _signal_name(code: int) -> str:
    if code < 0:
        try:
            return f"{code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            return str(code)
    return str(code)


class Supervisor:
    """Runs one attempt of a job and reports how it ended."""

    def __init__(self, spec: dict[str, list[str]], tasks: list[Task], command: list[str],
                 grace: float = 5.0, out=None, attempt: int = 0, warm: WarmTasks | None = None):
        self.spec, self.tasks, self.command, self.grace = spec, tasks, command, grace
        self.warm = warm  # forks the tasks it can (None: every task starts cold)
        self.out = out or sys.stdout
        self.attempt = attempt
        self.running: list[Running] = []
        self.worker_restarts: dict[str, int] = {}
        self._lock = threading.Lock()

    def _env(self, task: Task) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            TF_CONFIG=cluster_mod.tf_config(self.spec, task),
            MODELYARD_TASK=str(task),
            MODELYARD_ATTEMPT=str(self.attempt),
            PYTHONUNBUFFERED="1",
        )
        for name, value in TASK_ENV_DEFAULTS.items():
            env.setdefault(name, value)
        return env

    def _emit(self, task: Task, line: str) -> None:
        with self._lock:
            self.out.write(f"{task} | {line}\n")
            self.out.flush()

    def _pump(self, run: Running) -> None:
        for raw in iter(run.process.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            run.tail.append(line)
            self._emit(run.task, line)
        run.process.stdout.close()

    def start(self) -> None:
        for task in self.tasks:
            self.running.append(self._start_task(task))

    def _popen(self, task: Task):
        """The task's process, its output on ``.stdout`` (a subclass may start it another way)."""
        if self.warm is not None:
            env = self._env(task)
            process, why = self.warm.spawn(env)
            if process is not None:
                return process
            self._emit(task, f"[modelyard] cold start (not forked from the warm interpreter): {why}")
        return subprocess.Popen(
            self.command, env=self._env(task), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )

    def _start_task(self, task: Task) -> Running:
        try:
            process = self._popen(task)
        except OSError as exc:
            self.stop()
            raise LaunchError(f"cannot start {shlex.join(self.command)}: {exc.strerror}") from None
        run = Running(task, process)
        run.reader = threading.Thread(target=self._pump, args=(run,), daemon=True)
        run.reader.start()
        self._emit(task, f"[modelyard] started pid {process.pid}")
        return run

    def _replace_worker(self, run: Running) -> bool:
        """A parameter-server job outlives a worker: TF's coordinator re-runs the lost worker's work
        elsewhere and waits for it at its address. Restart it there (a few times); True if done."""
        if not self.spec.get("ps") or run.task.type != "worker":
            return False
        restarts = self.worker_restarts.get(str(run.task), 0)
        if restarts >= WORKER_RESTARTS:
            return False
        self.worker_restarts[str(run.task)] = restarts + 1
        if run.reader:
            run.reader.join(timeout=2)
        self._emit(run.task, f"[modelyard] exited with code {_signal_name(run.process.returncode)}; restarting it "
                             f"in place (restart {restarts + 1} of {WORKER_RESTARTS}): the coordinator carries on")
        self._signal(run, signal.SIGKILL)  # whatever it left in its group
        self.running[self.running.index(run)] = self._start_task(run.task)
        return True

    def _signal(self, run: Running, sig: int) -> None:
        try:
            os.killpg(run.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, runs: list[Running] | None = None) -> None:
        """SIGTERM each task's process group, SIGKILL whatever is left after the grace period."""
        runs = [r for r in (self.running if runs is None else runs)]
        for run in runs:
            if run.process.poll() is None:
                self._signal(run, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for run in runs:
            try:
                run.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for run in runs:
            # Also kill the group of tasks that exited, in case they left children behind.
            self._signal(run, signal.SIGKILL)
            run.process.wait()
            if run.reader:
                run.reader.join(timeout=2)

    def _finishing(self) -> list[Running]:
        """The tasks whose success ends the job. A host running only parameter-server workers or
        ps tasks (``--task ps:0``) has none: they serve until stopped, so it waits for them."""
        if self.spec.get("ps"):
            return [r for r in self.running if r.task.type == "chief"] or list(self.running)
        return [r for r in self.running if r.task.type in ("chief", "worker")]

    def _failure(self, run: Running, also: list[Running]) -> str:
        """Stop every other task; what to say of ``run``'s failure (``also``: others that had failed)."""
        if run.reader:
            run.reader.join(timeout=2)  # collect its last lines before quoting them
        self.stop([r for r in self.running if r is not run])
        tail = "\n".join(f"    {line}" for line in run.tail) or "    (no output)"
        why = f"task {run.task} exited with code {_signal_name(run.process.returncode)}"
        if also:
            why += " (" + ", ".join(f"{r.task} also exited, with code {_signal_name(r.process.returncode)}"
                                    for r in also) + ")"
        return f"{why}; its last lines:\n{tail}"

    def wait(self, poll: float = 0.1) -> tuple[bool, str]:
        """Block until the job ends; ``(True, '')`` on success, else ``(False, why)``."""
        finishing = self._finishing()
        while True:
            failed = [run for run in self.running if _failed(run, finishing)]
            if failed:
                # A task killed by a signal is named over one that exited with an error: the peers of
                # a killed task fail on their next collective, and their exits may be seen in the same
                # pass as its own (a warm task's exit comes with its peers' in one read of the server).
                run = min(failed, key=lambda r: r.process.returncode >= 0)
                if self._replace_worker(run):
                    continue  # self.running changed: look at it afresh
                return False, self._failure(run, [r for r in failed if r is not run])
            if all(r.process.poll() == 0 for r in finishing):
                evaluators = [r for r in self.running if r.task.type == "evaluator"]
                deadline = time.monotonic() + _EVALUATOR_GRACE
                for run in evaluators:
                    try:
                        run.process.wait(max(0.0, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        pass
                self.stop()
                return True, ""
            if _STOP_REQUESTED.wait(poll):
                raise KeyboardInterrupt


def _failed(run: Running, finishing: list[Running]) -> bool:
    """``run`` has ended in a way that ends the job: any non-zero exit, or a zero one of a task that
    must serve until stopped (a ps, or a worker of a parameter-server job)."""
    code = run.process.poll()
    if code is None:
        return False
    return code != 0 or (run not in finishing and run.task.type != "evaluator")


# How often one worker of a parameter-server job is restarted in place before the job gives up.
WORKER_RESTARTS = 3
# How often a job on this machine is started again on fresh ports when a task could not listen on
# its port (TensorFlow's gRPC server says _PORT_TAKEN): the port was picked free, then taken.
PORT_RETRIES = 3
_PORT_TAKEN = "Could not start gRPC server"

# Set by SIGINT/SIGTERM. The handler only sets it: an exception raised from a signal handler can
# land inside Popen.poll() and leave its waitpid lock held, after which every wait() on that
# process hangs (seen as a launcher that ignored Ctrl-C for 30 s). The supervisor's loop raises
# KeyboardInterrupt itself, at a point where nothing is half-done.
_STOP_REQUESTED = threading.Event()


def _interrupt(signum, frame) -> None:
    # `kill <launcher>` stops the job the same clean way Ctrl-C does.
    _STOP_REQUESTED.set()


def _preflight(command: list[str], spec: dict[str, list[str]]) -> None:
    """If the command is ``modelyard train CONFIG``, check the config before starting anything."""
    try:
        at = command.index("train")
    except ValueError:
        return
    head = [Path(part).name for part in command[:at]]
    if not (head[-1:] == ["modelyard"] or head[-2:] == ["-m", "modelyard"]) or at + 1 >= len(command):
        return
    from modelyard.training.config import ConfigError, check_batch, check_coordinated, load

    try:
        cfg = load(command[at + 1])
        if cfg.strategy_name == "multi_worker_mirrored":
            check_batch(cfg, workers=cluster_mod.replicas_in(spec))
        if cfg.strategy_name == "parameter_server" and not spec.get("ps"):
            raise ConfigError("strategy parameter_server needs --ps N (and workers)")
        if {"backup_workers", "staleness"} & set(cfg.strategy):  # modelyard's parameter-server loop
            check_coordinated(cfg, len(spec.get("worker", [])))
    except ConfigError as exc:
        raise LaunchError(f"{command[at + 1]}: {exc}") from None


def _describe(spec: dict[str, list[str]], tasks: list[Task]) -> str:
    lines = []
    for task in tasks:
        lines.append(f"# {task}")
        lines.append(f"export TF_CONFIG='{cluster_mod.tf_config(spec, task)}'")
    return "\n".join(lines)


def main(command: list[str], *, chief: bool = False, workers: int = 0, ps: int = 0, evaluator: bool = False,
         max_restarts: int = 0, cluster_spec: str | None = None, task: str | None = None,
         print_tf_config: bool = False, grace: float = 5.0, out=None, cold: bool = False) -> int:
    """Run ``command`` as a supervised job; returns the launcher's exit code. Its tasks are forked
    from one warm interpreter when they can be (training.warm_tasks), unless ``cold``."""
    out = out or sys.stdout
    if threading.current_thread() is threading.main_thread():
        _STOP_REQUESTED.clear()
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, _interrupt)
    if max_restarts < 0:
        raise LaunchError("--max-restarts must be 0 or more")
    if cluster_spec:
        if workers or ps or chief:
            raise LaunchError("give either --cluster-spec or --chief/--workers/--ps, not both")
        spec = cluster_mod.load_spec(cluster_spec)
        all_tasks = cluster_mod.tasks_of(spec, evaluator)
        if task:
            chosen = cluster_mod.parse_task(task)
            cluster_mod.check_task(spec, chosen)
            all_tasks = [chosen]
        elif not print_tf_config:
            raise LaunchError("with --cluster-spec, name this host's task: --task worker:1 "
                              "(or --print-tf-config to see every host's TF_CONFIG)")
        fixed_spec = True
    else:
        if task:
            raise LaunchError("--task needs --cluster-spec FILE")
        if workers + ps + int(chief) == 0:
            raise LaunchError("nothing to launch: give --workers N (and optionally --chief, --ps N, --evaluator)")
        spec = cluster_mod.local_spec(workers, ps, chief)
        all_tasks = cluster_mod.tasks_of(spec, evaluator)
        fixed_spec = False
    if print_tf_config:
        print(_describe(spec, all_tasks), file=out)
        return 0
    if not command:
        raise LaunchError("no command: put it after --, e.g. modelyard launch --workers 2 -- modelyard train job.yaml")
    _preflight(command, spec)  # first: a bad config starts no process, not even the warm interpreter
    # A command that cannot be warm (not Python, no TensorFlow) starts cold as it always did; a task
    # that could but is not (the server died or was late, its variables differ) says why in its output.
    server_env = {**TASK_ENV_DEFAULTS, **os.environ}
    warm = None if cold or command_blocker(command, server_env) else WarmTasks(command, server_env)
    try:
        if warm is not None:
            warm.wait_ready(_STOP_REQUESTED)
        return _attempts(command, spec, all_tasks, fixed_spec, warm, workers=workers, ps=ps, chief=chief,
                         max_restarts=max_restarts, grace=grace, out=out)
    finally:
        if warm is not None:
            warm.close()


def _attempts(command: list[str], spec: dict[str, list[str]], all_tasks: list[Task], fixed_spec: bool,
              warm: WarmTasks | None, *, workers: int, ps: int, chief: bool, max_restarts: int, grace: float,
              out) -> int:
    """Run the job, again on failure up to ``max_restarts`` times; the launcher's exit code."""
    attempt = port_retries = 0
    while True:
        supervisor = Supervisor(spec, all_tasks, command, grace=grace, out=out, attempt=attempt, warm=warm)
        interrupted = False
        try:
            if _STOP_REQUESTED.is_set():
                raise KeyboardInterrupt
            supervisor.start()
            if _STOP_REQUESTED.is_set():
                raise KeyboardInterrupt
            ok, why = supervisor.wait()
        except KeyboardInterrupt:
            interrupted = True
        finally:
            if interrupted or sys.exc_info()[0] is not None:
                supervisor.stop()
        if interrupted:
            print("modelyard launch: interrupted; every task stopped", file=sys.stderr, flush=True)
            return 130
        if ok:
            print(f"modelyard launch: job finished ({len(all_tasks)} task(s))", file=out, flush=True)
            return 0
        print(f"modelyard launch: {why}", file=sys.stderr, flush=True)
        if not fixed_spec and _PORT_TAKEN in why and port_retries < PORT_RETRIES:
            # Another process took a port between our pick and TF's bind (tens of seconds on a busy
            # machine): not the job's fault, so it starts again on fresh ports without using a restart.
            port_retries += 1
            print("modelyard launch: a task's port was taken before it could listen; starting the job again on "
                  "fresh ports", file=out, flush=True)
            spec = cluster_mod.local_spec(workers, ps, chief)
            continue
        if attempt >= max_restarts:
            hint = "" if max_restarts else "; rerun with --max-restarts K to restart from the last checkpoint"
            print(f"modelyard launch: job failed{hint}", file=sys.stderr, flush=True)
            return 1
        attempt += 1
        print(f"modelyard launch: restarting the job (restart {attempt} of {max_restarts})", file=out, flush=True)
        if not fixed_spec:
            # Fresh ports: the dead job's ports may still be held by lingering sockets.
            spec = cluster_mod.local_spec(workers, ps, chief)
