"""Stopping the platform: what keeps running after it stops, and ``modelyard platform stop``.

A platform that stops (Ctrl-C, SIGTERM) leaves its replicas and its jobs' processes running on
purpose: the next start on the same store adopts them, so a restart drops no traffic and no
training. It says so in one line at exit, with the count and the way to stop them too.
``modelyard platform stop`` asks the running platform (``POST /modelyard/v1/stop``, the control
API's token) to cancel its jobs (as a cancel request does: SIGTERM, then SIGKILL after the grace),
stop its replicas and its warm spare, then exit. Deployments and models stay in the store, as
on Vertex AI: the next start runs their replicas again.
"""
from __future__ import annotations

import asyncio
import time

from modelyard.platform.jobs import job_runner

STOP_PATH = "/modelyard/v1/stop"
# A job's process gets CANCEL_GRACE_S after SIGTERM before SIGKILL; then the runner records its end.
_JOBS_WAIT_S = job_runner.CANCEL_GRACE_S + 20.0


def running(p) -> tuple[int, int | None]:
    """(replicas, active jobs) this platform supervises: what outlives a plain stop (jobs None: the store
    cannot say now; the exit must not wait for it)."""
    if not p.supervisor.leader:
        return 0, 0
    replicas = sum(len(d.replicas) for d in p.routing.deployed.values())
    try:
        return replicas, len(p.store.list_jobs(states=job_runner.ACTIVE))
    except Exception:  # the store is unreachable (PostgreSQL down): the line says so much less
        return replicas, None


def exit_line(replicas: int, jobs: int | None, everything: bool) -> str:
    """The line ``modelyard platform`` prints as it exits."""
    if jobs is None:
        return (f"modelyard platform: stopped; {_count(replicas, 'replica')} and its running jobs keep running, "
                "adopted by the next `modelyard platform` on this store; to stop them too, run "
                "`modelyard platform stop` while it runs")
    if everything:
        return (f"modelyard platform: stopped, with what it started ({_count(replicas, 'replica')}, "
                f"{_count(jobs, 'job')} cancelled)")
    if not replicas and not jobs:
        return "modelyard platform: stopped; nothing it started keeps running"
    return (f"modelyard platform: stopped; {_count(replicas, 'replica')} and {_count(jobs, 'job')} keep running, "
            "adopted by the next `modelyard platform` on this store; to stop them too, run "
            "`modelyard platform stop` while it runs")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


async def stop_everything(p) -> dict:
    """Cancel every active job and stop every replica (and the warm spare) of platform ``p``, the leader;
    ``{"replicas": n, "jobs": m}`` stopped. The supervisor stops first, so nothing is started again."""
    if p._loop_task is not None:  # no replacement, scale-up or reconcile from here on
        p._loop_task.cancel()
    jobs = 0
    for row in p.store.list_jobs(states=job_runner.ACTIVE):
        if getattr(job_runner.kind_module(row["kind"]), "follow", None) is not None:
            continue  # no process of its own: it follows the job it made, cancelled here too
        jobs += 1
        if row["state"] == job_runner.PENDING:
            p.store.update_job(row["id"], (job_runner.PENDING,), state=job_runner.CANCELLED, ended=time.time(),
                               error=job_runner._cancelled())
            continue
        p.jobs.cancel_now(row)
        p.store.update_job(row["id"], (job_runner.RUNNING,), state=job_runner.CANCELLING)
    deadline = time.monotonic() + _JOBS_WAIT_S
    while time.monotonic() < deadline and _with_process(p.store.list_jobs(states=job_runner.ACTIVE)):
        p.jobs.wake()  # the runner signals, then records each end
        await asyncio.sleep(0.2)
    replicas = [r for d in p.routing.deployed.values() for r in d.replicas]
    await p.supervisor.retire_all(replicas)  # drained, stopped, forgotten: a start runs them again
    for row in p.store.replicas():  # one still starting when the supervisor stopped
        await p.engine.stop(row, grace_s=5)
        p.store.remove_replica(row["id"])
    p.engine.want_spare(False)
    p.stopped_everything = {"replicas": len(replicas), "jobs": jobs}
    return p.stopped_everything


def _with_process(rows: list[dict]) -> list[dict]:
    return [r for r in rows if getattr(job_runner.kind_module(r["kind"]), "follow", None) is None]
