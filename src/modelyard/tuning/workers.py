"""Function trials, the tuner's side: warm worker processes (tuning.worker), one per slot plus a
spare, and a trial running on one of them.

A worker imports the objective's module (and so TensorFlow) once and runs trial after trial.
It is started inside its slot: pinned to the slot's cores, with its thread-count variables and
``CUDA_VISIBLE_DEVICES``, before it imports anything, so TensorFlow sizes its thread pools and
picks its devices for the slot, not for the whole machine (set after the import, they came too
late: TensorFlow had already made its pools when the module built its data).

A trial that raises, exits the worker, hangs past ``timeout_seconds``, grows the worker past
``memory_limit_mb`` or keeps running after it was pruned costs only its worker: the worker is
killed and the next trial on that slot takes the warm spare (a new spare starts importing at
once). The first spare starts when the first worker is replaced, so the first failure waits for
a cold worker: a spare started in every study would cost every study one more import, taken
from the running trials when the slots use every core. A spare fits any slot when the slots
differ only in their cores (it is pinned to the slot when it takes it), else it is started for
the slot whose worker was replaced. Workers are started like trial processes (own session,
parent-death signal), so a tuner killed with -9 takes them along.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelyard.tuning.devices import Slot
from modelyard.tuning.runner import LOG_NAME, _child_setup, read_tail, trial_env
from modelyard.tuning.spec import Study

SPARES = 1


class Worker:
    """One warm worker process and its two pipes."""

    def __init__(self, study: Study, log: Path, slot: Slot | None, slot_env: dict[str, str], cpus: set[int] | None):
        to_worker_r, self._to_worker = os.pipe()
        self._from_worker, from_worker_w = os.pipe()
        os.set_blocking(self._from_worker, False)
        env = dict(os.environ, **study.env, MODELYARD_STUDY=study.name)
        env.update(slot_env)  # before the import: TensorFlow reads them when it makes its pools
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "modelyard.tuning.worker", study.function, str(to_worker_r),
                 str(from_worker_w), str(log)],
                cwd=study.workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                pass_fds=(to_worker_r, from_worker_w), start_new_session=True,
                preexec_fn=_child_setup(cpus, os.getpid()))
        os.close(to_worker_r)
        os.close(from_worker_w)
        self.slot = slot  # None: a spare any slot may take
        self.log = log
        self._buffer = b""
        self.eof = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fileno(self) -> int:
        return self._from_worker

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        try:
            while data:
                data = data[os.write(self._to_worker, data):]
        except (BrokenPipeError, OSError):
            pass  # it died; its exit is seen by the trial's next poll

    def messages(self) -> list[dict[str, Any]]:
        """Everything it wrote since the last call, parsed."""
        while not self.eof:
            try:
                chunk = os.read(self._from_worker, 65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True
                break
            self._buffer += chunk
        out = []
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_mb(self) -> float:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for fd in (self._to_worker, self._from_worker):
            try:
                os.close(fd)
            except OSError:
                pass


class WorkerPool:
    """The study's warm workers: idle ones bound to a slot, and unbound spares."""

    def __init__(self, study: Study, slots: list[Slot], spares: int = SPARES):
        self.study = study
        self.slots = list(slots)
        self.idle: list[Worker] = []
        self.busy: list[Worker] = []
        self.started = 0
        self.replaced = 0
        self.spares = spares
        self.spare: Worker | None = None
        self._last_replaced: Slot | None = None  # no spare until a worker has been replaced
        for slot in self.slots:
            self._start(slot)

    def _start(self, slot: Slot | None) -> Worker:
        """A worker inside ``slot``; None: a spare inside the share every slot has alike."""
        if slot is not None:
            slot_env, cpus = slot.env(), slot.cpus
        else:
            slot_env = {k: v for k, v in self.slots[0].env().items() if k != "MODELYARD_TRIAL_CPUS"}
            cpus = {c for s in self.slots for c in (s.cpus or ())} or None
        self.started += 1
        worker = Worker(self.study, self.study.job_dir / "workers" / f"worker-{self.started}.log", slot, slot_env,
                        cpus)
        self.idle.append(worker)
        return worker

    def _alike(self) -> bool:
        """Slots that differ only in their cores: a worker imported for one fits the others."""
        shares = {tuple(sorted((k, v) for k, v in s.env().items() if k != "MODELYARD_TRIAL_CPUS"))
                  for s in self.slots}
        return len(shares) == 1 and all(s.kind in ("cpu", "none") for s in self.slots)

    def acquire(self, slot: Slot) -> Worker:
        """The idle worker of ``slot``, else the spare (then a new spare starts warming up), else
        a cold worker started now for ``slot``."""
        for dead in [w for w in self.idle if not w.alive()]:  # e.g. a spare whose import failed
            dead.kill()
            self.idle.remove(dead)
            if dead is self.spare:
                self.spare = None
        worker = next((w for w in self.idle if w.slot == slot and w is not self.spare), None)
        if worker is None and self.spare is not None and self.spare.slot in (None, slot):
            worker, self.spare = self.spare, None
            worker.slot = slot  # its cores follow with the trial (worker.apply_slot)
        if worker is None:
            worker = self._start(slot)
        self.idle.remove(worker)
        self.busy.append(worker)
        self._keep_spare()
        return worker

    def _keep_spare(self) -> None:
        if self.spares and self._last_replaced is not None and self.spare is None:
            self.spare = self._start(None if self._alike() else self._last_replaced)

    def release(self, worker: Worker, healthy: bool) -> None:
        """Back to idle after a clean trial; otherwise killed (the spare takes its slot next)."""
        if worker in self.busy:
            self.busy.remove(worker)
        if healthy and worker.alive() and not worker.eof:
            self.idle.append(worker)
        else:
            worker.kill()
            self.replaced += 1
            self._last_replaced = worker.slot
        self._keep_spare()

    def wait(self, timeout: float) -> None:
        """Sleep until a busy worker writes (a measurement to judge) or ``timeout`` passes."""
        readable = [w for w in self.busy if not w.eof]
        if readable:
            select.select(readable, [], [], timeout)
        else:
            time.sleep(timeout)

    def shutdown(self) -> None:
        for worker in self.idle + self.busy:
            worker.kill()
        self.idle, self.busy = [], []


