"""The study loop: Optuna proposes, trials run as processes on their slots, measurements are
reported per step, pruned trials are killed, results are told back.

Only this process writes the study's database (trials never touch it), so SQLite never
sees two writers. It records who runs each trial (host, pid, process group), which is
what lets a restarted study tell a trial left RUNNING by a killed tuner from one another
host is running: the first is failed and queued again with the same parameters
(Optuna's RetryFailedTrialCallback), so finished trials are kept and interrupted ones re-run.
With a shared database (``--join``) the other hosts' trials are covered by Optuna's
heartbeats: a trial whose tuner stops beating is failed and queued again the same way.
"""
from __future__ import annotations

import json
import logging
import os
import random
import signal
import socket
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from modelyard.tuning import designers, space
from modelyard.tuning.devices import Slot, SlotPool
from modelyard.tuning.forkserver import start_ticks
from modelyard.tuning.runner import TrialProcess
from modelyard.tuning.spec import SpecError, Study
from modelyard.tuning.stopping import MedianPruner

HEARTBEAT_SECONDS = 5
STALE_AFTER_SECONDS = 30

# Heartbeats are driven by hand here (ask/tell, not Study.optimize); Optuna's notes about that
# and about its experimental heartbeat API say nothing a user can act on.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
# A trial interrupted by a dead tuner is queued again with the same parameters, as often as needed.
_RETRY = RetryHeartbeatStaleTrialCallback(max_retry=None)


class StudyFailed(RuntimeError):
    """The study stopped: too many failed trials, or it was interrupted."""


def _with_driver(url: str) -> str:
    """``postgresql://`` means psycopg2 to SQLAlchemy; use psycopg 3 (our dependency) unless
    psycopg2 is there or the URL names a driver."""
    scheme, sep, rest = url.partition("://")
    if scheme in ("postgresql", "postgres") and sep:
        try:
            import psycopg2  # noqa: F401
        except ImportError:
            return f"postgresql+psycopg://{rest}"
        return f"postgresql://{rest}"
    return url


def _fast_commits(storage: RDBStorage) -> None:
    """SQLite in WAL mode with synchronous=NORMAL: a commit no longer waits for fsync (20 ms and
    more on a busy disk, several per trial step), and a process killed with -9 still loses
    nothing committed; only a power cut may lose the last commits. Readers (``tune status``)
    keep reading while the tuner writes."""
    from sqlalchemy import event, text

    def on_connect(connection, _record) -> None:
        connection.execute("PRAGMA synchronous=NORMAL")

    event.listen(storage.engine, "connect", on_connect)
    storage.engine.dispose()  # connections made before the listener reconnect with it
    with storage.engine.connect() as connection:
        connection.execute(text("PRAGMA journal_mode=WAL"))  # kept in the file


