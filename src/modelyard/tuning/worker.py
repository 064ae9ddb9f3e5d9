"""A warm trial worker: one process that imports the user's objective once and runs trial after trial.

    python -m modelyard.tuning.worker TARGET IN_FD OUT_FD LOG

``TARGET`` is ``FILE.py:NAME`` or ``package.module:NAME``. The tuner sends one JSON line per
trial on ``IN_FD``; the worker answers on ``OUT_FD`` with JSON lines: ``ready`` once the module is
imported, ``report`` per measurement (then it waits for ``go`` or ``prune``: the pruner decides at
every step, as it would in an in-process loop), and one of ``done``, ``pruned`` or ``error`` per
trial. A trial's stdout and stderr go to its ``trial.log``; between trials to ``LOG``.

Between trials the Keras/TensorFlow state is cleared (``clear_session``) and the seeds are set
again, so a trial starts as it would in a fresh process. A trial that raises leaves the worker
suspect: it reports the error and exits, and the tuner replaces it.

The worker is started in its slot's share of the machine (cores, thread-count variables,
``CUDA_VISIBLE_DEVICES``: tuning.workers), so the objective's module, and the TensorFlow it
imports and initialises at import, size their thread pools and pick devices for that share.
The slot sent with the first trial is applied again (a spare started for any of several
like slots gets its cores then).

Once the module is imported its objects are moved out of the garbage collector's reach
(``gc.freeze``): TensorFlow leaves some 360,000 long-lived objects, and every full collection
(between trials, and the automatic ones during training) would otherwise scan them all,
0.2-0.25 CPU-s each on a 2-core machine.
"""
from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import os
import random
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from modelyard.tuning import TrialPruned

WORKER_ENV = "MODELYARD_TUNING_WORKER"


def resolve(target: str, workdir: str | None = None) -> Callable[..., Any]:
    """The callable ``FILE.py:NAME`` or ``module:NAME`` names (a file relative to ``workdir``)."""
    where, _, name = target.rpartition(":")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_absolute() and workdir:
            path = Path(workdir) / path
        module_name = f"_modelyard_objective_{path.stem}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        sys.path.insert(0, str(path.parent))  # its neighbours import as they would from a script
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    obj: Any = module
    for part in name.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{target} is not callable")
    return obj


def load(target: str, workdir: str | None = None) -> Callable[..., Any]:
    """Import the objective, then freeze what the import left (see the module's docstring)."""
    objective = resolve(target, workdir)
    gc.collect()  # the import's garbage first: frozen objects are never collected
    gc.freeze()
    return objective


def apply_slot(env: dict[str, str], cpus: list[int] | None) -> None:
    """Thread-count variables before TensorFlow builds its pools, and the cores for every thread
    this process already has (affinity set on one thread is not inherited by running ones)."""
    os.environ.update(env)
    if cpus:
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), set(cpus))
            except OSError:
                pass  # a thread that ended meanwhile


_cleared = False  # Keras and the collector cleared since the last trial ended: nothing to forget


def clear_state(seed: int | None, trial_over: bool = False) -> None:
    """Forget the previous trial's models and graphs; seed Python, NumPy and TensorFlow again.
    Right after the previous trial's end cleared them (run_trial), only the seeds are set: the
    trial starts without a second clear_session and collection (tenths of a second on a busy machine)."""
    global _cleared
    if not _cleared:
        _forget()
    _cleared = trial_over  # at a trial's start: its models are to be cleared when it is over
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed)
    tf = sys.modules.get("tensorflow")
    if tf is not None and hasattr(tf, "random"):
        tf.random.set_seed(seed)


def _forget() -> None:
    for name in ("tf_keras", "keras"):
        module = sys.modules.get(name)
        backend = getattr(module, "backend", None) if module is not None else None
        if backend is not None and hasattr(backend, "clear_session"):
            try:
                backend.clear_session()
            except Exception:  # a half-imported Keras: nothing to clear
                pass
    gc.collect()


