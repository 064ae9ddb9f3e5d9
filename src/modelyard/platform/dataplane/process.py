"""The data-plane process: the platform's public port, its predicts answered in a process of their own.

Started (and restarted if it dies) by the control plane (``dataplane/split.py``), it inherits the public
port's listening sockets and serves them with the front (``front.py``): endpoint ``:predict`` /
``:rawPredict`` and the ``/v2`` calls through its own gateway, every other request passed to the control
plane's API app on its private loopback port, as received. Its routing mirrors the control plane's
(``mirror.py``) over a unix socket in the platform's private state directory; it reports its in-flight
and served counts and the replicas it failed to reach back over the same socket.

So a control-plane request (a create, a store write, a job's bookkeeping) never shares an event loop
or a GIL with a predict. The process ends when told to (after its requests in flight are answered),
when the link to the control plane closes, or with the control plane (PR_SET_PDEATHSIG). It leads a
session of its own, so Linux's autogroups give it a CPU share of its own (``priority.py``).

    python -m modelyard.platform.dataplane.process LINK_PATH FD [FD ...]
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass

from modelyard.platform.api import http_limits
from modelyard.platform.dataplane import mirror, priority, public_port
from modelyard.platform.dataplane.deadlines import DeadlinePolicy
from modelyard.platform.dataplane.front import Front, FrontProtocol
from modelyard.platform.dataplane.gateway import Gateway
from modelyard.platform.dataplane.metrics import Metrics
from modelyard.platform.dataplane.routing import Routing
from modelyard.platform.dataplane.upstream import UpstreamTimeout

log = logging.getLogger("modelyard.platform.dataplane")

REPORT_INTERVAL_S = 0.05  # counts are sent this often while they change
STOP_WAIT_S = 10.0  # requests in flight get this long to be answered at a stop


@dataclass
class FrontConfig:
    """What the front reads of the platform's configuration (sent in the control plane's hello)."""
    auth_token: str | None
    auth_predict: bool
    max_request_bytes: int
    max_predict_bytes: int


class DataPlane:
    """What ``Front`` takes as its platform: the configuration, and the gateway."""

    def __init__(self, hello: dict) -> None:
        self.config = FrontConfig(hello["auth_token"], hello["auth_predict"], hello["max_request_bytes"],
                                  hello["max_predict_bytes"])
        self.routing = Routing()
        self.mirror = mirror.Mirror(self.routing)
        self.metrics = Metrics()
        self.gateway = Gateway(self.routing, self.metrics, DeadlinePolicy(*hello["deadline"]))
        self.writer: asyncio.StreamWriter | None = None
        self.acked = 0
        self.gateway.on_replica_failure = self.replica_failed

    def send(self, msg: dict) -> None:
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(mirror.frame(msg))

    def replica_failed(self, replica, exc: Exception) -> None:
        """The gateway could not reach ``replica``: the control plane decides (dead, or unready); a replica
        that timed out gets no new request here meanwhile, as the supervisor would rule."""
        if isinstance(exc, UpstreamTimeout) and replica.unready_since is None:
            replica.unready_since = time.monotonic()
        self.send({"failed": replica.id, "timeout": isinstance(exc, UpstreamTimeout), "error": str(exc)})

    def report(self, metrics: bool = True) -> dict:
        """The acknowledged message, the replicas' counts and (``metrics``) the gateway's metrics."""
        msg = {"ack": self.acked, "counts": self.mirror.counts()}
        if metrics:
            msg["metrics"] = mirror.metrics_state(self.metrics)
        return msg


async def _report(plane: DataPlane) -> None:
    """The counts whenever they (or the acknowledged message) changed since the last report; the metrics
    whenever they changed."""
    last = stamp = None
    while True:
        await asyncio.sleep(REPORT_INTERVAL_S)
        now, metrics = (plane.acked, plane.mirror.counts()), mirror.metrics_stamp(plane.metrics)
        if now != last or metrics != stamp:
            plane.send(plane.report(metrics != stamp))
            last, stamp = now, metrics


async def _stop_when_idle(servers: list, front: Front) -> None:
    for server in servers:
        server.close()
    deadline = time.monotonic() + STOP_WAIT_S
    while front.active and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def run(link_path: str, fds: list[int]) -> int:
    reader, writer = await asyncio.open_unix_connection(link_path)
    hello = await mirror.read_message(reader)
    plane = DataPlane(hello)
    first = await mirror.read_message(reader)
    plane.mirror.apply(first)
    plane.acked = first.get("seq", 0)
    plane.writer = writer
    front = Front(plane, "127.0.0.1", hello["api_port"])
    tls = public_port.tls_context(*hello["tls"])
    guard = http_limits.Guard(http_limits.ConnLimits(*hello["limits"]))
    loop = asyncio.get_running_loop()
    servers = []
    for fd in fds:
        sock = socket.socket(fileno=fd)
        servers.append(await loop.create_server(guard.wrap(lambda: FrontProtocol(front)), sock=sock,
                                                backlog=public_port.BACKLOG, ssl=tls,
                                                ssl_handshake_timeout=guard.limits.handshake_timeout if tls else None))
    plane.send({**plane.report(), "ready": os.getpid()})
    reporter = loop.create_task(_report(plane))
    gc.freeze()  # as the platform did: start-up's objects kept out of the collector's full passes
    try:
        while True:
            try:
                msg = await mirror.read_message(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                log.warning("the control plane's link closed; the data plane stops")
                await _stop_when_idle(servers, front)
                return 0
            if "seq" in msg:
                plane.mirror.apply(msg)
                plane.acked = msg["seq"]
                plane.send(plane.report(metrics=False))
            elif "report" in msg:  # the control plane answers a read of counts or metrics: up to now
                plane.send({**plane.report(), "report": msg["report"]})
            elif "stop" in msg:
                await _stop_when_idle(servers, front)
                plane.send({"stopped": True})
                await writer.drain()
                return 0
    finally:
        reporter.cancel()


def _die_with_parent() -> None:
    """Linux: SIGKILL when the control plane's process ends, however it ends (kill -9 included)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # elsewhere the link's end stops it


def main(argv: list[str]) -> int:
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before the signal was armed
        return 1
    # A session of its own, so a CPU group of its own (Linux's autogroups): the control plane's creates
    # no longer take the predicts' CPU from within one shared group (priority.py, docs/architecture.md).
    priority.own_session("data-plane")
    # The control plane decides when the data plane stops (after its own answers): a SIGINT or SIGTERM meant
    # for the platform (a service manager's signals its whole cgroup) does not stop it on its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(run(argv[0], [int(fd) for fd in argv[1:]]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
