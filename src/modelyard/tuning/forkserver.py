"""Warm command trials: a fork server that has imported TensorFlow and forks one child per trial.

    python -m modelyard.tuning.forkserver IN_FD OUT_FD [--no-tensorflow] [MODULE ...]

A command trial that is a Python script or module (``python3 train.py ...``, ``python3 -m
modelyard train ...``) does not need a fresh interpreter to import TensorFlow again: this
process imports it (and Keras) once, runs no TensorFlow op, and forks. The child runs the
script as ``python`` would (``runpy``, ``__main__``, the same argv), in its own session and
process group, with the trial's environment, working directory, cores and log; so flags,
metrics and isolation are those of a cold trial, and the tuner stops it with the same
signals. ``MODULE``s are imported too, after TensorFlow (the platform's server preloads what every
training job imports next: modelyard's trainer, scikit-learn's bundled data); one that fails to
import is skipped. Forking is safe only before TensorFlow has started its thread pools (the first op
starts them), which is why the server never runs one; each child starts its own.

The tuner sends one JSON line per trial on ``IN_FD``; the server answers ``forked`` with the
child's pid, and ``exited`` with its exit status once it is reaped (the child is the
server's, not the tuner's, so the server reports its status). The server has the tuner's
parent-death signal and each child has the server's, so a tuner killed with -9 takes both.

The platform starts training jobs from the same server (platform.jobs.warm_jobs): such a child is
``detach``-ed (no parent-death signal: a job outlives its platform, as a cold one does) and its pid
is recorded in a ``pidfile`` before the server says ``forked``. A forked process's
``/proc/PID/environ`` is the server's, not the job's, so the platform finds it by that file
(``recorded_pids``), not by an environment marker. A warm process (TensorFlow imported, no op run)
may itself fork a Python command the same way (``fork_local``): a job's process forks its replica.

``warm_blocker`` is the one rule for what a warm start cannot give: variables that take effect
when an interpreter starts or imports TensorFlow. Those read when TensorFlow runs its first op
(``CUDA_VISIBLE_DEVICES``, thread counts, ``TF_CONFIG``) are set in the child before it runs any.
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import re
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any

from modelyard.forked import ReapedChild

_PR_SET_PDEATHSIG = 1

# Read when the interpreter starts or TensorFlow/Keras is imported: a child forked from an interpreter
# that started with other values would not have them. PYTHONUNBUFFERED is applied in the child.
_IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "MALLOC_", "KERAS_", "TF_CPP_", "TF_ENABLE_", "TF_XLA_", "XLA_")
_IMPORT_TIME_NAMES = {"TF_USE_LEGACY_KERAS", "GLIBC_TUNABLES", "TF2_BEHAVIOR", "TF_USE_MODULAR_FILESYSTEM"}
_APPLIED_IN_CHILD = {"PYTHONUNBUFFERED"}


def warm_blocker(env: dict[str, str], server_env: dict[str, str]) -> str | None:
    """Why a process with ``env`` cannot be forked from an interpreter started with ``server_env``
    (None: it can): the variables of ``env`` read at start-up or import that differ from the server's."""
    def import_time(name: str) -> bool:
        if name in _APPLIED_IN_CHILD:
            return False
        if name == "PYTHONUSERBASE":  # only a user site directory that exists changes sys.path
            return os.path.isdir(os.path.join(env.get(name) or server_env.get(name) or "", "lib"))
        return name in _IMPORT_TIME_NAMES or name.startswith(_IMPORT_TIME_PREFIXES)

    differ = sorted(k for k in set(env) | set(server_env) if import_time(k) and env.get(k) != server_env.get(k))
    if differ:
        return (f"{', '.join(differ)} differ from the warm interpreter's and take effect when Python starts "
                "or imports TensorFlow")
    return None


def is_warm_command(command: list[str]) -> bool:
    """``PYTHON script.py ...`` or ``PYTHON -m module ...`` with this interpreter (no other flags)."""
    if len(command) < 2 or os.path.realpath(command[0]) != os.path.realpath(sys.executable):
        return False
    if command[1] == "-m":
        return len(command) >= 3 and all(p.isidentifier() for p in command[2].split("."))
    return command[1].endswith(".py")


_TF_IMPORT = re.compile(r"^\s*(?:import|from)\s+(?:tensorflow|tf_keras|keras|modelyard)\b", re.M)


def imports_tensorflow(command: list[str], workdir: Path) -> bool:
    """Whether the trial's script (or module: a package's ``__main__``) imports TensorFlow, Keras or
    modelyard itself: only then is a server that imported TensorFlow worth starting (and waiting for)."""
    if command[1] == "-m" and command[2].split(".")[0] == "modelyard":
        return True
    from modelyard.tuning.preload import command_source

    path = command_source(command, workdir)
    try:
        return path is not None and _TF_IMPORT.search(path.read_text(errors="replace")) is not None
    except OSError:
        return False


