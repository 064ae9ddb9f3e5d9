"""How long a peer may take and how many connections it may hold on one of the platform's HTTP ports
(the API front and the storage): the one rule both use, as ``modelyard serve``'s
``--client_timeout_seconds`` and ``--max_connections`` are for its ports.

Each connection's requests are framed by httptools as they arrive (the server behind parses them too;
this only watches), and one sweep a fraction of a second apart closes a connection that

- has sent no byte within the timeout of being accepted,
- takes longer than the timeout from a request's first byte to the end of its head (a slowloris),
- pauses longer than the timeout inside a request body,
- with ``idle_s`` set, has sent nothing for ``idle_s`` after its last request while nothing is left
  to send it (a server without its own keep-alive limit; aiohttp has one, the storage uses it).

A port holds at most ``max_connections``: one more closes the connection that has waited longest
without sending a byte, or else (on a server that says when it handles a request, ``handling``) the
keep-alive connection silent longest since its answer; if there is none it is answered 503 and
closed. So idle neighbours cost an active client nothing. TLS handshakes are bounded by the
server's ``ssl_handshake_timeout`` (``handshake_timeout``).
"""
from __future__ import annotations

import argparse
import asyncio
import time
from contextlib import contextmanager
from dataclasses import dataclass

import httptools

DEFAULT_CLIENT_TIMEOUT_S = 60.0
DEFAULT_MAX_CONNECTIONS = 4096
# At the cap, a keep-alive connection between requests may make room once answered and silent this long
# (the answer is surely written by then); only on servers that say when they handle a request.
EVICTABLE_IDLE_S = 1.0

_FRESH, _HEAD, _BODY, _AFTER, _UNTRACKED = range(5)
_REFUSED_BODY = b"too many connections (max_connections)"
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(_REFUSED_BODY), _REFUSED_BODY))