def open_storage(url: str) -> RDBStorage:
    """The study's database (SQLite file or PostgreSQL URL), with trial heartbeats on."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    kwargs: dict[str, Any] = {}
    url = _with_driver(url)
    if url.startswith("sqlite"):
        Path(url.split("///", 1)[-1]).parent.mkdir(parents=True, exist_ok=True)
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 30}}
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    for attempt in range(6):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = RDBStorage(url, heartbeat_interval=HEARTBEAT_SECONDS, grace_period=STALE_AFTER_SECONDS,
                                     heartbeat_stale_trial_callback=_RETRY, **kwargs)
            if url.startswith("sqlite"):
                _fast_commits(storage)
            return storage
        except (IntegrityError, ProgrammingError, OperationalError) as exc:
            # Processes opening a new database at once (hosts joining one study; `tune status`
            # or a reader while the tuner starts) race to create Optuna's tables; the loser
            # finds them made on the next try. SQLite says so as "table ... already exists".
            if attempt == 5 or (isinstance(exc, OperationalError) and "already exists" not in str(exc)):
                raise
            time.sleep(0.3 + random.random())
    raise AssertionError("unreachable")


def _sampler(study: Study, existing: int, join: bool) -> optuna.samplers.BaseSampler:
    # Offset by the trials already there, so a resumed seeded study does not redraw them;
    # hosts joining one study draw independently (the same seed would propose the same points).
    seed = None if study.seed is None or join else study.seed + existing
    return designers.sampler(study.algorithm, seed)  # grid points are enqueued up front


def _pruner(study: Study) -> optuna.pruners.BasePruner:
    stopping = study.stopping
    if stopping is None:
        return optuna.pruners.NopPruner()
    if stopping["method"] == "median":  # the rule Vizier studies' checkTrialEarlyStoppingState applies
        return MedianPruner(min_completed=stopping["min_completed_trials"],
                            min_measurements=stopping["min_measurements"])
    return optuna.pruners.HyperbandPruner(min_resource=stopping["min_resource"],
                                          max_resource=stopping["max_resource"],
                                          reduction_factor=stopping["reduction_factor"])


def load_study(study: Study, storage: RDBStorage | None = None, create: bool = True,
               join: bool = False) -> optuna.Study:
    """Open (or create) the Optuna study for a study file; refuse one made from another space."""
    storage = storage or open_storage(study.storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    if not create and study.name not in names:
        raise SpecError(f"no study {study.name!r} in {study.storage} yet; run `modelyard tune {study.path}` first")
    existing = len(storage.get_all_trials(storage.get_study_id_from_name(study.name))) if study.name in names else 0
    ostudy = optuna.create_study(
        study_name=study.name, storage=storage, directions=[m.direction for m in study.metrics],
        sampler=_sampler(study, existing, join), pruner=_pruner(study), load_if_exists=True,
    )
    recorded = ostudy.user_attrs.get("spec")
    if recorded is None and create:
        ostudy.set_user_attr("spec", study.fingerprint)
        if study.image_uri:
            ostudy.set_user_attr("image_uri", study.image_uri)
        if study.algorithm == "grid":
            for point in space.grid(study.params)[:study.max_trials]:
                ostudy.enqueue_trial(point, skip_if_exists=False)
    elif recorded is not None and json.loads(json.dumps(recorded)) != json.loads(json.dumps(study.fingerprint)):
        raise SpecError(f"study {study.name!r} in {study.storage} was made from different metrics, parameters or "
                        f"algorithm; give this study a new display_name or delete its database to start over")
    return ostudy


def retried_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Trials that do not count: interrupted and queued again (their FAIL is not the trial's
    fault), or asked for by a joined host after the budget was already taken (``excess``)."""
    return ({n for t in trials for n in t.system_attrs.get("retry_history", [])}
            | {t.number for t in trials if t.user_attrs.get("excess")})


def _used(trial: FrozenTrial) -> bool:
    return trial.state != TrialState.WAITING


def counts(trials: list[FrozenTrial]) -> dict[str, int]:
    retried = retried_numbers(trials)
    real = [t for t in trials if t.number not in retried]
    by_state = {state: sum(t.state == state for t in real) for state in TrialState}
    return {
        "complete": by_state[TrialState.COMPLETE], "pruned": by_state[TrialState.PRUNED],
        "failed": by_state[TrialState.FAIL], "running": by_state[TrialState.RUNNING],
        "waiting": by_state[TrialState.WAITING],
        "used": by_state[TrialState.COMPLETE] + by_state[TrialState.PRUNED] + by_state[TrialState.FAIL]
        + by_state[TrialState.RUNNING],
    }


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{start_ticks(os.getpid())}"


def _owner_alive(owner: str) -> bool:
    host, pid, ticks = (owner.split(":") + ["", "", ""])[:3]
    if host != socket.gethostname():
        return True  # another host's tuner: its heartbeat decides
    return pid.isdigit() and str(start_ticks(int(pid))) == ticks