class Channel:
    """The JSON-lines pipes to the tuner."""

    def __init__(self, in_fd: int, out_fd: int):
        self.inp = os.fdopen(in_fd, "rb", buffering=0)
        self.out = out_fd
        self._buffer = b""

    def send(self, event: str, **fields: Any) -> None:
        data = (json.dumps({"event": event, **fields}) + "\n").encode()
        while data:
            data = data[os.write(self.out, data):]

    def receive(self) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            chunk = self.inp.read(65536)
            if not chunk:  # the tuner is gone: nothing left to do
                os._exit(0)
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


def _redirect(path: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # a NumPy or TensorFlow scalar
        except (TypeError, ValueError):
            raise TypeError(f"{what} must be a number, got {value!r}") from None
    return float(value)


class Reporter:
    """``report(step, value)`` or ``report(step, **metrics)``, as the objective gets it."""

    def __init__(self, channel: Channel, primary: str):
        self.channel, self.primary = channel, primary
        self.pruned_at: int | None = None

    def __call__(self, step: int, value: Any = None, **metrics: Any) -> None:
        if self.pruned_at is not None:  # told once; every later report says it again
            raise TrialPruned(f"pruned at step {self.pruned_at}")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise TypeError(f"report(step, ...): step must be an integer >= 0, got {step!r}")
        values = {k: _number(v, f"report metric {k}") for k, v in metrics.items()}
        if value is not None:
            values[self.primary] = _number(value, "report(step, value): value")
        if not values:
            raise TypeError("report(step, value) or report(step, name=value, ...): give a value")
        self.channel.send("report", step=step, metrics=values)
        if self.channel.receive().get("op") == "prune":
            self.pruned_at = step
            raise TrialPruned(f"pruned at step {step}")


def _final(result: Any, primary: str) -> dict[str, float] | None:
    if result is None:
        return None
    if isinstance(result, dict):
        return {str(k): _number(v, f"returned metric {k}") for k, v in result.items()}
    return {primary: _number(result, "the objective's return value")}


def run_trial(channel: Channel, objective: Callable[..., Any], job: dict[str, Any], worker_log: str) -> None:
    saved = dict(os.environ)
    os.environ.update(job["env"])
    os.chdir(job["workdir"])
    _redirect(str(Path(job["job_dir"]) / "trial.log"))
    clear_state(job.get("seed"))
    reporter = Reporter(channel, job["primary"])
    try:
        result = objective(dict(job["params"]), reporter)
        final = _final(result, job["primary"])
    except TrialPruned:
        channel.send("pruned", step=reporter.pruned_at)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the trial failed, not the tuner
        traceback.print_exc()
        sys.stderr.flush()
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        channel.send("error", error=text)
        os._exit(3)  # state after an exception is suspect: the tuner starts a fresh worker instead
    else:
        if reporter.pruned_at is not None:  # caught TrialPruned and returned: still pruned
            channel.send("pruned", step=reporter.pruned_at)
        else:
            channel.send("done", final=final)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    _redirect(worker_log)
    clear_state(None, trial_over=True)  # let go of the finished trial's models now, not at the next trial


def main(argv: list[str]) -> int:
    target, in_fd, out_fd, log = argv[0], int(argv[1]), int(argv[2]), argv[3]
    _redirect(log)
    os.environ[WORKER_ENV] = "1"
    channel = Channel(in_fd, out_fd)
    try:
        objective = load(target, os.getcwd())
    except BaseException as exc:
        traceback.print_exc()
        channel.send("error", error=f"cannot load {target}: {type(exc).__name__}: {exc}")
        return 4
    channel.send("ready", pid=os.getpid())
    placed = False
    while True:
        job = channel.receive()
        if job.get("op") == "exit":
            return 0
        if not placed:
            apply_slot(job["slot_env"], job.get("cpus"))
            placed = True
        run_trial(channel, objective, job, log)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
