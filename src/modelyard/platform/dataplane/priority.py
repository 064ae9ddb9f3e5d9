"""CPU priority of the platform's own threads: the one rule for which of them give way to serving.

On a machine with few cores (the 2 shared cores this project is measured on), a create's store commit
takes CPU at the moment a predict's three processes (client, data plane, replica) want it. ``POLICY``
says, per role, under which Linux scheduling policy it runs and why; ``apply_to_this_thread`` applies
it to the calling thread (and names a thread of its own for ``ps -L``/``top -H``).

Which policy a lowered role would get, and why that is SCHED_IDLE: Linux's autogroups (on by default:
each session its own group; replicas, jobs and the data plane each lead a session of their own, the
``own_session`` rule) make a thread's nice value count only against threads of its own group, so a niced
control-plane thread takes the CPU from a replica in another group as before (measured: no change).
SCHED_BATCH changes only who preempts at a wakeup (measured: no change). A SCHED_IDLE thread is
preempted by any waking thread of another policy, whatever its group.

Why only threads that start nothing may be lowered: Linux gives a new process or thread the policy
of the thread that made it, and an unprivileged process cannot raise it back (SCHED_IDLE ->
SCHED_OTHER needs RLIMIT_NICE room). The event loop starts replicas, jobs' processes (through its
executor threads), the data plane and TensorBoards: lowered, it would lower them all for good.

Why the store writer (the one role that starts nothing) is not lowered by default: measured in the
same rounds (``bench/endpoints_scale.py --compare-writer``, 7 runs at load 8-20 on 2 cores), SCHED_IDLE
made the predict p99 while endpoints were created 0.70-0.96x the normal writer's, and 3,000 creations
take 28.2-37.8 s instead of 25.5-30.4 s, with stalls of seconds (300 paced creations in up to 7.8 s instead
of 2.5): a SCHED_IDLE thread runs only when nothing else wants the core, and it holds the GIL while it runs
Python, so a stall there also holds the event loop (the supervisor, every API call). Issue 43 asks for
both the 30 s and the p99; this trade gives up the first for a fraction of the second.

Where a policy cannot be applied (not Linux, no SCHED_IDLE, a seccomp profile), the thread stays as it
was: a priority is a preference, never a reason to refuse to start.
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
    starts_children: bool  # it starts processes or threads, which would inherit a lowered policy for good
    why: str
    thread_name: str | None = None  # a thread of its own: its name in ps -L / top -H
    # A process that leads a session of its own, so (autogroups) a CPU group of its own: its share of the
    # CPU is set against the control plane's group, not taken out of it. Replicas and jobs get theirs from
    # start_new_session at their start; the data plane takes its own (``own_session``).
    own_session: bool = False


# The rule, as data: every role the platform has, the policy each gets, and why (docs/architecture.md,
# "Decision: which threads give way on the CPU"). A role that starts children is never IDLE
# (tests/platform/test_priority.py); IDLE is measured for the store writer and not chosen (above).
POLICY: dict[str, Role] = {
    "store-writer": Role(NORMAL, False, "the control plane's store writes (creates, patches, operations); "
                         "SCHED_IDLE measured: p99 0.70-0.96x, 3,000 creations 28.2-37.8 s instead of 25.5-30.4 s",
                         thread_name="store-writer"),
    "control-plane": Role(NORMAL, True, "the event loop: supervises and starts replicas and jobs, which would "
                          "inherit it"),
    "data-plane": Role(NORMAL, True, "answers predicts; a session of its own: its own CPU group against "
                       "the control plane's", own_session=True),
    "replica": Role(NORMAL, True, "runs the models", own_session=True),
    "job": Role(NORMAL, True, "users' training and batch jobs: their speed is theirs to choose", own_session=True),
}

_PR_SET_NAME = 15  # prctl: the calling thread's name (15 bytes)


def apply_to_this_thread(role: str) -> str:
    """Apply ``POLICY[role]`` to the calling thread: its name if it is a thread of its own, SCHED_IDLE
    if its policy is IDLE. Returns what it runs under now (``"idle"``, ``"normal"``, or why it could not)."""
    spec = POLICY[role]  # KeyError: a role nobody decided on
    if spec.thread_name:  # only threads of their own: the main thread's name is the process's
        _name_thread(spec.thread_name)
    if spec.policy != IDLE:
        return thread_policy()
    return idle_this_thread()


def own_session(role: str) -> str:
    """If ``POLICY[role]`` says so, the calling process leads a new session (``setsid``), which Linux
    gives a CPU group of its own when autogroups are on. Returns its autogroup (``/proc/self/autogroup``),
    or why it stays where it was. Its death with its parent is not the session's business: the data
    plane keeps PR_SET_PDEATHSIG, and is stopped and killed by its pid (``split.py``)."""
    if not POLICY[role].own_session:
        return "unchanged (not this role's rule)"
    try:
        os.setsid()
    except (OSError, AttributeError) as exc:  # already a group leader; not POSIX
        return f"unchanged ({getattr(exc, 'strerror', None) or exc})"
    return autogroup()


def autogroup(pid: int | str = "self") -> str:
    """The CPU group Linux schedules process ``pid`` in (``/autogroup-N nice 0``), or why it cannot say."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return f.read().strip()
    except OSError as exc:  # autogroups compiled out, not Linux
        return f"unknown ({exc.strerror})"


def idle_this_thread() -> str:
    """The calling thread at SCHED_IDLE, for good (an unprivileged thread cannot leave it): ``"idle"``,
    or why it stays as it was."""
    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "SCHED_IDLE"):
        return "unchanged (no SCHED_IDLE here)"
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread on Linux
    except OSError as exc:  # a container's seccomp profile, an exotic kernel: the thread keeps its policy
        log.info("thread %s stays at its CPU priority: %s", threading.get_native_id(), exc)
        return f"unchanged ({exc.strerror})"
    return IDLE
def thread_policy(tid: int = 0) -> str:
    """The scheduling policy of thread ``tid`` (0: the calling one): ``"idle"``, ``"normal"`` or another
    policy's number, as ``apply_to_this_thread`` reports it."""
    policy = os.sched_getscheduler(tid)
    if policy == getattr(os, "SCHED_IDLE", None):
        return IDLE
    return NORMAL if policy == os.SCHED_OTHER else str(policy)


def _name_thread(name: str) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the name is only for people reading ps
        pass
