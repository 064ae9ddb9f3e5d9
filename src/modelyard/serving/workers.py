"""Several server processes on the same ports, so parsing, running and encoding use every core.

Each worker is a full ModelServer (its own manager and models) bound to the shared
REST and gRPC ports with SO_REUSEPORT; the kernel spreads connections across them.
What must agree across workers goes through a small state directory:
- a config reload received by one worker is published there; the others apply it
  and acknowledge, and the reload answers once all have (or names who did not);
- each worker drops a metrics snapshot there every second, and the worker answering
  a Prometheus scrape merges its peers' snapshots into its own.
The supervisor (the ``modelyard serve`` process) starts the workers, restarts one that
dies, and stops them all on SIGINT/SIGTERM.
"""
from __future__ import annotations

import json
import logging
import multiprocessing
import os
import queue
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from modelyard.ports import PORT_TAKEN_EXIT, check_bindable, exit_status

log = logging.getLogger("modelyard.serving")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


class WorkerGroup:
    """One worker's view of the shared state directory."""

    def __init__(self, state_dir: str, index: int, count: int):
        self.dir = Path(state_dir)
        self.index = index
        self.count = count
        self.applied = 0

    # ---- config reloads ---------------------------------------------------------------------
    def publish_config(self, text: str) -> int:
        generation = time.time_ns()
        _write_atomic(self.dir / "config.txt", json.dumps({"generation": generation, "text": text}))
        return generation

    def pending_config(self) -> tuple[int, str] | None:
        try:
            data = json.loads((self.dir / "config.txt").read_text())
        except (FileNotFoundError, ValueError):
            return None
        if data["generation"] <= self.applied:
            return None
        return data["generation"], data["text"]

    def ack(self, generation: int, error: str = "") -> None:
        self.applied = max(self.applied, generation)
        _write_atomic(self.dir / f"ack-{self.index}.json", json.dumps({"generation": generation, "error": error}))

    def wait_acks(self, generation: int, timeout: float) -> list[str]:
        """Problems reported by peers (empty when all applied ``generation`` cleanly)."""
        deadline = time.monotonic() + timeout
        while True:
            problems, pending = [], []
            for peer in range(self.count):
                if peer == self.index:
                    continue
                try:
                    data = json.loads((self.dir / f"ack-{peer}.json").read_text())
                except (FileNotFoundError, ValueError):
                    data = {"generation": 0, "error": ""}
                if data["generation"] < generation:
                    pending.append(peer)
                elif data["generation"] == generation and data["error"]:
                    problems.append(f"worker {peer}: {data['error']}")
            if not pending:
                return problems
            if time.monotonic() > deadline:
                return problems + [f"worker {p}: did not apply the config within {timeout:.0f}s" for p in pending]
            time.sleep(0.05)

    # ---- metrics ----------------------------------------------------------------------------
    def write_metrics(self, snapshot: dict) -> None:
        _write_atomic(self.dir / f"metrics-{self.index}.json", json.dumps(snapshot))

    def peer_metrics(self) -> list[dict]:
        peers = []
        for peer in range(self.count):
            if peer == self.index:
                continue
            try:
                peers.append(json.loads((self.dir / f"metrics-{peer}.json").read_text()))
            except (FileNotFoundError, ValueError):
                pass
        return peers


def _worker_main(options, index: int, count: int, state_dir: str, ready) -> None:
    import logging as _logging

    _logging.basicConfig(level=_logging.INFO, format=f"%(asctime)s %(levelname)s worker:{index} %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when workers stop
    from modelyard import _deferred_tf

    _deferred_tf.defer()  # as launch.serve does: TensorFlow only if a model needs it
    from modelyard.serving.server import ModelServer

    from modelyard.errors import ServingError

    server = ModelServer(options, group=WorkerGroup(state_dir, index, count))
    try:
        server.start()
    except (ServingError, OSError) as exc:  # a taken port, no model: the supervisor says it once
        ready.put((index, getattr(exc, "message", None) or str(exc)))
        server.stop()
        sys.exit(exit_status(exc))
    ready.put((index, None))
    server.serve_rest_forever()


def run_supervised(options, count: int, on_ready=None) -> int:
    """Start ``count`` workers and keep them running until SIGINT/SIGTERM; returns an exit code."""
    try:  # a taken port is said before any worker starts (each would import TensorFlow to find it)
        check_bindable("gRPC", options.host, options.port)
        check_bindable("REST", options.host, options.rest_api_port)
    except OSError as exc:
        print(f"modelyard serve: error: {exc}", file=sys.stderr)
        return exit_status(exc)
    ctx = multiprocessing.get_context("spawn")
    state_dir = tempfile.mkdtemp(prefix="modelyard-serve-")
    ready = ctx.Queue()
    stopping = False

    def start(index: int):
        proc = ctx.Process(target=_worker_main, args=(options, index, count, state_dir, ready),
                           name=f"modelyard-worker-{index}", daemon=False)
        proc.start()
        return proc

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    workers = [start(i) for i in range(count)]
    started: set[int] = set()
    start_errors: dict[int, str] = {}

    def read_reports(wait: float = 0.0) -> None:
        deadline = time.monotonic() + wait
        while True:
            try:
                index, error = ready.get(timeout=max(0.0, deadline - time.monotonic())) if wait else ready.get_nowait()
            except queue.Empty:
                return
            if error is None:
                started.add(index)
            else:
                start_errors[index] = error

    restarts = 0
    try:
        while not stopping:
            read_reports()
            if len(started) == count and on_ready:
                on_ready()
                on_ready = None
            for i, proc in enumerate(workers):
                if proc.exitcode is not None and not stopping:
                    if i not in started:
                        read_reports(wait=1.0)  # its report may still be in the pipe
                        reason = start_errors.get(i) or f"worker {i} failed to start (exit code {proc.exitcode})"
                        print(f"modelyard serve: error: {reason}", file=sys.stderr)
                        return PORT_TAKEN_EXIT if proc.exitcode == PORT_TAKEN_EXIT else 1
                    restarts += 1
                    log.error("worker %d exited with code %s; restarting it (restart %d)", i, proc.exitcode, restarts)
                    time.sleep(min(5, restarts))
                    workers[i] = start(i)
            time.sleep(0.2)
        return 0
    finally:
        for proc in workers:
            if proc.exitcode is None:
                proc.terminate()
        for proc in workers:
            proc.join(15)
            if proc.exitcode is None:
                proc.kill()
        shutil.rmtree(state_dir, ignore_errors=True)
