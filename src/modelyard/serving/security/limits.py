"""The numbers that bound what one peer can make the server hold or do.

Per-request limits are 0 (off) by default so a server on a trusted network pays nothing
for them; ``docs/security.md`` gives the values to use when exposed. The HTTP/2 flood
limits (``H2FloodBudget``) and the decoded tensor size are always on: they cost nothing on
a normal call and stop attacks that need no misconfiguration.
"""
from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_connections: int = 0  # open connections per port (and per worker process); 0: unlimited
    max_header_bytes: int = 0  # REST: all header names and values of a request; 0: unlimited
    max_request_line_bytes: int = 0  # REST: the request target (URL); 0: unlimited
    client_timeout_s: float = 0.0  # a request (or TLS handshake, or gRPC stream) must arrive within this; 0: off

    @property
    def any(self) -> bool:
        return bool(self.max_connections or self.max_header_bytes or self.max_request_line_bytes
                    or self.client_timeout_s)


class ConnectionCount:
    """Open connections on one port of one process (event-loop thread only: no lock)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.open = 0

    def admit(self) -> bool:
        if self.limit and self.open >= self.limit:
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1


# Cancelled calls (RST_STREAM from the client) per connection: a burst of 100, then 20 a second.
# A gRPC client cancels only calls it abandons (deadlines, user cancels); a rapid-reset attacker
# cancels every call it opens, thousands a second.
RESET_BUDGET = (100, 20.0)


class H2FloodBudget:
    """A token bucket for HTTP/2 frames that cost the server work but carry no request.

    SETTINGS and PING make the server write an ACK; RST_STREAM after HEADERS ("rapid
    reset", CVE-2023-44487) makes it start and drop calls; empty DATA or CONTINUATION frames
    and PRIORITY cost parsing for nothing. Each spends one unit; the bucket refills at
    ``rate`` per second up to ``burst``. A connection that runs it dry is sent
    GOAWAY(ENHANCE_YOUR_CALM) and closed. gRPC clients send a few SETTINGS, keepalive and
    bandwidth-probe PINGs (at most a few a second) and reset only calls they abandon, far
    below the rate; a flood sends thousands a second.
    """

    __slots__ = ("burst", "rate", "level", "stamp")

    def __init__(self, burst: int = 1000, rate: float = 200.0):
        self.burst, self.rate = burst, rate
        self.level = float(burst)
        self.stamp = time.monotonic()

    def spend(self) -> bool:
        """False when the peer is flooding."""
        if self.level >= 1:
            self.level -= 1
            return True
        now = time.monotonic()
        self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.level >= 1:
            self.level -= 1
            return True
        return False


# A declared shape whose decoded array would exceed this is refused before anything is allocated.
DEFAULT_MAX_DECODED_TENSOR_BYTES = 1 << 30
