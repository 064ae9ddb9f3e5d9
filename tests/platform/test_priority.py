"""Serving first on the CPU (issue 43, "predict p99 unchanged while endpoints are created"): the one
rule in ``dataplane/priority.py``. One layer down, with threads of this process (never its main
thread: a lowered thread cannot be raised back without privileges); then on the session platform,
whose store writer runs at SCHED_IDLE while its event loop and its data plane stay normal.
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


def test_only_roles_that_start_nothing_are_lowered():
    lowered = {role for role, spec in priority.POLICY.items() if spec.policy == priority.IDLE}
    assert lowered == {"store-writer"}
    # The roles whose processes users rely on, and the thread that starts them, keep the normal policy.
    for role in ("control-plane", "data-plane", "replica", "job"):
        assert priority.POLICY[role].policy == priority.NORMAL
    with pytest.raises(KeyError):
        priority.lower_this_thread("no-such-role")


def test_a_lowered_thread_runs_at_sched_idle_and_is_named_for_ps():
    def lower():
        result = priority.lower_this_thread("store-writer")
        return result, priority.thread_policy(), _comm(threading.get_native_id())

    assert _in_thread(lower) == (priority.IDLE, priority.IDLE, "store-writer")
    # The thread that started it, and a thread that one starts afterwards, are untouched.
    assert priority.thread_policy() == priority.NORMAL
    assert _in_thread(priority.thread_policy) == priority.NORMAL


def test_a_normal_role_leaves_the_thread_and_its_name_alone():
    def keep():
        before = _comm(threading.get_native_id())
        return priority.lower_this_thread("control-plane"), priority.thread_policy(), \
            _comm(threading.get_native_id()) == before

    assert _in_thread(keep) == (priority.NORMAL, priority.NORMAL, True)


def test_what_a_lowered_thread_starts_inherits_its_policy():
    """Why the event loop is never lowered: Linux gives a new thread (or process) its maker's policy."""
    def lower_then_start():
        priority.lower_this_thread("store-writer")
        return _in_thread(priority.thread_policy)

    assert _in_thread(lower_then_start) == priority.IDLE


def test_the_platform_lowers_its_store_writer_only(platform):
    """On the session platform: the thread named store-writer is SCHED_IDLE; every other thread of the
    control plane (its event loop first: it starts replicas and jobs) and every thread of the data-plane
    process run under the normal policy."""
    pid = platform.proc.pid
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    writers = [t for t in tids if _comm(t, pid) == "store-writer"]
    assert len(writers) == 1
    assert priority.thread_policy(writers[0]) == priority.IDLE
    others = {t: priority.thread_policy(t) for t in tids if t != writers[0]}
    assert others[pid] == priority.NORMAL  # the main thread: the event loop
    assert set(others.values()) == {priority.NORMAL}
    dataplane = [p for p, cmdline, _cwd in live_processes()
                 if b"modelyard.platform.dataplane.process" in cmdline and _parent(p) == pid]
    assert len(dataplane) == 1
    dp_tids = [int(t) for t in os.listdir(f"/proc/{dataplane[0]}/task")]
    assert {priority.thread_policy(t) for t in dp_tids} == {priority.NORMAL}


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
