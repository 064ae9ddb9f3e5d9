"""Start the suite's ``python -m modelyard ...`` processes warm: forked from an interpreter of this
pytest worker that has already imported TensorFlow, rather than a fresh ``python`` importing it
again (4–9 CPU-seconds each on the 2-core machine, paid by dozens of processes per run).

The forking is the product's own: the fork server the tuner starts command trials from and the
platform starts training jobs from (``modelyard.tuning.warm.ForkServer`` around
``modelyard.tuning.forkserver``). A forked process runs the same ``python -m`` entry point in its
own session, environment, working directory and output files, so it is the real command; only
TensorFlow's import is shared. The server's rule (``forkserver.warm_blocker``) refuses an
environment whose start-up variables (``TF_USE_LEGACY_KERAS``, ``TF_CPP_*``, ``PYTHON*``...) differ
from its own: such a process gets a server of its own kind (at most ``MAX_SERVERS`` per worker),
and past that, or when a server is gone, it starts cold as before.

A test about how a process starts (what it imports, what it prints while TensorFlow loads, how
long it takes) must start it cold: ``warm=False`` (e.g. ``ServerProcess(..., warm=False)``).
``MODELYARD_TEST_COLD=1`` starts every process cold (to tell a warm-start problem from another).
"""
from __future__ import annotations

import atexit
import os
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

MAX_SERVERS = 3  # kinds of start-up environment per worker (the suite uses two or three)

_lock = threading.Lock()  # one test thread at a time talks to a server
_servers: list[Any] = []  # modelyard.tuning.warm.ForkServer, started on first use of each kind
_spawned = 0


def _server_for(env: dict[str, str]):
    """A live fork server that takes ``env`` (started now if none does and there is room), or None."""
    from modelyard.tuning.warm import ForkServer

    _servers[:] = [s for s in _servers if s.alive() and not s.broken]
    for server in _servers:
        if server.refusal(env) is None:
            return server
    if len(_servers) >= MAX_SERVERS:
        return None
    log = Path(tempfile.mkdtemp(prefix="modelyard-test-forkserver-")) / "forkserver.log"
    server = ForkServer(env, log)
    atexit.register(server.shutdown)
    _servers.append(server)
    return server


def spawn_warm(argv: list[str], env: dict[str, str], cwd: Path, log_path: Path | str,
               err_path: Path | str | None = None) -> Any:
    """``argv`` forked from one of this worker's fork servers (a ``WarmChild``), or None: the caller
    starts it cold (``MODELYARD_TEST_COLD``, not a ``python -m``/script command, no server takes ``env``)."""
    global _spawned
    from modelyard.tuning.forkserver import is_warm_command

    if os.environ.get("MODELYARD_TEST_COLD") or not is_warm_command(list(argv)):
        return None
    with _lock:
        server = _server_for(env)
        _spawned += 1
        options = {"err_log": str(err_path)} if err_path else {}
        return server and server.spawn(f"test-{os.getpid()}-{_spawned}", list(argv), dict(env), Path(cwd),
                                       Path(log_path), None, **options)


def popen_python(argv: list[str], env: dict[str, str], log_path: Path, cwd: Path | None = None,
                 warm: bool = True, err_path: Path | None = None) -> Any:
    """Start ``argv`` (``sys.executable -m ...`` or ``sys.executable script.py ...``) in its own session,
    stdout (and stderr, unless ``err_path`` takes it) appended to ``log_path``: warm when it can be. Returns
    a ``subprocess.Popen`` or a ``modelyard.tuning.warm.WarmChild`` (pid, poll, wait, returncode, signals)."""
    cwd = Path(cwd or os.getcwd())
    child = spawn_warm(argv, env, cwd, log_path, err_path) if warm else None
    if child is not None:
        return child
    with open(log_path, "ab") as log, open(err_path or os.devnull, "ab") as err:
        return subprocess.Popen(argv, stdout=log, stderr=err if err_path else subprocess.STDOUT, env=env,
                                cwd=cwd, start_new_session=True)


def run_python(argv: list[str], env: dict[str, str], timeout: float, cwd: Path | None = None,
               stop: Any = None, merge_stderr: bool = False) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True)`` started with ``popen_python``; ``stop(proc)``
    (default: SIGKILL to its process group) runs whatever happens, and a run past ``timeout`` raises
    ``subprocess.TimeoutExpired`` as ``run`` does. ``merge_stderr``: stderr goes to stdout (``stderr=STDOUT``)."""
    with tempfile.TemporaryDirectory(prefix="modelyard-test-run-") as directory:
        out, err = Path(directory, "stdout"), Path(directory, "stderr")
        err.touch()
        proc = popen_python(argv, env, out, cwd=cwd, err_path=None if merge_stderr else err)
        try:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired as exc:
                raise subprocess.TimeoutExpired(argv, timeout, out.read_bytes(), err.read_bytes()) from exc
        finally:
            if stop is not None:
                stop(proc)
            else:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
        return subprocess.CompletedProcess(argv, proc.returncode, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))
