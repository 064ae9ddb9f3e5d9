"""Runs every job (batch prediction, custom training, tuning) as a supervised child process.

The store is the queue: a create request writes a ``JOB_STATE_PENDING`` row, a cancel request
moves a row to ``JOB_STATE_CANCELLING``; the runner of the leading platform (one per store) turns
those rows into processes on each tick. A job's child is ``python -m modelyard.platform.jobs.job_child
WORK_DIR`` in its own session, so a crash of the job never takes the platform down, cancel is
SIGTERM to its whole process group (SIGKILL after a grace period), and a platform that stops
leaves it running: the next platform adopts it by pid (checked against its command line), or,
if it died meanwhile, starts it again when its kind can resume (batch prediction, tuning) and
fails it otherwise. The child writes ``result.json`` when it ends; no result means it crashed,
and the job fails with the tail of its log.

A custom job whose one replica is a TensorFlow Python command (a ``modelyard train`` config) is
forked from the platform's warm interpreter instead (``warm_jobs``); its processes are found by the
pids recorded in its work dir as well as by ``MODELYARD_JOB_ID``, since a forked process's
environment, as /proc shows it, is its server's. A job that cannot start warm says why in its log.

Every job runs under ``job_limits`` (processes, memory, file size), applied to its first process as soon
as it exists; a job that fails says which limit it met, or that the disk was full. Cancelling never
waits for the disk: the cancel request signals the job at once (``cancel_now``), and when the store
cannot record the cancel (its disk full even after its reserve), the runner keeps the request in memory
and ends the job as cancelled as soon as the store takes it; an end the store refused is kept
(``_ending``) and written on a later tick, never decided again.
"""
from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from modelyard.platform.api.errors import ApiError
from modelyard.platform.jobs import job_identity, job_limits, warm_jobs
from modelyard.platform.state.store import DiskFull, Store
from modelyard.tuning.forkserver import read_pids, recorded_pids, start_ticks

log = logging.getLogger(__name__)

PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLING, CANCELLED = (
    "JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
    "JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED")
ACTIVE = (PENDING, RUNNING, CANCELLING)
TERMINAL = (SUCCEEDED, FAILED, CANCELLED)

JOB_FILE, RESULT_FILE, LOG_FILE = "job.json", "result.json", "log.txt"
JOB_ID_ENV = "MODELYARD_JOB_ID"
CANCEL_GRACE_S = 10.0
MAX_RUNS = 3  # child processes a resumable job may take (restarts after platform stops) before it fails
PROGRESS_INTERVAL_S = 1.0
RELEASE_INTERVAL_S = 60.0  # how often cgroups that ended jobs left behind are looked for

# Job collection -> the module that validates it (platform side) and runs it (``execute``, child side).
MODULES = {
    "batchPredictionJobs": "modelyard.platform.jobs.batch_jobs",
    "customJobs": "modelyard.platform.jobs.custom_jobs",
    "hyperparameterTuningJobs": "modelyard.platform.jobs.tuning_jobs",
    "trainingPipelines": "modelyard.platform.jobs.training_pipelines",
}


def kind_module(collection: str):
    """The module of a job collection; UNIMPLEMENTED when this build has none for it."""
    try:
        return importlib.import_module(MODULES[collection])
    except (KeyError, ModuleNotFoundError):
        raise ApiError("UNIMPLEMENTED", f"{collection} are not supported by this modelyard platform.") from None


class JobFailed(Exception):
    """Raised in a job's child: the job ran and failed; ``status`` is the google.rpc code name of its error.
    (Here rather than in job_child, which runs as ``__main__`` and so is a different module object.)"""

    def __init__(self, message: str, status: str = "INTERNAL") -> None:
        super().__init__(message)
        self.status = status


