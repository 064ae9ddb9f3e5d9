"""CPU priority of the platform's own threads: serving first, control-plane bookkeeping last.

On a machine with few cores (the 2 shared cores this project is measured on), a create's store commit
takes CPU at the moment a predict's three processes (client, data plane, replica) want it. The
control plane's work is not latency-bound (a create may take a millisecond longer), a predict is.
So the threads that only do the control plane's writes give way to everything else: ``POLICY`` says
which, and ``lower_this_thread`` applies it to the calling thread.

Why SCHED_IDLE and not a higher nice value: Linux's autogroups (on by default: each session its own
group, and the platform's replicas, jobs and the data plane each start a session or share the
platform's) make a thread's nice value count only against threads of its own group, so a niced
control-plane thread still takes the CPU from a replica in another group as before
(``bench/endpoints_scale.py`` at load 10: no change). A SCHED_IDLE thread is preempted by any waking
thread of another policy, whatever its group, and its CPU counts as idle when the kernel places a waking
thread. It still runs whenever a core has nothing else to do, and its group keeps its share of a busy
machine against other groups.

Why only threads that never start processes or threads: Linux gives a child process or thread the
policy and nice value of the thread that made it, and an unprivileged process can never raise them back
(SCHED_IDLE -> SCHED_OTHER needs RLIMIT_NICE room, which users rarely have). The event-loop thread starts
replicas, jobs, the data plane, TensorBoards and the threads that start job processes, so it stays
normal: lowering it would lower every replica and every user's training job with it, for good. The
store's writer thread (``Store.off_loop``: creates, patches, operation records) starts nothing.

Where a thread cannot be lowered (not Linux, a kernel without SCHED_IDLE), it stays as it was: a
priority is a preference, never a reason to refuse to start.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
from dataclasses import dataclass

log = logging.getLogger("modelyard.platform.priority")

NORMAL = "normal"
IDLE = "idle"  # SCHED_IDLE: runs only on CPU nothing else of another policy wants at that instant


@dataclass(frozen=True)
class Role:
    """One kind of platform thread or process and the CPU policy it runs under."""
    policy: str  # NORMAL or IDLE
    why: str


# The rule, as data: every role the platform has, the policy each gets, and why (docs/architecture.md,
# "Decision: serving first on the CPU"). Only IDLE roles are acted on; NORMAL ones are listed so that the
# choice for each is written down, and so ``lower_this_thread`` refuses a role nobody decided on.
POLICY: dict[str, Role] = {
    "store-writer": Role(IDLE, "the control plane's store writes (creates, patches, operations); starts nothing"),
    "control-plane": Role(NORMAL, "the event loop: supervises and starts replicas and jobs, which would inherit it"),
    "data-plane": Role(NORMAL, "answers predicts"),
    "replica": Role(NORMAL, "runs the models"),
    "job": Role(NORMAL, "users' training and batch jobs: their speed is theirs to choose"),
}

_PR_SET_NAME = 15  # prctl: the calling thread's name, as ps -L / top -H show it (15 bytes)


def lower_this_thread(role: str) -> str:
    """Apply ``POLICY[role]`` to the calling thread (for an IDLE role: SCHED_IDLE, and the role as its
    name in ``ps -L``); returns what it runs under now (``"idle"``, ``"normal"``, or why it could not)."""
    spec = POLICY[role]  # KeyError: a role nobody decided on
    if spec.policy != IDLE:
        return NORMAL
    _name_thread(role)  # only threads of their own: the main thread's name is the process's
    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "SCHED_IDLE"):
        return "unchanged (no SCHED_IDLE here)"
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread on Linux
    except OSError as exc:  # a container's seccomp profile, an exotic kernel: the thread keeps its policy
        log.info("thread %s stays at its CPU priority: %s", role, exc)
        return f"unchanged ({exc.strerror})"
    log.debug("thread %s (tid %d) runs at SCHED_IDLE", role, threading.get_native_id())
    return IDLE


def thread_policy(tid: int = 0) -> str:
    """The scheduling policy of thread ``tid`` (0: the calling one): ``"idle"``, ``"normal"`` or another
    policy's number, as ``lower_this_thread`` reports it."""
    policy = os.sched_getscheduler(tid)
    if policy == getattr(os, "SCHED_IDLE", None):
        return IDLE
    return NORMAL if policy == os.SCHED_OTHER else str(policy)


def _name_thread(role: str) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(role.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the name is only for people reading ps
        pass