def _pdeathsig() -> None:
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _child(job: dict[str, Any], server: int, out_fd: int | None = None, settled: int | None = None) -> None:
    """In the forked child: become the trial, then run its script as ``python`` would. Its output
    goes to ``job["log"]`` (appended), or to ``out_fd`` (a pipe its parent reads). ``settled`` is closed
    once the child is in its own session with default signal handlers (``fork`` waits for that)."""
    code = 1
    try:
        os.setsid()
        if not job.get("detach"):
            _pdeathsig()
            if os.getppid() != server:
                os._exit(1)
        settle(settled)
        os.environ.clear()
        os.environ.update(job["env"])
        import tempfile

        tempfile.tempdir = None  # the server's cached choice; the child's TMPDIR decides, as in a fresh python
        os.chdir(job["cwd"])
        if job.get("cpus"):
            os.sched_setaffinity(0, set(job["cpus"]))  # the one thread a fork leaves; later ones inherit it
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = out_fd if out_fd is not None else os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        # stderr to its own file when the caller reads the two apart (as Popen(stderr=PIPE) would give)
        err = os.open(job["err_log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if job.get("err_log") else log
        os.dup2(log, 1)
        os.dup2(err, 2)
        for fd in {null, log, err}:
            os.close(fd)
        if job["env"].get("PYTHONUNBUFFERED"):  # as a fresh `python` with it set: each line written at once
            for stream in (sys.stdout, sys.stderr):
                stream.reconfigure(line_buffering=True, write_through=True)
        if job.get("announce"):  # said by the job's own process: what it found already imported
            print(f"[modelyard] warm start: pid {os.getpid()} forked from pid {server}, TensorFlow "
                  f"{'already imported' if 'tensorflow' in sys.modules else 'not imported'}", flush=True)
        code = _run(job["argv"])
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        os._exit(code)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _run(argv: list[str]) -> int:
    import runpy

    try:
        # sys.path[0] as `python` sets it: the working directory for -m, the script's folder otherwise.
        if argv[1] == "-m":
            sys.argv = [argv[2]] + argv[3:]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv[1:]
            sys.path[0] = str(Path(argv[1]).resolve().parent)
            runpy.run_path(argv[1], run_name="__main__")
    except SystemExit as exc:
        return _exit_code(exc)
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1
    return 0


def proc_stat(pid: int) -> list[bytes] | None:
    """``/proc/PID/stat``'s fields after the command's name (state, ppid, pgrp, session, ...; the start
    time at 19), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): with the pid, who it is (pids are reused).
    None when it is gone or a zombie (dead, not yet reaped)."""
    stat = proc_stat(pid)
    if not stat or stat[0] == b"Z" or len(stat) < 20:
        return None
    return int(stat[19])


def record_pid(pidfile: str | Path, pid: int) -> None:
    """Append ``pid`` (and its start time) to ``pidfile``: how a forked process is found later."""
    with open(pidfile, "a") as f:
        f.write(f"{pid} {start_ticks(pid)}\n")


def read_pids(pidfile: str | Path) -> dict[int, int]:
    """Every ``pid -> start ticks`` ``pidfile`` records, running or not."""
    try:
        lines = Path(pidfile).read_text().split("\n")
    except OSError:
        return {}
    out = {}
    for line in lines:
        fields = line.split()
        if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
            out[int(fields[0])] = int(fields[1])
    return out


def recorded_pids(pidfile: str | Path) -> list[tuple[int, int]]:
    """``(pid, start ticks)`` of the processes ``pidfile`` names that still run as themselves
    (not exited, not a zombie, not a recycled pid)."""
    return [(pid, start) for pid, start in read_pids(pidfile).items() if start_ticks(pid) == start]


def fork(job: dict[str, Any], close: tuple[int, ...] = (), out_fd: int | None = None) -> int:
    """Fork ``job`` (argv, env, cwd, log or ``out_fd``, err_log, cpus, detach, pidfile, announce) from this
    process, which must have run no TensorFlow op and must run no other thread; its pid, recorded in
    ``job["pidfile"]`` (when given) before this returns."""
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    settled_r, settled_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(settled_r)
        for fd in close:
            os.close(fd)
        _child(job, parent, out_fd, settled_w)
    os.close(settled_w)
    try:
        wait_settled(settled_r)
    finally:
        os.close(settled_r)
    if job.get("pidfile"):
        record_pid(job["pidfile"], pid)
    return pid


SETTLE_TIMEOUT_S = 30.0


def settle(settled: int | None) -> None:
    """In a child just forked, once in its own session (``os.setsid()``, its parent-death signal armed):
    the signal handlers a fresh ``python`` has (SIGINT raises KeyboardInterrupt), then closing
    ``settled`` tells the parent waiting in ``wait_settled`` that its group may be signalled."""
    for sig in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if settled is not None:
        os.close(settled)


def wait_settled(settled_r: int) -> None:
    """Return once a child just forked has its own session and default signal handlers (it closes its
    end of the ``settled`` pipe then, or dies), or after ``SETTLE_TIMEOUT_S``: a caller that signals the
    child's group at once (a tuner stopping a trial, a test stopping a server it has just started) would
    otherwise find no such group yet, and its signal would be lost."""
    if select.select([settled_r], [], [], SETTLE_TIMEOUT_S)[0]:
        os.read(settled_r, 1)


LocalChild = ReapedChild  # what fork_local gives: a child this process reaps (modelyard.forked)


def fork_local(argv: list[str], env: dict[str, str], cwd: str | Path, pidfile: str | Path | None = None) -> ReapedChild:
    """Fork a Python command from this warm process (see ``fork``): detached, announced, its output
    on a pipe (``.stdout``, binary) as ``Popen(stdout=PIPE, stderr=STDOUT)`` gives."""
    read, write = os.pipe()
    job = {"argv": argv, "env": env, "cwd": str(cwd), "detach": True, "announce": True,
           "pidfile": str(pidfile) if pidfile else None}
    try:
        pid = fork(job, close=(read,), out_fd=write)
    finally:
        os.close(write)
    return ReapedChild(pid, os.fdopen(read, "rb"))


def _send(out: int, event: str, **fields: Any) -> None:
    data = (json.dumps({"event": event, **fields}) + "\n").encode()
    while data:
        data = data[os.write(out, data):]


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _preload(in_fd: int, out_fd: int, modules: list[str]) -> None:
    """Import ``modules`` (a convenience: one that fails is skipped, the child imports it itself).
    Only installed ones: the server's working directory is off the path meanwhile (a trial's own
    modules are its to import). One that starts a thread would make every fork unsafe (a fork copies
    only the forking thread): the server starts again without it (exec), once per such module."""
    import importlib

    threads = _threads()  # TensorFlow's import leaves a few native threads, idle until the first op
    first = sys.path.pop(0) if sys.path and sys.path[0] in ("", os.getcwd()) else None
    try:
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception as exc:  # its thread check still follows: it may have started one before failing
                print(f"forkserver: preloading {module} failed: {exc!r}", file=sys.stderr, flush=True)
            if _threads() > threads:
                print(f"forkserver: importing {module} started a thread; starting again without it",
                      file=sys.stderr, flush=True)
                rest = [m for m in modules if m != module]
                for fd in (in_fd, out_fd):
                    os.set_inheritable(fd, True)
                flag = [] if "tensorflow" in sys.modules else [NO_TENSORFLOW]
                os.execv(sys.executable, [sys.executable, "-m", "modelyard.tuning.forkserver", str(in_fd),
                                          str(out_fd), *flag, *rest])
    finally:
        if first is not None:
            sys.path.insert(0, first)


NO_TENSORFLOW = "--no-tensorflow"  # a server for processes that need the preloaded modules only


def serve(in_fd: int, out_fd: int, preload: list[str] = (), tensorflow: bool = True) -> int:
    if tensorflow:  # the imports every TensorFlow trial pays for: done once, here, with no op run
        import tensorflow  # noqa: F401

        try:
            if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
                import tf_keras  # noqa: F401
            else:
                import keras  # noqa: F401
        except ImportError:
            pass
    _preload(in_fd, out_fd, list(preload))
    # What the imports made lives as long as the server: out of the collector's sight, so a child's
    # collections neither scan it nor copy its pages (copy-on-write) by touching it.
    gc.collect()
    gc.freeze()
    _send(out_fd, "ready", pid=os.getpid(), seconds=time.process_time())
    buffer = b""
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([in_fd], [], [], 0.05 if children else 1.0)
        if readable:
            chunk = os.read(in_fd, 65536)
            if not chunk:
                return 0  # the tuner is gone
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                job = json.loads(line)
                pid = fork(job, close=(in_fd, out_fd))
                children.add(pid)
                _send(out_fd, "forked", trial=job["trial"], pid=pid)
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                _send(out_fd, "exited", pid=pid, returncode=os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    _rest = sys.argv[3:]
    _tf = not (_rest and _rest[0] == NO_TENSORFLOW)
    sys.exit(serve(int(sys.argv[1]), int(sys.argv[2]), _rest if _tf else _rest[1:], _tf))
