"""The tuner's side of warm command trials: the fork server process (tuning.forkserver) and a
trial it forked, with the part of ``subprocess.Popen`` a TrialProcess uses (pid, poll, returncode).

``start_warm`` starts a study's warm processes, this server or function trials' workers, first
thing: ``modelyard tune`` calls it before it imports Optuna and opens the study (seconds), so
TensorFlow is imported meanwhile rather than after (this module and those it imports do not import
Optuna).

If the server cannot fork a trial (it died, or did not answer in time), the caller starts the
trial cold, as before: a warm start is an optimisation, never a requirement.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from modelyard.forked import ForkedChild, ReapedChild
from modelyard.tuning.forkserver import settle, start_ticks, wait_settled, warm_blocker
from modelyard.tuning.runner import _child_setup

FORK_TIMEOUT = 120.0  # the server may still be importing TensorFlow when the first trials come


class WarmChild(ForkedChild):
    """A trial process forked by the server; its exit status arrives from the server."""

    def __init__(self, server: "ForkServer", pid: int, detached: bool = False):
        self.server, self.pid, self.detached = server, pid, detached
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.pump()
            if self.returncode is None and not self.server.alive():
                if self.detached and start_ticks(self.pid) is not None:
                    return None  # a detached child outlives its server (a platform's job)
                # The server died before it reaped us: the child died with it (parent-death signal),
                # or, detached, ended with a status nobody can read now.
                self.returncode = -signal.SIGKILL
        return self.returncode


class ForkServer:
    """One server per study; started at once, so it imports while the study opens."""

    def __init__(self, env: dict[str, str], log: Path, preload: tuple[str, ...] = (), tensorflow: bool = True):
        """``tensorflow=False``: a server that imports ``preload`` only (the platform's pipeline tasks)."""
        to_server_r, to_server = os.pipe()
        from_server, from_server_w = os.pipe()
        os.set_blocking(from_server, False)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "modelyard.tuning.forkserver", str(to_server_r), str(from_server_w),
                 *([] if tensorflow else ["--no-tensorflow"]), *preload],
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                pass_fds=(to_server_r, from_server_w), start_new_session=True,
                preexec_fn=_child_setup(None, os.getpid()))
        os.close(to_server_r)
        os.close(from_server_w)
        self._attach(env, proc, to_server, from_server)

    @classmethod
    def start(cls, env: dict[str, str], log: Path, preload: tuple[str, ...] = ()) -> "ForkServer":
        """A server for ``env``: forked from this process when it may be one (``fork_here``), else a
        fresh Python that imports TensorFlow."""
        return cls.fork_here(env, log, preload) or cls(env, log, preload)

    @classmethod
    def fork_here(cls, env: dict[str, str], log: Path, preload: tuple[str, ...] = ()) -> "ForkServer | None":
        """A server forked from this process rather than a fresh Python importing TensorFlow again, when
        this process may be one (``_fork_blocker``: TensorFlow imported, no op run, one thread, the same
        start-up variables, as in a process the platform, the tuner or the test suite forked warm); None
        otherwise (``start`` then starts a fresh one). It is ready in a fraction of a second."""
        if _fork_blocker(env) is not None:
            return None
        log.parent.mkdir(parents=True, exist_ok=True)
        to_server_r, to_server_w = os.pipe()
        from_server_r, from_server_w = os.pipe()
        settled_r, settled_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(to_server_w)
            os.close(from_server_r)
            os.close(settled_r)
            _serve_forked(env, log, to_server_r, from_server_w, parent, preload, settled_w)
        os.close(to_server_r)
        os.close(from_server_w)
        os.close(settled_w)
        try:
            wait_settled(settled_r)  # in its own session before shutdown() may signal its group
        finally:
            os.close(settled_r)
        os.set_blocking(from_server_r, False)
        server = cls.__new__(cls)
        server._attach(env, _ForkedProcess(pid), to_server_w, from_server_r)
        return server

    def _attach(self, env: dict[str, str], proc: Any, to_server: int, from_server: int) -> None:
        """The state of a server whose process is ``proc``, written to on ``to_server``, read on ``from_server``."""
        self.env = dict(env)
        self.ready = False  # it said it imported TensorFlow and takes requests
        self.proc = proc
        self._to_server, self._from_server = to_server, from_server
        self._buffer = b""
        self._children: dict[int, WarmChild] = {}
        self._forked: dict[str, int] = {}
        self._exits: dict[int, int] = {}
        self.broken = False
        self._pump_lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def pump(self) -> None:
        with self._pump_lock:  # a caller's threads may poll the same server's children
            self._pump()

    def _pump(self) -> None:
        if self._from_server < 0:  # shut down: its descriptor numbers may be another file's now
            self.broken = True
            return
        while True:
            try:
                chunk = os.read(self._from_server, 65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.broken = True
                break
            self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("event") == "ready":
                self.ready = True
            elif message.get("event") == "forked":
                self._forked[message["trial"]] = message["pid"]
            elif message.get("event") == "exited":
                child = self._children.pop(message["pid"], None)
                if child is not None:
                    child.returncode = message["returncode"]
                else:
                    self._exits[message["pid"]] = message["returncode"]

    def wait(self, timeout: float) -> None:
        """Sleep until the server writes (a trial forked or exited) or ``timeout`` passes."""
        if self.broken or self._from_server < 0:
            time.sleep(timeout)
            return
        readable, _, _ = select.select([self._from_server], [], [], timeout)
        if readable:  # read it now: a server that died leaves its pipe at EOF, readable at once, forever
            self.pump()

    def refusal(self, env: dict[str, str]) -> str | None:
        """Why a process with ``env`` cannot be forked from this server (forkserver.warm_blocker)."""
        if not self.broken and not self.alive():
            self.broken = True  # not asked again; wait() sleeps instead of waking on its closed pipe
        if self.broken:
            return "the warm interpreter has stopped"
        return warm_blocker(env, self.env)

    def spawn(self, trial: str, argv: list[str], env: dict[str, str], cwd: Path, log: Path,
              cpus: set[int] | None, **options: Any) -> WarmChild | None:
        """Fork a trial; None if the server cannot (the caller starts it cold). ``options``:
        forkserver.fork's ``detach``, ``pidfile`` and ``announce``."""
        if self.refusal(env) is not None:
            return None
        job = {"trial": trial, "argv": argv, "env": env, "cwd": str(cwd), "log": str(log),
               "cpus": sorted(cpus) if cpus else None, **options}
        data = (json.dumps(job) + "\n").encode()
        try:
            while data:
                data = data[os.write(self._to_server, data):]
        except OSError:
            self.broken = True
            return None
        deadline = time.time() + FORK_TIMEOUT
        while trial not in self._forked:
            if self.broken or not self.alive() or time.time() > deadline:
                self.broken = True  # a server that will not fork is not asked again
                return None
            select.select([self._from_server], [], [], 0.1)
            self.pump()
        pid = self._forked.pop(trial)
        child = WarmChild(self, pid, detached=bool(options.get("detach")))
        with self._pump_lock:  # else another thread's pump could file its exit between the two lines
            child.returncode = self._exits.pop(pid, None)
            if child.returncode is None:
                self._children[pid] = child
        return child

    def shutdown(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for fd in (self._to_server, self._from_server):
            try:
                os.close(fd)
            except OSError:
                pass
        self._to_server = self._from_server = -1


def _fork_blocker(env: dict[str, str]) -> str | None:
    """Why this process cannot become a fork server by forking itself (None: it can)."""
    if "tensorflow" not in sys.modules:
        return "TensorFlow is not imported here"
    from tensorflow.python.eager import context

    ctx = context.context_safe()  # may exist before any op (created by an import), uninitialized
    if ctx is not None and getattr(ctx, "_context_handle", True) is not None:
        return "this process has run TensorFlow ops"  # a forked TensorFlow runtime would not work
    if threading.active_count() != 1:
        return "this process runs threads"
    return warm_blocker(env, dict(os.environ))


class _ForkedProcess(ReapedChild):
    """The part of ``subprocess.Popen`` a ForkServer uses (pid, poll, wait), for a server forked here."""


def _serve_forked(env: dict[str, str], log: Path, in_fd: int, out_fd: int, parent: int,
                  preload: tuple[str, ...], settled: int) -> None:
    """In the forked child: become what ``python -m modelyard.tuning.forkserver`` is, and exit."""
    from modelyard.tuning.forkserver import serve

    code = 1
    try:
        os.setsid()
        _child_setup(None, parent)()  # dies with its parent, as the Popen'd server does
        settle(settled)
        null, out = os.open(os.devnull, os.O_RDONLY), os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        keep = sorted({in_fd, out_fd})
        os.closerange(3, keep[0])
        os.closerange(keep[0] + 1, keep[1])
        os.closerange(keep[1] + 1, 65536)  # the parent's pipes are not the server's to hold open
        os.environ.clear()
        os.environ.update(env)
        code = serve(in_fd, out_fd, list(preload))
    except BaseException:  # noqa: BLE001  (never return into the parent's code)
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def start_warm(study: Any, slots: list[Any]) -> tuple[Any, ForkServer | None]:
    """The study's warm processes, started now: ``(WorkerPool, None)`` for function trials on
    ``slots``, ``(None, ForkServer)`` for command trials that can start warm (``trial.warm_start``, a
    Python script or module of this interpreter that imports TensorFlow), else ``(None, None)``."""
    if study.function:
        from modelyard.tuning.workers import WorkerPool

        return WorkerPool(study, slots), None
    if study.warm_start:
        from modelyard.tuning.forkserver import imports_tensorflow, is_warm_command

        if is_warm_command(study.command) and imports_tensorflow(study.command, study.workdir):
            from modelyard.tuning.preload import preload_modules

            env, log = dict(os.environ, **study.env), study.job_dir / "forkserver.log"
            preload = preload_modules(study.command, study.workdir)
            return None, ForkServer.start(env, log, preload)
    return None, None