def write_json(path: Path, data: dict) -> None:
    """Replace ``path`` atomically: the runner never reads half a result."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def log_tail(work_dir: Path, limit: int = 2000) -> str:
    try:
        with open(work_dir / LOG_FILE, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


class JobRunner:
    """Starts, watches, cancels and adopts job processes for the rows of one store.

    A kind's module may define ``RESUMABLE`` (bool) and ``progress(work_dir, row) -> dict | None``
    (fields merged into the row's result while it runs); a kind with ``follow(runner, row)`` runs no
    process: each tick calls it instead (a pipeline following the job it made). ``platform`` (set by
    the Platform) is what ``call_platform`` hands such a kind for work done through the API's code.
    ``engine`` (``{"name": "ray", "address": ...}`` under ``--engine ray``) reaches each job's child
    in its job.json: where a custom job's replicas run. A kind with ``warm_blocker(spec, engine,
    work_dir) -> str | None`` (``spec``: the row's) may start from the warm interpreter (warm_jobs) when it returns None.
    """

    def __init__(self, store: Store, state_dir: Path, is_leader: Callable[[], bool],
                 interval_s: float = 0.25, engine: dict | None = None,
                 limits: job_limits.JobLimits | None = None) -> None:
        self.store = store
        self.limits = limits if limits is not None else job_limits.default_limits(state_dir)
        self.engine = engine
        self.root = state_dir / "jobs"
        self.is_leader = is_leader
        self.interval_s = interval_s
        self._procs: dict[str, subprocess.Popen] = {}
        self._signalled: dict[str, float] = {}
        self._progress_at: dict[str, float] = {}
        self._wake = asyncio.Event()
        self.platform = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.warm = warm_jobs.WarmJobs(state_dir)
        self.tasks = warm_jobs.WarmJobs(state_dir, tensorflow=False)  # pipeline tasks' task server
        self._exit_fds: dict[str, int] = {}  # job id -> pidfd of its process (the loop wakes on its exit)
        self._cold_because: dict[str, str | None] = {}  # job id -> why it cannot start warm (None: it can)
        self._cancel_wanted: set[str] = set()  # cancelled while the store could not record it
        self._released_at = float("-inf")  # when cgroups of ended jobs were last looked for
        self._ending: dict[str, tuple[str, dict | None, dict | None]] = {}  # ended, not yet recorded

    def ended(self, job_id: str) -> bool:
        """The job has ended here, its end not recorded yet (the store refused it): it may be deleted."""
        return job_id in self._ending

    def forget(self, job_id: str) -> None:
        """The job's row is deleted: nothing of it is left to record."""
        self._ending.pop(job_id, None)
        self._cancel_wanted.discard(job_id)

    def cancel_now(self, row: dict) -> None:
        """A cancel request for an active job, before anything is written: SIGTERM to its process group
        now (a job filling the disk stops first), and the runner treats it as cancelling from now on,
        whether or not the store takes its CANCELLING state; its end is recorded as soon as it can be."""
        self._cancel_wanted.add(row["id"])
        if row["id"] not in self._signalled:
            self._signal(row)
        self.wake()
    def work_dir(self, job_id: str) -> Path:
        return self.root / job_id

    def wake(self) -> None:
        """Tick now (a job was created or cancelled) rather than at the next interval."""
        self._wake.set()

    def call_platform(self, work, timeout: float = 600.0):
        """``await work(platform)`` on the platform's event loop, from the runner's thread; its result."""
        if self.platform is None or self._loop is None:
            raise ApiError("INTERNAL", "the job runner has no platform to call")
        return asyncio.run_coroutine_threadsafe(work(self.platform), self._loop).result(timeout)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        while True:
            try:
                if self.is_leader():
                    await asyncio.to_thread(self.tick)
            except Exception:  # the runner must outlive any one bad tick
                log.exception("job runner tick failed")
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    def tick(self) -> None:
        self.store.keep_reserve()  # the full-disk reserve comes back once there is room
        rows = self.store.list_jobs(states=ACTIVE)
        now = time.monotonic()
        if now - self._released_at > RELEASE_INTERVAL_S:
            self._released_at = now
            job_limits.release_stale({row["id"] for row in rows})
        # Jobs with processes first, then the kinds that follow them (a pipeline, a training pipeline): a
        # job that ends in this tick is seen by what follows it in the same tick (its next task started).
        rows.sort(key=_follows)
        for row in rows:
            try:
                self._step(row)
            except Exception:
                log.exception("job %s: supervising step failed", row["id"])

    # ---- one job --------------------------------------------------------------------------------
    def _step(self, row: dict) -> None:
        job_id, state = row["id"], row["state"]
        if job_id in self._ending:  # ended; the store refused the end before: write it again
            try:
                self._record_end(row, *self._ending[job_id])
            except DiskFull:  # said once already (by _end); tried again on the next tick
                pass
            return
        if job_id in self._cancel_wanted:  # the store could not take the cancel yet: act on it anyway
            if state == PENDING:
                self._end(row, CANCELLED, _cancelled())
                return
            row, state = {**row, "state": CANCELLING}, CANCELLING
        follow = getattr(kind_module(row["kind"]), "follow", None)
        if follow is not None:
            follow(self, row)
            return
        if state == PENDING:
            if self._warm_blocker(row) is None and self.warm.hold(job_id):
                return  # the warm interpreter is importing TensorFlow: faster than a cold start's own import
            if self._warm_blocker(row) is not None and warm_jobs.task_blocker(row, self.engine) is None \
                    and self.tasks.hold(job_id):
                return  # a pipeline task: the task server is importing what its process would import
            if self.store.update_job(job_id, (PENDING,), state=RUNNING, started=time.time()):
                self._spawn(row)
            return
        if self._alive(row):
            if state == CANCELLING:
                self._signal(row)
            self._progress(row)
            return
        self._finished(row)

    def _warm_blocker(self, row: dict) -> str | None:
        """Why the job cannot start from the warm interpreter (None: it can); asked once per job."""
        hook = getattr(kind_module(row["kind"]), "warm_blocker", None)
        if hook is None:
            return "its kind does not start from the warm interpreter"
        if row["id"] not in self._cold_because:
            try:
                why = hook(row["spec"], self.engine, self.work_dir(row["id"]))
            except Exception as exc:  # a spec the job's own process will refuse, saying why
                why = f"its spec: {exc}"
            self._cold_because[row["id"]] = why
        return self._cold_because[row["id"]]

    def _spawn(self, row: dict) -> None:
        job_id = row["id"]
        work_dir = self.work_dir(job_id)
        work_dir.mkdir(parents=True, exist_ok=True)
        (work_dir / RESULT_FILE).unlink(missing_ok=True)
        (work_dir / warm_jobs.PIDS_FILE).unlink(missing_ok=True)
        storage_root = getattr(getattr(self.platform, "config", None), "storage_root", None)
        # The job's own token (behind --auth-token), handed out by its metadata server (job_identity).
        token = job_identity.issue_token(getattr(getattr(self.platform, "config", None), "auth_token", None),
                                    _job_name(row))
        write_json(work_dir / JOB_FILE, {"id": job_id, "kind": row["kind"], "parent": row["parent"],
                                         "displayName": row["display_name"], "spec": row["spec"],
                                         "run": row["runs"] + 1, "engine": self.engine,
                                         "storageRoot": str(storage_root) if storage_root else None,
                                         "token": token})
        argv = [sys.executable, "-m", "modelyard.platform.jobs.job_child", str(work_dir)]
        # MODELYARD_JOB_ID is inherited by every process the job starts: how leftovers are found.
        env = {**job_identity.without_admin_token(os.environ, token), JOB_ID_ENV: job_id}
        proc = None
        try:
            if getattr(kind_module(row["kind"]), "warm_blocker", None) is not None:
                why = self._warm_blocker(row)
                if why is None:
                    proc, why = self.warm.spawn(job_id, argv, env, work_dir, work_dir / LOG_FILE)
                elif warm_jobs.task_blocker(row, self.engine) is None:  # a pipeline task: the task server's
                    proc, why = self.tasks.spawn(job_id, argv, env, work_dir, work_dir / LOG_FILE)
                if proc is None:
                    with open(work_dir / LOG_FILE, "a") as logf:
                        logf.write(f"[modelyard] cold start (not from the platform's warm interpreter): {why}\n")
            if proc is None:
                with open(work_dir / LOG_FILE, "ab") as logf:
                    proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            cwd=work_dir, start_new_session=True, env=env)
        except OSError as exc:
            self._end(row, FAILED, ApiError("INTERNAL", f"could not start the job's process: {exc}"))
            return
        self._procs[job_id] = proc
        self._watch(job_id, proc.pid)
        try:
            applied = job_limits.apply(self.limits, job_id, proc.pid)
            with open(work_dir / LOG_FILE, "a") as logf:
                logf.write(f"[modelyard] limits: {'; '.join(applied) or 'none'}\n")
        except OSError as exc:
            log.warning("job %s: its limits could not all be applied: %s", job_id, exc)
        self._cold_because.pop(job_id, None)
        self.store.update_job(job_id, pid=proc.pid, runs=row["runs"] + 1, work_dir=str(work_dir))
        log.info("job %s (%s) started as pid %d (run %d)", job_id, row["kind"], proc.pid, row["runs"] + 1)

    def _watch(self, job_id: str, pid: int) -> None:
        """Wake the runner when the job's process exits (a pidfd on the event loop), not an interval later."""
        loop = self._loop
        if loop is None or not hasattr(os, "pidfd_open"):
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already, or a kernel without pidfds: the interval finds it
            return

        def add() -> None:
            self._unwatch_now(job_id)
            self._exit_fds[job_id] = fd
            loop.add_reader(fd, exited)

        def exited() -> None:
            self._unwatch_now(job_id)
            self._wake.set()

        loop.call_soon_threadsafe(add)

    def _unwatch_now(self, job_id: str) -> None:
        """(On the event loop.) Stop watching the job's process."""
        fd = self._exit_fds.pop(job_id, None)
        if fd is not None:
            self._loop.remove_reader(fd)
            os.close(fd)

    def _alive(self, row: dict) -> bool:
        proc = self._procs.get(row["id"])
        if proc is not None:
            if proc.poll() is None and not isinstance(proc, subprocess.Popen) and start_ticks(proc.pid) is None:
                # A forked job process that has exited: its account (result.json) is all its end needs;
                # without one, its status, which its server reports within its poll, says how it died.
                if (self.work_dir(row["id"]) / RESULT_FILE).exists():
                    return False
                try:
                    proc.wait(1.0)
                except subprocess.TimeoutExpired:
                    pass
            return proc.poll() is None
        return row["pid"] is not None and _is_job_process(row["pid"], self.work_dir(row["id"]))

    def _signal(self, row: dict) -> None:
        proc = self._procs.get(row["id"])
        pid = proc.pid if proc is not None else row["pid"]
        if pid is None:
            return
        sent = self._signalled.get(row["id"])
        now = time.monotonic()
        if sent is None:
            self._signalled[row["id"]] = now
            _killpg(pid, signal.SIGTERM)
        elif now - sent > CANCEL_GRACE_S:
            _killpg(pid, signal.SIGKILL)

    def _progress(self, row: dict) -> None:
        hook = getattr(kind_module(row["kind"]), "progress", None)
        now = time.monotonic()
        if hook is None or now - self._progress_at.get(row["id"], 0.0) < PROGRESS_INTERVAL_S:
            return
        self._progress_at[row["id"]] = now
        fields = hook(self.work_dir(row["id"]), row)
        if fields:
            self.store.update_job(row["id"], (RUNNING, CANCELLING), result={**(row["result"] or {}), **fields},
                                  use_reserve=False)  # progress can wait: the reserve is for ends and cancels

    def _finished(self, row: dict) -> None:
        job_id = row["id"]
        proc = self._procs.pop(job_id, None)
        if job_id in self._exit_fds and self._loop is not None:
            self._loop.call_soon_threadsafe(self._unwatch_now, job_id)
        # Whatever the job left behind (batch workers, replicas and trials in their own sessions).
        _kill_leftovers(job_id, self.work_dir(job_id))
        self._signalled.pop(job_id, None)
        self._progress_at.pop(job_id, None)
        work_dir = self.work_dir(job_id)
        result = _read_result(work_dir)
        if result is not None:
            state = result.pop("state")
            error = result.pop("error", None)
            if row["state"] == CANCELLING and state != SUCCEEDED:
                state, error = CANCELLED, _cancelled()
            elif state == FAILED:  # the job's own account, and which of its limits it met (if any)
                met = job_limits.why(self.limits, job_id, None, log_tail(work_dir), work_dir)
                if met:
                    error = {**(error or {}), "code": 8,  # RESOURCE_EXHAUSTED
                             "message": f"{met}; {(error or {}).get('message', '')}".rstrip("; ")}
            self._end(row, state, error, result)
        elif row["state"] == CANCELLING:
            self._end(row, CANCELLED, _cancelled())
        elif proc is None and getattr(kind_module(row["kind"]), "RESUMABLE", False) and row["runs"] < MAX_RUNS:
            # The platform stopped while the job ran and the job's process is gone: the same command resumes it.
            log.warning("job %s: its process is gone; starting it again to resume (run %d)", job_id, row["runs"] + 1)
            self._spawn(row)
        else:
            how = (f"exited with code {proc.returncode}" if proc is not None and proc.returncode >= 0 else
                   f"was killed by signal {-proc.returncode}" if proc is not None else
                   "was lost while the platform was stopped")
            tail = log_tail(work_dir)
            met = job_limits.why(self.limits, job_id, proc.returncode if proc is not None else None, tail, work_dir)
            status = "RESOURCE_EXHAUSTED" if met else "INTERNAL"
            self._end(row, FAILED, ApiError(status, f"the job's process {how}" + (f": {met}" if met else "")
                                            + (f"; log tail:\n{tail}" if tail else "")))

    def _end(self, row: dict, state: str, error, result: dict | None = None) -> None:
        if isinstance(error, ApiError):
            error = error.to_rpc_status()
        merged = {**(row["result"] or {}), **(result or {})}
        self._ending[row["id"]] = (state, error, merged)  # decided once: a refused write is retried, not redone
        job_identity.end_tokens(_job_name(row))  # the job's own token stops working with it
        self._record_end(row, state, error, merged)

    def _record_end(self, row: dict, state: str, error: dict | None, result: dict | None) -> None:
        self.store.update_job(row["id"], ACTIVE, state=state, error=error, result=result,
                              ended=time.time(), pid=None)
        del self._ending[row["id"]]
        self._cancel_wanted.discard(row["id"])
        job_limits.release(row["id"])  # after job_limits.why read its counters
        self.wake()  # what follows this job (a pipeline's task, a training pipeline) sees its end at once
        log.info("job %s ended: %s%s", row["id"], state, f" ({error.get('message', '')[:200]})" if error else "")


