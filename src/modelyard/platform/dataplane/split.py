"""The control plane's side of the data-plane process (``dataplane/process.py``): it starts it, restarts
it if it dies, stops it with the platform, and keeps its routing equal to the control plane's.

Over a unix socket in the platform's private state directory (only the platform's user can reach it;
the peer must also be the process started here), the control plane sends a hello (the front's
configuration: tokens, body limits, deadlines, connection limits, TLS files), then numbered messages
(``mirror.py``): the endpoints changed since the last one, and the replicas' view when it changed. The
data plane acknowledges each number with its counts, and reports its counts and gateway metrics as
they change (``fresh``: at once, for a read that must see every predict answered before it). A control-plane answer that changed routing (a
create, a patch, an operation now done) is sent only once the data plane acknowledged the change
(``synced``), so a client that deployed can predict at once, and one that undeployed reaches the old
model no more. Replica state the supervisor changes on its own (draining, dead, unready, new replicas)
reaches the data plane within ``TICK_S``.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from modelyard.platform.dataplane import mirror
from modelyard.platform.dataplane.routing import Routing
from modelyard.platform.dataplane.upstream import UpstreamTimeout

log = logging.getLogger("modelyard.platform.dataplane")

TICK_S = 0.02  # how often replica state is compared with what the data plane was last sent
SYNC_WAIT_S = 5.0  # a control-plane answer waits at most this long for the data plane's acknowledgement
START_TIMEOUT_S = 60.0
STOP_WAIT_S = 15.0  # the data plane answers what it is answering (up to process.STOP_WAIT_S), then exits
RESTART_DELAY_S = (0.2, 1.0, 5.0)  # after the data plane's 1st, 2nd, 3rd+ unexpected exit in a row
LINK_FILE = "dataplane.sock"


class DataPlaneProcess:
    def __init__(self, platform, sockets: list[socket.socket], tls_files, limits) -> None:
        self.p = platform
        self.routing: Routing = platform.routing
        self.sockets = sockets
        config = platform.config
        self.hello = {"auth_token": config.auth_token, "auth_predict": config.auth_predict,
                      "max_request_bytes": config.max_request_bytes, "max_predict_bytes": config.max_predict_bytes,
                      "deadline": [config.upstream_deadline.min_s, config.upstream_deadline.factor,
                                   config.upstream_deadline.max_s],
                      "api_port": None, "tls": [str(Path(f).resolve()) if f else None for f in tls_files],
                      "limits": [limits.client_timeout_s, limits.max_connections, limits.idle_s]}
        self.path = Path(config.state_dir) / LINK_FILE
        self.proc: subprocess.Popen | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.seq = 0  # the last message sent
        self.acked = 0  # the last message the data plane applied
        self._acked = asyncio.Event()
        self._ready: asyncio.Future | None = None
        self._hello_ready = asyncio.Event()  # the API app's port is known (``start``)
        self._view: dict | None = None  # the replicas' view last sent
        self.counts = mirror.Counts()
        self._reports: dict[int, asyncio.Future] = {}  # reads waiting for the data plane's report
        self._ids = itertools.count(1)
        self._stopping = False
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task] = []
        self.restarts = 0

    # ---- the process ----------------------------------------------------------------------------------
    async def launch(self) -> None:
        """Start the data plane's process: it loads its code while the control plane starts (``start``)."""
        self.routing.journal = {Routing.FULL}
        self.path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._linked, str(self.path))
        os.chmod(self.path, 0o600)
        self._launch()

    async def start(self, api_port: int) -> None:
        """Give the data plane the API app's port and wait until it serves the public port with the
        routing of now; from then on it is kept running."""
        self.hello["api_port"] = api_port
        self._hello_ready.set()
        await self._wait_ready()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._tick()), loop.create_task(self._watch())]

    def _launch(self) -> None:
        self._ready = asyncio.get_running_loop().create_future()
        fds = [s.fileno() for s in self.sockets]
        # Its own output goes where the platform's goes; its environment is the platform's (job tokens' dir).
        self.proc = subprocess.Popen([sys.executable, "-m", "modelyard.platform.dataplane.process", str(self.path),
                                      *map(str, fds)], pass_fds=fds, stdin=subprocess.DEVNULL)

    async def _wait_ready(self) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), START_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise RuntimeError(f"the data-plane process did not start within {START_TIMEOUT_S:.0f} s") from None

    async def _watch(self) -> None:
        """Restart the data plane if it exits while the platform runs (the public port stays bound here:
        connections wait in its backlog meanwhile)."""
        in_a_row = 0
        while not self._stopping:
            await asyncio.sleep(0.1)
            if self.proc is None or self.proc.poll() is None:
                continue
            if self._stopping:
                return
            log.error("the data-plane process exited with %s; starting it again", self.proc.returncode)
            self._lost()
            await asyncio.sleep(RESTART_DELAY_S[min(in_a_row, len(RESTART_DELAY_S) - 1)])
            in_a_row += 1
            try:
                self._launch()
                await self._wait_ready()
                self.restarts += 1
                in_a_row = 0
            except Exception as exc:  # tried again on the next turn
                log.error("cannot start the data-plane process: %s", exc)

    async def stop(self) -> None:
        """Stop the data plane once its requests in flight are answered (killed past the wait)."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        serving = self._ready is not None and self._ready.done()
        if self.proc is not None and self.proc.poll() is None and self.writer is not None and serving:
            self._send({"stop": True})
            deadline = time.monotonic() + STOP_WAIT_S
            while self.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        if self.proc is not None and self.proc.poll() is None:  # past the wait, or never serving (a failed start)
            self.proc.kill()
            self.proc.wait()
        if self._server is not None:
            self._server.close()
        self.path.unlink(missing_ok=True)
        for sock in self.sockets:
            sock.close()

    # ---- the link -------------------------------------------------------------------------------------
    async def _linked(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._is_child(writer):
            writer.close()
            return
        await self._hello_ready.wait()
        if self.writer is not None:
            self.writer.close()
        self.writer = writer
        writer.write(mirror.frame(self.hello))
        self.routing.journal = {Routing.FULL}
        self._view = None
        self._flush()
        try:
            while True:
                msg = await mirror.read_message(reader)
                if "ack" in msg:
                    self.acked = max(self.acked, msg["ack"])
                    self.counts.apply(self.routing, msg["ack"], msg["counts"])
                    if "metrics" in msg:
                        mirror.apply_metrics(self.p.metrics, msg["metrics"])
                    self._acked.set()
                    self._acked = asyncio.Event()
                    if "ready" in msg and self._ready is not None and not self._ready.done():
                        self._ready.set_result(msg["ready"])
                    future = self._reports.pop(msg.get("report"), None)
                    if future is not None and not future.done():
                        future.set_result(True)
                elif "failed" in msg:
                    self._failed(msg)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            if self.writer is writer:
                self.writer = None
                self._lost()
            writer.close()

    def _is_child(self, writer: asyncio.StreamWriter) -> bool:
        """The peer is the process started here (SO_PEERCRED; elsewhere the directory's mode guards it)."""
        sock = writer.get_extra_info("socket")
        if sock is None or not hasattr(socket, "SO_PEERCRED"):
            return True
        pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return self.proc is not None and pid == self.proc.pid

    def _lost(self) -> None:
        """The data plane is gone: nothing is in flight through it; nobody waits for its acknowledgement."""
        self.counts.lost(self.routing)
        self.acked = self.seq
        self._acked.set()
        self._acked = asyncio.Event()
        for future in self._reports.values():
            if not future.done():
                future.set_result(False)
        self._reports.clear()

    def _send(self, msg: dict) -> None:
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(mirror.frame(msg))

    def _flush(self) -> bool:
        """Send what changed (endpoints in the journal, the replicas' view); True when something was sent."""
        if self.writer is None:
            return False
        view = mirror.replica_view(self.routing)
        journal = self.routing.journal
        if not journal and view == self._view:
            return False
        msg = {"seq": self.seq + 1}
        if journal:
            msg.update(mirror.endpoint_changes(self.routing, journal))
        if view != self._view:
            msg["replicas"] = view
        data = mirror.frame(msg)  # before anything is marked sent: a message that cannot be made is not
        self.seq += 1
        self.routing.journal = set()
        if view != self._view:
            self._view = view
            self.counts.sent(self.seq, view)
        self.writer.write(data)
        return True

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self._flush()
            except Exception:  # the next tick tries again
                log.exception("sending routing to the data plane failed")

    async def synced(self) -> None:
        """Return once the data plane routes as the control plane does now (or it is not running)."""
        self._flush()
        deadline = time.monotonic() + SYNC_WAIT_S
        while self.writer is not None and self.acked < self.seq:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("the data plane has not acknowledged routing message %d within %.0f s", self.seq,
                            SYNC_WAIT_S)
                return
            try:
                await asyncio.wait_for(self._acked.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    def _failed(self, msg: dict) -> None:
        replica = mirror.find_replica(self.routing, msg["failed"])
        on_failure = self.p.gateway.on_replica_failure
        if replica is None or on_failure is None:
            return
        exc = UpstreamTimeout(msg["error"]) if msg["timeout"] else ConnectionError(msg["error"])
        on_failure(replica, exc)
        self._flush()  # the ruling reaches the data plane now

    async def fresh(self) -> None:
        """The replicas' counts and the gateway's metrics, as the data plane has them now (a read of
        ``/metrics`` or of the replicas sees every predict answered before it)."""
        if self.writer is None:
            return
        n = next(self._ids)
        future = self._reports[n] = asyncio.get_running_loop().create_future()
        self._send({"report": n})
        try:
            await asyncio.wait_for(future, SYNC_WAIT_S)
        except asyncio.TimeoutError:
            log.warning("the data plane did not report within %.0f s", SYNC_WAIT_S)
        finally:
            self._reports.pop(n, None)