def _kill_leftovers(pgid: int, trial_id: str, study_name: str) -> None:
    """SIGKILL processes still in a dead tuner's trial group (checked by their environment,
    so a reused group id never hits a stranger)."""
    marks = (f"MODELYARD_TRIAL_ID={trial_id}\0".encode(), f"MODELYARD_STUDY={study_name}\0".encode())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            environ = (entry / "environ").read_bytes()
        except (OSError, ProcessLookupError):
            continue
        if all(mark in environ for mark in marks):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _select(series: dict[int, float], selection: str, maximize: bool) -> float:
    if selection == "LAST_MEASUREMENT":
        return series[max(series)]
    return max(series.values()) if maximize else min(series.values())


class Tuner:
    """Runs one study to its end (or joins one other hosts are running)."""

    def __init__(self, study: Study, slots: list[Slot], on_event: Callable[[str, dict[str, Any]], None],
                 poll_interval: float = 0.2, grace: float = 3.0, export_model: bool = False, join: bool = False,
                 warm: tuple[Any, Any] | None = None):
        self.study = study
        self.pool = SlotPool(slots, study.parallel)
        self.on_event = on_event
        self.poll_interval, self.grace, self.export_model = poll_interval, grace, export_model
        self.storage = open_storage(study.storage)
        self.ostudy = load_study(study, self.storage, join=join)
        self.running: dict[int, tuple[optuna.Trial, TrialProcess, int]] = {}  # number -> trial, proc, last step reported
        self.owner = _owner()
        self._stop_signal: int | None = None
        self._last_beat = 0.0
        self._single_host = study.storage.startswith("sqlite")
        # Function trials' workers or warm command trials' fork server (tuning.warm.start_warm): given
        # when the caller started them before opening the study, so they import meanwhile.
        if warm is None:
            from modelyard.tuning.warm import start_warm

            warm = start_warm(study, self.pool.free)
        self.workers, self.forkserver = warm

    # -- resume -------------------------------------------------------------------------------
    def recover(self) -> list[int]:
        """Fail and re-queue the trials a dead tuner on this host left RUNNING."""
        recovered = []
        for frozen in self.ostudy.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = frozen.user_attrs.get("owner")
            if owner is None:
                # Killed between ask() and recording its owner: no process was started.
                started = frozen.datetime_start.timestamp() if frozen.datetime_start else 0
                if time.time() - started < STALE_AFTER_SECONDS and not self._single_host:
                    continue
            elif _owner_alive(owner):
                continue
            pgid = frozen.user_attrs.get("pgid")
            if pgid:
                _kill_leftovers(int(pgid), frozen.user_attrs.get("trial_id", ""), self.study.name)
            if self.storage.set_trial_state_values(frozen._trial_id, TrialState.FAIL):
                _RETRY(self.ostudy, self.storage.get_trial(frozen._trial_id))
                recovered.append(frozen.number)
        optuna.storages.fail_stale_trials(self.ostudy)
        return recovered

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> dict[str, int]:
        """Run trials until max_trial_count are done; returns the final counts."""
        recovered = self.recover()
        if recovered:
            self.on_event("resumed", {"rerun": recovered})
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while True:
                trials = self.ostudy.get_trials(deepcopy=False)
                tally = counts(trials)
                stopping = self._stop_signal is not None or tally["failed"] >= self.study.max_failed
                if not stopping:
                    while self.pool.free and tally["used"] < self.study.max_trials:
                        self._launch()
                        tally["used"] += 1
                if not self.running and (stopping or tally["used"] >= self.study.max_trials):
                    if tally["running"] == 0 or stopping:
                        break
                    time.sleep(self.poll_interval)  # joined: other hosts' trials still running
                    continue
                # A trial that ended frees its slot: the next one is drawn and started at once, not
                # after another poll interval (that wait was most of the gap between two trials).
                if not self._poll():
                    self._wait()
                # Every slot busy: nothing to launch until a trial ends, so the study is not read
                # again meanwhile (function trials wake this loop at every step they report).
                while self.running and not self.pool.free and self._stop_signal is None:
                    if not self._poll():
                        self._wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.workers is not None:
                self.workers.shutdown()
            if self.forkserver is not None:
                self.forkserver.shutdown()
        tally = counts(self.ostudy.get_trials(deepcopy=False))
        if self._stop_signal is not None:
            raise StudyFailed(f"interrupted by signal {self._stop_signal}; run the same command to resume")
        if tally["failed"] >= self.study.max_failed:
            from modelyard.tuning.advice import stopped_study

            raise StudyFailed(stopped_study(self.study, self.ostudy.get_trials(deepcopy=False), tally["failed"]))
        return tally

    def _wait(self) -> None:
        if self.workers is not None:
            # A function trial waits in report() for the pruner's word: wake as soon as it reports.
            self.workers.wait(self.poll_interval)
        elif self.forkserver is not None:
            # A warm trial's exit arrives from its server: the next trial starts without a poll's wait.
            self.forkserver.wait(self.poll_interval)
        else:
            time.sleep(self.poll_interval)

    def _on_signal(self, signum: int, frame) -> None:
        self._stop_signal = signum
        for _, proc, _ in self.running.values():
            proc.stop("interrupted")

    def _launch(self) -> None:
        trial = self.ostudy.ask()
        # Only hosts sharing a study can race for its last trials; one tuner on SQLite counted them itself.
        if not self._single_host and self._over_budget(trial):
            return
        slot = self.pool.take()
        params = space.suggest(trial, self.study.params)
        trial_id = str(trial.number + 1)
        job_dir = self.study.job_dir / f"trial-{trial.number + 1:04d}"
        # The owner before the start (a restarted tuner tells its dead predecessor's trials by it); the
        # rest of the trial's record after, so the trial starts without waiting for those writes.
        trial.set_user_attr("owner", self.owner)
        started = time.time()
        try:
            if self.workers is not None:
                from modelyard.tuning.workers import FunctionTrial

                proc = FunctionTrial.start(self.study, trial.number, params, job_dir, slot, self.workers)
            else:
                proc = TrialProcess.start(self.study, trial.number, params, job_dir, slot, self.export_model,
                                          self.forkserver)
        except OSError as exc:
            self.pool.give_back(slot)
            what = self.study.function or self.study.command[0]
            trial.set_user_attr("params", params)
            trial.set_user_attr("error", f"could not start {what}: {exc}")
            self.ostudy.tell(trial, state=TrialState.FAIL)
            self.on_event("failed", {"number": trial.number, "error": str(exc)})
            return
        # The process group first: a tuner killed between these writes leaves recover() what it must kill.
        record = {"pgid": proc.pid, "params": params, "job_dir": str(job_dir), "trial_id": trial_id,
                  "device": slot.describe(), "started": started}
        if self.workers is not None:
            record["worker_pid"] = proc.pid
        for key, value in record.items():
            trial.set_user_attr(key, value)
        self.storage.record_heartbeat(trial._trial_id)
        self.running[trial.number] = (trial, proc, -1)
        self.on_event("started", {"number": trial.number, "params": params, "device": slot.describe(),
                                  "job_dir": str(job_dir)})

    def _over_budget(self, trial: optuna.Trial) -> bool:
        """Hosts sharing a study may both see room for one more trial; the trial numbers the
        database hands out decide: a trial is run only if fewer than max_trial_count counted
        trials come before it. The other is closed as ``excess`` and not counted."""
        trials = self.ostudy.get_trials(deepcopy=False)
        skip = retried_numbers(trials)
        before = sum(1 for t in trials if t.number < trial.number and t.number not in skip and _used(t))
        if before < self.study.max_trials:
            return False
        trial.set_user_attr("excess", True)
        self.ostudy.tell(trial, state=TrialState.FAIL)
        return True

    def _poll(self) -> bool:
        """Read every running trial's news, judge it, finish those that ended; True if one did."""
        ended = False
        beat = time.time() - self._last_beat >= HEARTBEAT_SECONDS / 2
        if beat:
            self._last_beat = time.time()
            optuna.storages.fail_stale_trials(self.ostudy)
        for number in list(self.running):
            trial, proc, last_step = self.running[number]
            if beat:
                self.storage.record_heartbeat(trial._trial_id)
            exited = proc.exited()  # asked before reading, so nothing written before exit is missed
            proc.metrics.poll()
            last_step = self._report(trial, proc, last_step, exited)
            self.running[number] = (trial, proc, last_step)
            if not exited:
                proc.answer()
            if exited:
                self._finish(trial, proc)
                ended = True
                continue
            if proc.stop_reason:
                proc.enforce(self.grace)
            elif self.study.timeout and time.time() - proc.started > self.study.timeout:
                proc.stop("timeout")
        return ended

    def _report(self, trial: optuna.Trial, proc: TrialProcess, last_step: int, exited: bool) -> int:
        series = proc.metrics.series(self.study.metrics[0].tag)
        new = sorted(step for step in series if step > last_step)
        multi = len(self.study.metrics) > 1
        # A trial that has already finished keeps its result: stopping it would save nothing.
        judge = bool(self.study.stopping) and not exited
        for step in new:
            if not multi:
                trial.report(series[step], step)
            self.on_event("measurement", {"number": trial.number, "step": step, "value": series[step]})
            # The pruner is asked after every step, not once per poll: a poll often finds several
            # epochs of a fast trial, and Optuna's pruners judge only the last step reported. Asked
            # once, Hyperband would record a later epoch's value as the trial's value at a rung (an
            # edge over trials read promptly) and the median rule would skip the steps in between;
            # asked per step, every trial is judged at the same steps, however it was read.
            if judge and proc.stop_reason is None and trial.should_prune():
                proc.stop("pruned")
                trial.set_user_attr("pruned_at", proc.stop_requested)
                trial.set_user_attr("pruned_at_step", step)
                self.on_event("pruning", {"number": trial.number, "step": step})
        if new and multi:
            # Optuna keeps no per-step values for multi-objective trials; the table's curve is kept here.
            trial.set_user_attr("curve", {str(step): series[step] for step in sorted(series)})
        return new[-1] if new else last_step

    def _finish(self, trial: optuna.Trial, proc: TrialProcess) -> None:
        proc.kill_group()
        del self.running[trial.number]
        self.pool.give_back(proc.slot)
        code = proc.exit_code
        trial.set_user_attr("exited_at", time.time())
        trial.set_user_attr("seconds", round(time.time() - proc.started, 3))
        trial.set_user_attr("exit_code", code)
        info: dict[str, Any] = {"number": trial.number, "exit_code": code}
        if proc.note:
            trial.set_user_attr("note", proc.note)
            info["note"] = proc.note
        if proc.stop_reason == "pruned":
            self.ostudy.tell(trial, state=TrialState.PRUNED)
            self.on_event("pruned", info)
            return
        if proc.stop_reason == "interrupted":
            self.ostudy.tell(trial, state=TrialState.FAIL)
            _RETRY(self.ostudy, self.storage.get_trial(trial._trial_id))
            self.on_event("interrupted", info)
            return
        error = proc.failure(self.study.timeout)
        values = []
        if error is None:
            for metric in self.study.metrics:
                if proc.final and metric.tag in proc.final:  # a function trial's return value
                    values.append(proc.final[metric.tag])
                    continue
                series = proc.metrics.series(metric.tag)
                if not series:
                    error = (f"metric {metric.tag!r} was never reported; the trial reported "
                             f"{proc.metrics.reported()}")
                    break
                values.append(_select(series, self.study.selection, metric.goal == "MAXIMIZE"))
        if error is not None:
            tail = proc.log_tail()
            trial.set_user_attr("error", error)
            trial.set_user_attr("log_tail", tail)
            self.ostudy.tell(trial, state=TrialState.FAIL)
            self.on_event("failed", {**info, "error": error, "log_tail": tail})
            return
        self.ostudy.tell(trial, values)
        self.on_event("complete", {**info, "values": values})