class FunctionMetrics:
    """The measurements a function trial reported, in TrialMetrics' shape."""

    def __init__(self) -> None:
        self.by_tag: dict[str, dict[int, float]] = {}

    def add(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.by_tag.setdefault(tag, {})[int(step)] = float(value)

    def poll(self) -> None:
        """Measurements arrive with the worker's messages (FunctionTrial.exited)."""

    def series(self, tag: str) -> dict[int, float]:
        return self.by_tag.get(tag, {})

    def reported(self) -> str:
        return f"report(): {', '.join(sorted(self.by_tag))}" if self.by_tag else "nothing (report() was never called)"


@dataclass
class FunctionTrial:
    """A trial running on a warm worker, with TrialProcess' interface for the study loop."""

    number: int
    trial_id: str
    params: dict[str, Any]
    job_dir: Path
    slot: Slot
    worker: Worker
    pool: WorkerPool
    memory_limit_mb: float | None
    metrics: FunctionMetrics = field(default_factory=FunctionMetrics)
    started: float = field(default_factory=time.time)
    stop_reason: str | None = None
    stop_requested: float | None = None
    final: dict[str, float] | None = None
    error: str | None = None
    note: str | None = None  # why the worker was replaced, when it was
    _outcome: str | None = None  # done | pruned | error | died
    _owed: int = 0  # reports waiting for our go/prune
    _killed: bool = False

    @classmethod
    def start(cls, study: Study, number: int, params: dict[str, Any], job_dir: Path, slot: Slot,
              pool: WorkerPool) -> "FunctionTrial":
        trial_id = str(number + 1)
        job_dir.mkdir(parents=True, exist_ok=True)
        with open(job_dir / LOG_NAME, "ab") as log:
            log.write(f"$ function {study.function} {json.dumps(params)}\n".encode())
        worker = pool.acquire(slot)
        base = dict(os.environ)
        env = {k: v for k, v in trial_env(study, trial_id, params, job_dir, slot).items() if base.get(k) != v}
        env["MODELYARD_TRIAL_PARAMS"] = json.dumps(params)  # trial_params() works in a function trial too
        worker.send({"op": "trial", "params": params, "env": env, "workdir": str(study.workdir),
                     "job_dir": str(job_dir), "primary": study.metrics[0].tag, "seed": study.seed,
                     "slot_env": slot.env(), "cpus": sorted(slot.cpus) if slot.cpus else None})
        return cls(number, trial_id, params, job_dir, slot, worker, pool, study.memory_limit_mb)

    @property
    def pid(self) -> int:
        return self.worker.pid

    @property
    def exit_code(self) -> int | None:
        return self.worker.proc.returncode

    def exited(self) -> bool:
        """Reads the worker's messages; True once the trial is over (or its worker is gone)."""
        if self._outcome is not None:
            return True
        for message in self.worker.messages():
            event = message.get("event")
            if event == "report":
                self.metrics.add(message["step"], message["metrics"])
                self._owed += 1
            elif event == "done":
                self.final, self._outcome = message.get("final"), "done"
            elif event == "pruned":
                self._outcome = "pruned"
            elif event == "error":
                self.error, self._outcome = message["error"], "error"
        if self._outcome is None and (self.worker.eof or not self.worker.alive()):
            self.worker.proc.wait()
            code = self.worker.proc.returncode
            self._outcome = "died"
            if not self._killed:
                how = f"exit code {code}" if code >= 0 else f"signal {-code}"
                self.error = f"the worker process ended during the trial ({how}); it was replaced"
        if self._outcome is None and self.memory_limit_mb and self.worker.rss_mb() > self.memory_limit_mb:
            rss = self.worker.rss_mb()
            self._kill(f"worker memory {rss:.0f} MB passed memory_limit_mb {self.memory_limit_mb:g}; it was replaced")
            self.error = self.note
            self._outcome = "died"
        return self._outcome is not None

    def answer(self) -> None:
        """Let the objective go on after the measurements just judged (unless it was stopped)."""
        while self._owed and self.stop_reason is None:
            self.worker.send({"op": "go"})
            self._owed -= 1

    def stop(self, reason: str) -> None:
        """Pruned: the waiting report() raises TrialPruned. Timeout or interrupt: the worker is killed."""
        if self.stop_reason is None:
            self.stop_reason, self.stop_requested = reason, time.time()
        if reason == "pruned":
            if self._owed:
                self.worker.send({"op": "prune"})
                self._owed = 0
        elif reason == "timeout":
            self._kill("it hung past timeout_seconds; its worker was replaced")
        else:
            self._kill(f"{reason}; its worker was stopped")

    def enforce(self, grace: float) -> None:
        """A pruned objective that is still running after the grace period loses its worker."""
        if (self.stop_reason == "pruned" and self._outcome is None and self.stop_requested is not None
                and time.time() - self.stop_requested > grace):
            self._kill(f"kept running {grace:g} s after TrialPruned; its worker was replaced")

    def _kill(self, note: str) -> None:
        if not self._killed:
            self._killed, self.note = True, note
            try:
                os.killpg(self.worker.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def kill_group(self) -> None:
        """The trial is over: its worker goes back to the pool, or is replaced if it is suspect."""
        healthy = self._outcome in ("done", "pruned") and not self._killed
        if healthy and self.memory_limit_mb and self.worker.rss_mb() > self.memory_limit_mb:
            healthy = False  # grown past the limit over its trials: recycled between trials
        if not healthy and self.note is None and self.error:
            self.note = "its worker was replaced"
        self.pool.release(self.worker, healthy)

    def failure(self, timeout: float | None) -> str | None:
        if self.stop_reason == "timeout":
            return f"stopped after timeout_seconds {timeout:g}: {self.note}"
        if self.error:
            return self.error if self._outcome != "error" else f"raised {self.error}; its worker was replaced"
        return None

    def log_tail(self, lines: int = 20) -> str:
        return read_tail(self.job_dir / LOG_NAME, lines)
