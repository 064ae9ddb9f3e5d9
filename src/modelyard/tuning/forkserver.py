"""Warm command trials: a fork server that has imported TensorFlow and forks one child per trial.

    python -m modelyard.tuning.forkserver IN_FD OUT_FD

A command trial that is a Python script or module (``python3 train.py ...``, ``python3 -m
modelyard train ...``) does not need a fresh interpreter to import TensorFlow again: this
process imports it (and Keras) once, runs no TensorFlow op, and forks. The child runs the
script as ``python`` would (``runpy``, ``__main__``, the same argv), in its own session and
process group, with the trial's environment, working directory, cores and log; so flags,
metrics and isolation are those of a cold trial, and the tuner stops it with the same
signals. Forking is safe only before TensorFlow has started its thread pools (the first op
starts them), which is why the server never runs one; each child starts its own.

The tuner sends one JSON line per trial on ``IN_FD``; the server answers ``forked`` with the
child's pid, and ``exited`` with its exit status once it is reaped (the child is the
server's, not the tuner's, so the server reports its status). The server has the tuner's
parent-death signal and each child has the server's, so a tuner killed with -9 takes both.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1


def is_warm_command(command: list[str]) -> bool:
    """``PYTHON script.py ...`` or ``PYTHON -m module ...`` with this interpreter (no other flags)."""
    if len(command) < 2 or os.path.realpath(command[0]) != os.path.realpath(sys.executable):
        return False
    if command[1] == "-m":
        return len(command) >= 3 and all(p.isidentifier() for p in command[2].split("."))
    return command[1].endswith(".py")


_TF_IMPORT = re.compile(r"^\s*(?:import|from)\s+(?:tensorflow|tf_keras|keras|modelyard)\b", re.M)


def imports_tensorflow(command: list[str], workdir: Path) -> bool:
    """Whether the trial's script (or module) imports TensorFlow, Keras or modelyard itself: only
    then is a server that imported TensorFlow worth starting (and waiting for)."""
    if command[1] == "-m":
        if command[2].split(".")[0] == "modelyard":
            return True
        import importlib.util

        try:
            spec = importlib.util.find_spec(command[2])
        except (ImportError, ValueError):
            return False
        origin = spec.origin if spec else None
    else:
        origin = command[1] if Path(command[1]).is_absolute() else str(workdir / command[1])
    try:
        return bool(origin) and _TF_IMPORT.search(Path(origin).read_text(errors="replace")) is not None
    except OSError:
        return False


def _pdeathsig() -> None:
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _child(job: dict[str, Any], server: int) -> None:
    """In the forked child: become the trial, then run its script as ``python`` would."""
    code = 1
    try:
        os.setsid()
        _pdeathsig()
        if os.getppid() != server:
            os._exit(1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt, as in a fresh python
        os.environ.clear()
        os.environ.update(job["env"])
        os.chdir(job["cwd"])
        if job.get("cpus"):
            os.sched_setaffinity(0, set(job["cpus"]))  # the one thread a fork leaves; later ones inherit it
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in (null, log):
            os.close(fd)
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


def _send(out: int, event: str, **fields: Any) -> None:
    data = (json.dumps({"event": event, **fields}) + "\n").encode()
    while data:
        data = data[os.write(out, data):]


def serve(in_fd: int, out_fd: int) -> int:
    # The imports every TensorFlow trial pays for: done once, here, with no op run.
    import tensorflow  # noqa: F401

    try:
        if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
            import tf_keras  # noqa: F401
        else:
            import keras  # noqa: F401
    except ImportError:
        pass
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
                sys.stdout.flush()
                sys.stderr.flush()
                server = os.getpid()
                pid = os.fork()
                if pid == 0:
                    os.close(in_fd)
                    os.close(out_fd)
                    _child(job, server)
                children.add(pid)
                _send(out_fd, "forked", trial=job["trial"], pid=pid)
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                _send(out_fd, "exited", pid=pid, returncode=os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), int(sys.argv[2])))
