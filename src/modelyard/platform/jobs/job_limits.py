"""What one job may use: processes (threads included), memory and the size of any file it writes.

The runner applies them to a job's first process as soon as it exists (``JobLimits.apply``); every
process the job starts inherits them:

- processes and memory: a cgroup of the job's own (``pids.max``, ``memory.limit_in_bytes`` / ``memory.max``)
  under the platform's cgroup, cgroup v1 or v2, when the platform may make one (root, or a delegated v2
  subtree). Where it may not: ``RLIMIT_NPROC`` (counted per user, so set to the user's tasks now plus
  the limit; ignored for root) and ``RLIMIT_AS`` per process.
- file size: ``RLIMIT_FSIZE`` (a write past it fails with EFBIG, or SIGXFSZ kills a process that does
  not ignore it).

When a job ends, ``why`` reads what the kernel counted (the cgroup's pids and memory events, SIGXFSZ,
ENOSPC in its log, a disk with no room) so that its FAILED state says which limit it met.

Defaults (``modelyard platform --job-max-processes/--job-max-memory-bytes/--job-max-file-bytes``):
``default_limits``: max(4096, 256 x CPUs) tasks, 80 % of the machine's memory, and half the free space of
the state directory's disk when the platform starts (at least 1 GiB). 0 turns a limit off.
"""
from __future__ import annotations

import logging
import os
import resource
import signal
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_GROUP_PREFIX = "modelyard-job-"


@dataclass(frozen=True)
class JobLimits:
    max_processes: int = 0  # tasks (processes and threads) of the whole job; 0: no limit
    max_memory_bytes: int = 0  # memory of the whole job (cgroup) or of each process (RLIMIT_AS); 0: no limit
    max_file_bytes: int = 0  # the largest file any of its processes may write; 0: no limit


