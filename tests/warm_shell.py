"""Warm ``modelyard`` commands for the doc tests' shells: a page's ``modelyard train ...`` typed into bash
is forked from this pytest worker's warm interpreter (tests/warm_process.py) instead of starting a fresh
Python that imports TensorFlow again (4-9 CPU-seconds per command on the 2-core machine).

The ``modelyard`` in a doc test's bin/ (doc_blocks.shell_env) is still the console script pip writes; with
``MODELYARD_TEST_WARM_SHELL`` naming this worker's socket it first asks here: it sends its arguments,
working directory, environment and pid, and this side has the fork server fork ``python -m modelyard ARGS``
with stdout and stderr opened from the shim's own (``/proc/<pid>/fd/1`` and ``2``, as ``modelyard launch``
hands its warm tasks their pipe; a regular file only when opened for appending) and stdin from /dev/null. The shim waits for the exit status and exits
with it (128+N for signal N); if the shim is killed (a test stopping a background block's session), the
command gets SIGTERM, then SIGKILL. When the command cannot start warm (no server of its kind, or an
output that is not a file, pipe or terminal) the shim runs it cold, as before: same command, same output.
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

VARIABLE = "MODELYARD_TEST_WARM_SHELL"
STOP_GRACE_S = 10.0  # a command whose shim was killed: SIGTERM, then SIGKILL after this

_started_lock = threading.Lock()
_path: str | None = None
forked = 0  # commands started warm (tests/test_docs.py checks the shell's commands do)


def socket_path() -> str:
    """This worker's socket, listening from the first call on (a daemon thread per shim)."""
    global _path
    with _started_lock:
        if _path is None:
            folder = tempfile.mkdtemp(prefix="modelyard-warm-shell-")
            atexit.register(shutil.rmtree, folder, True)
            path = os.path.join(folder, "sock")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            listener.listen(16)
            threading.Thread(target=_accept, args=(listener,), daemon=True, name="warm-shell").start()
            _path = path
    return _path


def _accept(listener: socket.socket) -> None:
    # The fork is asked for here, in this thread, which lives as long as the worker: a fork server started
    # now dies with the thread that started it (its parent-death signal is per thread).
    while True:
        conn, _ = listener.accept()
        try:
            child = _spawn(conn)
        except Exception:
            conn.close()
            continue
        if child is None:
            conn.close()
        else:
            threading.Thread(target=_wait, args=(conn, child), daemon=True, name="warm-shell-command").start()


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


def _spawn(conn: socket.socket):
    """Fork the shim's command; None (the shim told to run it cold) when the worker's servers cannot."""
    global forked
    from tests.warm_process import spawn_warm

    request = json.loads(conn.makefile("rb").readline())
    pid, env = request["pid"], request["env"]
    argv = [sys.executable, "-m", "modelyard", *request["argv"]]
    child = spawn_warm(argv, env, request["cwd"], f"/proc/{pid}/fd/1", f"/proc/{pid}/fd/2")
    _send(conn, {"cold": True} if child is None else {"pid": child.pid})
    if child is not None:
        forked += 1
    return child


def _wait(conn: socket.socket, child) -> None:
    """Tell the shim its command's exit status; stop the command if the shim goes first."""
    with conn:
        while True:
            code = child.poll()  # the server's pump has its own lock
            if code is not None:
                _send(conn, {"returncode": code})
                return
            readable, _, _ = select.select([conn], [], [], 0.1)
            if readable and not conn.recv(1):  # the shim is gone: so goes its command
                _stop(child)
                return


def _stop(child) -> None:
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(child.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            child.wait(grace)
            return
        except subprocess.TimeoutExpired:
            pass


def run_in_shim() -> int | None:
    """In the shim: the warm command's exit status, or None when it is to run cold."""
    for fd in (1, 2):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return None
        if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISREG(mode)):
            return None  # a socket cannot be opened by its /proc path
        if stat.S_ISREG(mode) and not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND:
            # A file opened anew by its /proc path has an offset of its own: the shell's later writes to the
            # same redirect would overwrite the command's. Opened for appending (>>), every writer appends.
            return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(os.environ[VARIABLE])
    except OSError:
        return None  # that pytest worker is gone
    _send(conn, {"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ), "pid": os.getpid()})
    answers = conn.makefile("rb")
    first = json.loads(answers.readline() or b'{"cold": true}')
    if first.get("cold"):
        return None
    line = answers.readline()
    if not line:
        print("modelyard (warm shell): the test's fork server went away", file=sys.stderr)
        return 1
    code = json.loads(line)["returncode"]
    return code if code >= 0 else 128 - code


def shim_text() -> str:
    """The bin/modelyard console script: pip's, with the warm start tried first when the variable is set."""
    repo = str(Path(__file__).resolve().parents[1])
    return (f"#!{sys.executable}\nimport os\nimport sys\n"
            f"if __name__ == '__main__' and os.environ.get({VARIABLE!r}):\n"
            f"    sys.path.insert(0, {repo!r})\n"
            "    from tests.warm_shell import run_in_shim\n"
            "    del sys.path[0]\n"
            "    code = run_in_shim()\n"
            "    if code is not None:\n"
            "        sys.exit(code)\n"
            "from modelyard.cli import main\n"
            "if __name__ == '__main__':\n    sys.exit(main())\n")