def _follows(row: dict) -> bool:
    """The row's kind follows other jobs (``follow``) rather than running a process of its own."""
    try:
        return hasattr(kind_module(row["kind"]), "follow")
    except ApiError:  # its step says so
        return False


def _job_name(row: dict) -> str:
    return f"{row['parent']}/{row['kind']}/{row['id']}"


def _cancelled() -> dict:
    # What Vertex AI reports for a cancelled job: google.rpc.Code CANCELLED.
    return ApiError("CANCELLED", "CANCELED").to_rpc_status()


def _read_result(work_dir: Path) -> dict | None:
    try:
        return json.loads((work_dir / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None


def _killpg(pid: int | None, sig: int) -> None:
    if pid is None:
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_leftovers(job_id: str, work_dir: Path | None = None) -> int:
    """SIGKILL every process still carrying this job's id in its environment, and those forked for it
    from a warm interpreter (recorded in ``work_dir``) with what they forked in turn (their process
    group, born after them); returns how many."""
    mark = f"{JOB_ID_ENV}={job_id}\0".encode()
    warm = read_pids(work_dir / warm_jobs.PIDS_FILE) if work_dir is not None else {}
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if not _forked_for(int(entry), warm):
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark not in f.read():
                        continue
            os.kill(int(entry), signal.SIGKILL)
            killed += 1
        except (OSError, ProcessLookupError):
            continue
    if killed:
        log.warning("job %s: killed %d process(es) it left behind", job_id, killed)
    return killed


def _forked_for(pid: int, warm: dict[int, int]) -> bool:
    """``pid`` is one of ``warm`` (recorded pid -> start ticks; not a recycled pid), or in the process
    group of one (running or not: its group outlives it) and started after it."""
    if not warm:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().rsplit(b")", 1)[1].split()
        group, start = int(stat[3]), int(stat[19])
    except (OSError, IndexError, ValueError):
        return False
    return warm.get(pid) == start or (group in warm and start >= warm[group])


def _is_job_process(pid: int, work_dir: Path) -> bool:
    """``pid`` is alive (not a zombie) and is this job's child, not a recycled pid: its command line
    names the job's work dir, or (forked from the warm interpreter) the work dir records it."""
    if any(p == pid for p, _ in recorded_pids(work_dir / warm_jobs.PIDS_FILE)):
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return str(work_dir).encode() in f.read()
    except (OSError, IndexError):
        return False