@dataclass(frozen=True)
class ConnLimits:
    client_timeout_s: float = DEFAULT_CLIENT_TIMEOUT_S  # 0: no time limits
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # 0: unlimited
    idle_s: float | None = None  # after a request, a connection that sends nothing this long closes; None: off

    @property
    def handshake_timeout(self) -> float | None:
        return self.client_timeout_s or None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--client_timeout_seconds`` and ``--max_connections``, spelled as ``modelyard serve`` spells them."""
    parser.add_argument("--client_timeout_seconds", type=float, default=DEFAULT_CLIENT_TIMEOUT_S, metavar="S",
                        help="a request's head must arrive within S of its first byte, a body may pause at most "
                        "S, a connection that sends nothing for S is closed (0: no limit; default "
                        f"{DEFAULT_CLIENT_TIMEOUT_S:.0f})")
    parser.add_argument("--max_connections", type=int, default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                        help="open connections per port; one more closes the longest silent one, else is "
                        f"refused (0: unlimited; default {DEFAULT_MAX_CONNECTIONS})")


def from_args(args: argparse.Namespace, idle_s: float | None = None) -> ConnLimits:
    """The limits the flags give; ValueError for a negative value."""
    if args.client_timeout_seconds < 0 or args.max_connections < 0:
        raise ValueError("--client_timeout_seconds and --max_connections cannot be negative")
    return ConnLimits(args.client_timeout_seconds, args.max_connections, idle_s)


def as_arguments(limits: ConnLimits) -> list[str]:
    """The flags that give ``limits`` to a child server (the platform passes its own to its storage)."""
    return ["--client_timeout_seconds", str(limits.client_timeout_s), "--max_connections", str(limits.max_connections)]


class Guard:
    """One port's connections under ``limits``: ``wrap`` the server's protocol factory with it."""

    def __init__(self, limits: ConnLimits) -> None:
        self.limits = limits
        self.open: dict[_Guarded, None] = {}  # insertion order: oldest first
        self.refused = 0
        self.timed_out = 0
        self._sweeper: asyncio.TimerHandle | None = None

    def wrap(self, factory):
        return lambda: _Guarded(self, factory())

    def _admit(self, conn: "_Guarded") -> bool:
        limit = self.limits.max_connections
        if limit and len(self.open) >= limit:
            victim = self._victim()
            if victim is None:
                self.refused += 1
                return False
            victim.close()
        self.open[conn] = None
        if self._sweeper is None and self.limits.client_timeout_s:
            self._schedule()
        return True

    def _victim(self) -> "_Guarded | None":
        """The connection to close for a newcomer: the oldest that never sent a byte; else, where the
        server says when it handles a request (``handling``), the one silent longest between requests,
        answered and idle at least ``EVICTABLE_IDLE_S``; else None."""
        victim = next((c for c in self.open if c.state == _FRESH), None)  # insertion order: oldest first
        if victim is not None:
            return victim
        now = time.monotonic()
        idle = [c for c in self.open if c.state == _AFTER and c.reports_busy and not c.busy
                and now - c.last_byte > EVICTABLE_IDLE_S and not c.transport.get_write_buffer_size()]
        return min(idle, key=lambda c: c.last_byte, default=None)

    def _schedule(self) -> None:
        period = min(1.0, max(0.05, self.limits.client_timeout_s / 4))
        self._sweeper = asyncio.get_running_loop().call_later(period, self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        now = time.monotonic()
        t = self.limits.client_timeout_s
        idle = self.limits.idle_s
        for c in list(self.open):
            if c.state in (_FRESH, _HEAD):
                late = now - c.since > t  # FRESH: since accepted; HEAD: since the head's first byte
            elif c.state == _BODY:
                late = now - c.last_byte > t
            elif c.state == _AFTER and idle is not None:
                late = not c.busy and now - c.last_byte > idle and c.transport.get_write_buffer_size() == 0
            else:
                late = False
            if late:
                self.timed_out += 1
                c.close()
        if self.open:
            self._schedule()


class _Guarded(asyncio.Protocol):
    """The server's protocol behind one connection, with this port's limits watched around it."""

    def __init__(self, guard: Guard, inner: asyncio.BaseProtocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport = None
        self.admitted = False
        self.busy = 0  # requests the server is handling (when it reports them: ``handling``)
        self.reports_busy = False
        self.state = _FRESH
        self.since = self.last_byte = time.monotonic()
        self.parser = httptools.HttpRequestParser(self)

    def __hash__(self) -> int:
        return id(self)

    # the transport's calls, passed on
    def connection_made(self, transport) -> None:
        self.transport = transport
        if not self.guard._admit(self):
            self.state = _UNTRACKED
            transport.write(_REFUSAL)
            transport.close()
            return
        self.admitted = True
        self.inner.connection_made(transport)

    def connection_lost(self, exc) -> None:
        self.guard.open.pop(self, None)
        if self.admitted:
            self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.last_byte = time.monotonic()
        if not self.admitted:
            return
        if self.state != _UNTRACKED:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                self.state = _UNTRACKED
            except httptools.HttpParserError:
                self.state = _UNTRACKED  # the server answers its own 400 and closes
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received() if self.admitted else None

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # httptools' callbacks: where this connection is in its current request
    def on_message_begin(self) -> None:
        self.state = _HEAD
        self.since = time.monotonic()

    def on_headers_complete(self) -> None:
        self.state = _BODY

    def on_message_complete(self) -> None:
        self.state = _AFTER

    def close(self) -> None:
        self.state = _UNTRACKED
        self.guard.open.pop(self, None)  # its place is free at once (a newcomer may be waiting for it)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()  # nothing useful is pending: free the descriptor now


@contextmanager
def handling(transport):
    """Around a server's handling of one request on ``transport``: its connection is not idle meanwhile,
    so it is never closed to make room for a newcomer while its answer is being made (aiohttp's
    handlers use this; a protocol that does not is never closed for room once it sent a request)."""
    conn = transport.get_protocol() if transport is not None else None
    if not isinstance(conn, _Guarded):
        yield
        return
    conn.reports_busy = True
    conn.busy += 1
    try:
        yield
    finally:
        conn.busy -= 1
        conn.last_byte = time.monotonic()  # idle from the end of its answer, not from its request
