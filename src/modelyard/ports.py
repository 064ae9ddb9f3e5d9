"""Free TCP ports for the processes we start (replicas, training tasks).

The only portable way to pick a port for a child is to bind port 0, read the number, close the
socket and hand the number on; the child binds it moments (or, while it imports TensorFlow,
seconds) later. Until then the port is free again, and the kernel may give the same number to the
next bind of port 0. A platform starting two replicas side by side did exactly that once: both
children were told the same port and the second one died with EADDRINUSE.

So this process remembers every port it handed out for ``HOLD_S`` seconds and never hands one out
twice in that window. Other processes (their own bind-to-0 picks, any outgoing connection) can
still take a port before the child binds it; the child then exits with ``PORT_TAKEN_EXIT``, and
whoever started it starts it again on new ports.
"""
from __future__ import annotations

import errno
import socket
import threading
import time

PORT_TAKEN_EXIT = 98  # a child's exit status when a port it was told to listen on is taken (EADDRINUSE's number)
HOLD_S = 300.0  # longer than any child takes to bind what it was given (a replica's start is < 180 s)

_lock = threading.Lock()
_given: dict[tuple[str, int], float] = {}  # (host, port) -> when it was handed out


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` now and not handed out by this process lately."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    held: list[socket.socket] = []  # all stay bound until every port is chosen
    try:
        with _lock:
            now = time.monotonic()
            for key in [k for k, t in _given.items() if now - t > HOLD_S]:
                del _given[key]
            ports: list[int] = []
            while len(ports) < count:
                sock = socket.socket(family, socket.SOCK_STREAM)
                held.append(sock)
                sock.bind((host, 0))
                port = sock.getsockname()[1]
                if (host, port) not in _given:  # else keep it bound (so it is not offered again) and go on
                    ports.append(port)
            for port in ports:
                _given[(host, port)] = now
            return ports
    finally:
        for sock in held:
            sock.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One port, as ``free_ports`` gives them."""
    return free_ports(1, host)[0]


class PortTaken(OSError):
    """A port this process was told to listen on is in use by another socket."""


def bind_error(exc: OSError, message: str) -> OSError:
    """The error to raise for a failed bind: ``PortTaken`` when the port is in use, else a plain OSError."""
    return (PortTaken if exc.errno == errno.EADDRINUSE else OSError)(message)


def exit_status(exc: BaseException) -> int:
    """A server's exit status for the error that stopped its start: ``PORT_TAKEN_EXIT`` or 1."""
    return PORT_TAKEN_EXIT if isinstance(exc, PortTaken) else 1
