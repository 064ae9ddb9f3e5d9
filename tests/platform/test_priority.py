"""Which of the platform's threads give way on the CPU (issue 43, "predict p99 unchanged while endpoints
are created"): the one rule in ``dataplane/priority.py``. One layer down, with threads of this process
(never its main thread: a lowered thread cannot be raised back without privileges); then on the session
platform: its store writer named and under the table's policy, its event loop and data plane normal.
"""
from __future__ import annotations

import os
import sys
import threading

import pytest

from modelyard.platform.dataplane import priority
from tests.platform.conftest import live_processes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's")


def _in_thread(fn):
    """``fn()``'s result, run in a new thread of this process (started by the calling thread)."""
    out = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the caller
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    if "error" in out:
        raise out["error"]
    return out["value"]


def _comm(tid: int, pid: int | None = None) -> str:
    with open(f"/proc/{pid or os.getpid()}/task/{tid}/comm") as f:
        return f.read().strip()


def test_no_role_that_starts_processes_or_threads_is_lowered():
    """What such a role starts would inherit the policy for good (the next test): replicas, jobs."""
    for role, spec in priority.POLICY.items():
        assert spec.policy in (priority.NORMAL, priority.IDLE), role
        assert not (spec.starts_children and spec.policy == priority.IDLE), role
    for role in ("control-plane", "data-plane", "replica", "job"):
        assert priority.POLICY[role].starts_children and priority.POLICY[role].policy == priority.NORMAL
    with pytest.raises(KeyError):
        priority.apply_to_this_thread("no-such-role")
    # The processes that serve or run users' code lead sessions (CPU groups) of their own; the control
    # plane's threads are the platform's, and this call leaves a role without the rule where it was.
    assert {r for r, spec in priority.POLICY.items() if spec.own_session} == {"data-plane", "replica", "job"}
    session = os.getsid(0)
    assert priority.own_session("control-plane").startswith("unchanged")
    assert os.getsid(0) == session


def test_what_a_lowered_thread_starts_inherits_its_policy():
    """Why the event loop is never lowered: Linux gives a new thread (or process) its maker's policy,
    and the thread that started the lowered one, and threads it starts later, keep theirs."""
    def lower_then_start():
        return priority.idle_this_thread(), priority.thread_policy(), _in_thread(priority.thread_policy)

    assert _in_thread(lower_then_start) == (priority.IDLE, priority.IDLE, priority.IDLE)
    assert priority.thread_policy() == priority.NORMAL
    assert _in_thread(priority.thread_policy) == priority.NORMAL


def test_a_role_runs_under_its_policy_and_a_thread_of_its_own_is_named(monkeypatch):
    def apply(role):
        return lambda: (priority.apply_to_this_thread(role), priority.thread_policy(),
                        _comm(threading.get_native_id()))

    assert _in_thread(apply("store-writer")) == (priority.NORMAL, priority.NORMAL, "store-writer")
    # The main thread's name is the process's: a role without a thread of its own leaves it alone.
    name = _in_thread(lambda: _comm(threading.get_native_id()))
    assert _in_thread(apply("control-plane")) == (priority.NORMAL, priority.NORMAL, name)
    # Were the writer's policy IDLE (one word in the table), its thread would run at SCHED_IDLE.
    monkeypatch.setitem(priority.POLICY, "store-writer",
                        priority.Role(priority.IDLE, False, "measured", thread_name="store-writer"))
    assert _in_thread(apply("store-writer")) == (priority.IDLE, priority.IDLE, "store-writer")


def test_the_platform_applies_the_policy_to_its_threads(platform):
    """On the session platform: its store writer is the thread named store-writer and runs under the
    table's policy; every thread of the control plane (its event loop first: it starts replicas and jobs)
    and of the data-plane process runs under the normal policy."""
    pid = platform.proc.pid
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    writers = [t for t in tids if _comm(t, pid) == "store-writer"]
    assert len(writers) == 1
    assert priority.thread_policy(writers[0]) == priority.POLICY["store-writer"].policy
    others = {t: priority.thread_policy(t) for t in tids if t != writers[0]}
    assert others[pid] == priority.NORMAL  # the main thread: the event loop
    assert set(others.values()) == {priority.NORMAL}
    dataplane = [p for p, cmdline, _cwd in live_processes()
                 if b"modelyard.platform.dataplane.process" in cmdline and _parent(p) == pid]
    assert len(dataplane) == 1
    dp_tids = [int(t) for t in os.listdir(f"/proc/{dataplane[0]}/task")]
    assert {priority.thread_policy(t) for t in dp_tids} == {priority.NORMAL}
    # The data plane leads a session of its own, so (autogroups) a CPU group of its own, not the control plane's.
    assert os.getsid(dataplane[0]) == dataplane[0] != os.getsid(pid)
    if os.path.exists("/proc/self/autogroup"):
        assert priority.autogroup(dataplane[0]) != priority.autogroup(pid)


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