def default_limits(state_dir: Path) -> JobLimits:
    """The documented defaults on this machine (see the module's docstring)."""
    try:
        st = os.statvfs(state_dir if state_dir.exists() else state_dir.parent)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = 0
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    # A TensorFlow process of a multi-worker cluster runs 110-130 threads here (gRPC, collectives, Keras's
    # data threads): the book's chief + worker job needs ~260 tasks, so the default leaves room for many.
    return JobLimits(max_processes=max(4096, 256 * (os.cpu_count() or 1)), max_memory_bytes=int(memory * 0.8),
                     max_file_bytes=max(1 << 30, free // 2))


def _own_cgroup(controller: str) -> Path | None:
    """The writable directory of this process's cgroup for ``controller`` (v1 hierarchy or v2), or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            base = _CGROUP_ROOT / controller / path.lstrip("/")
            if base.is_dir() and os.access(base, os.W_OK):
                return base
    for line in lines:  # v2: one hierarchy; the controller must be enabled for children
        if line.startswith("0::"):
            base = _CGROUP_ROOT / line[3:].lstrip("/")
            if not base.is_dir() and (_CGROUP_ROOT / "unified").is_dir():
                base = _CGROUP_ROOT / "unified" / line[3:].lstrip("/")
            try:
                enabled = (base / "cgroup.subtree_control").read_text().split()
            except OSError:
                return None
            if controller in enabled and os.access(base, os.W_OK):
                return base
    return None


def _group(controller: str, job_id: str) -> Path | None:
    base = _own_cgroup(controller)
    return None if base is None else base / f"{_GROUP_PREFIX}{job_id}"


def _move(group: Path, settings: dict[str, str], pid: int) -> bool:
    try:
        group.mkdir(exist_ok=True)
        for name, value in settings.items():
            (group / name).write_text(value)
        (group / "cgroup.procs").write_text(str(pid))
        return True
    except OSError as exc:
        log.warning("job limits: cannot use cgroup %s (%s); falling back to rlimits", group, exc)
        return False


def _user_tasks(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                continue
    return count


def apply(limits: JobLimits, job_id: str, pid: int) -> list[str]:
    """Put the job whose first process is ``pid`` under ``limits``; what was applied, for its log."""
    applied = []
    if limits.max_processes:
        group = _group("pids", job_id)
        if group is not None and _move(group, {"pids.max": str(limits.max_processes)}, pid):
            applied.append(f"at most {limits.max_processes} tasks (cgroup {group})")
        elif os.getuid() != 0:
            cap = _user_tasks(os.getuid()) + limits.max_processes
            _prlimit(pid, resource.RLIMIT_NPROC, cap)
            applied.append(f"RLIMIT_NPROC {cap} (this user's tasks now + {limits.max_processes})")
    if limits.max_memory_bytes:
        group = _group("memory", job_id)
        v1 = group is not None and "memory" in group.parts
        setting = {"memory.limit_in_bytes" if v1 else "memory.max": str(limits.max_memory_bytes)}
        if group is not None and _move(group, setting, pid):
            applied.append(f"at most {limits.max_memory_bytes} bytes of memory (cgroup {group})")
        else:
            _prlimit(pid, resource.RLIMIT_AS, limits.max_memory_bytes)
            applied.append(f"RLIMIT_AS {limits.max_memory_bytes} bytes per process")
    if limits.max_file_bytes:
        _prlimit(pid, resource.RLIMIT_FSIZE, limits.max_file_bytes)
        applied.append(f"files of at most {limits.max_file_bytes} bytes (RLIMIT_FSIZE)")
    return applied


def _prlimit(pid: int, which: int, value: int) -> None:
    try:
        hard = resource.prlimit(pid, which)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.prlimit(pid, which, (value, hard))
    except (OSError, ValueError) as exc:  # gone already, or not ours: the job runs without this limit
        log.warning("job limits: setting rlimit %d on pid %d failed: %s", which, pid, exc)


def why(limits: JobLimits, job_id: str, returncode: int | None, log_tail: str, work_dir: Path) -> str | None:
    """Which limit (or full disk) a failed job met, in words; None when none shows."""
    reasons = []
    pids = _group("pids", job_id)
    if pids is not None and _event_count(pids / "pids.events", "max"):
        reasons.append(f"it tried to run more than {limits.max_processes} tasks (processes and threads; "
                       "--job-max-processes)")
    memory = _group("memory", job_id)
    if memory is not None and (_event_count(memory / "memory.oom_control", "oom_kill")
                               or _event_count(memory / "memory.events", "oom_kill")):
        reasons.append(f"it ran out of its {limits.max_memory_bytes} bytes of memory (--job-max-memory-bytes) "
                       "and was killed")
    if returncode == -signal.SIGXFSZ or "File too large" in log_tail or "EFBIG" in log_tail:
        reasons.append(f"a file it wrote reached the limit of {limits.max_file_bytes} bytes (--job-max-file-bytes)")
    if "No space left on device" in log_tail or "ENOSPC" in log_tail or _disk_full(work_dir):
        reasons.append("the disk was full (No space left on device)")
    return "; ".join(reasons) or None


def _disk_full(path: Path) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (1 << 20)


def _event_count(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def release(job_id: str) -> None:
    """Remove the job's cgroups once its processes are gone (after ``why`` has read them)."""
    for controller in ("pids", "memory"):
        group = _group(controller, job_id)
        if group is not None and group.exists():
            try:
                group.rmdir()
            except OSError:  # a process is still in it (killed, not reaped yet): release_stale retries
                pass


def release_stale(active: set[str]) -> None:
    """Remove the cgroups of jobs that are not ``active`` (left by a platform that was killed, or not
    empty when their job ended); a group still holding a process stays."""
    for controller in ("pids", "memory"):
        base = _own_cgroup(controller)
        if base is None:
            continue
        for group in base.glob(f"{_GROUP_PREFIX}*"):
            if group.name[len(_GROUP_PREFIX):] not in active:
                try:
                    group.rmdir()
                except OSError:
                    pass
