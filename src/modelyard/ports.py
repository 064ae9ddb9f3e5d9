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

Processes that pick ports side by side without knowing of each other (the test suite's parallel
workers and everything each of them starts) can each be given a slice of the port numbers:
``MODELYARD_PORT_SLICE=K/N`` makes this module hand out only ports whose number is K modulo N,
so two such processes (and their children, which inherit the variable) never pick the same one.
"""
from __future__ import annotations

import errno
import os
import random
import socket
import threading
import time

PORT_TAKEN_EXIT = 98  # a child's exit status when a port it was told to listen on is taken (EADDRINUSE's number)
HOLD_S = 300.0  # longer than any child takes to bind what it was given (a replica's start is < 180 s)

_lock = threading.Lock()
_given: dict[tuple[str, int], float] = {}  # (host, port) -> when it was handed out


def _slice() -> tuple[int, int]:
    """(K, N) from ``MODELYARD_PORT_SLICE=K/N``: only ports equal to K modulo N are ours; (0, 1) without it."""
    value = os.environ.get("MODELYARD_PORT_SLICE", "")
    try:
        k, n = (int(part) for part in value.split("/"))
    except ValueError:
        return 0, 1
    return (k % n, n) if n > 0 else (0, 1)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` now and not handed out by this process lately."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    k, n = _slice()
    with _lock:
        now = time.monotonic()
        for key in [key for key, t in _given.items() if now - t > HOLD_S]:
            del _given[key]
        ports = _kernel_picks(family, host, count) if n == 1 else _slice_picks(family, host, count, k, n)
        for port in ports:
            _given[(host, port)] = now
        return ports


def _kernel_picks(family: int, host: str, count: int) -> list[int]:
    """Ports the kernel picks (bind to port 0); those this process handed out lately are skipped."""
    held: list[socket.socket] = []  # all stay bound until every port is chosen, so none is offered twice
    try:
        ports: list[int] = []
        while len(ports) < count:
            sock = socket.socket(family, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind((host, 0))
            port = sock.getsockname()[1]
            if (host, port) not in _given:
                ports.append(port)
        return ports
    finally:
        for sock in held:
            sock.close()


# A slice's ports are drawn from below the kernel's ephemeral range (32768-60999 by default), so no
# outgoing connection of any process takes one meanwhile, and above Ray's worker ports (10002-19999).
SLICE_RANGE = (20000, 32767)
_SLICE_TRIES = 2000


def _slice_picks(family: int, host: str, count: int, k: int, n: int) -> list[int]:
    """Free ports equal to ``k`` modulo ``n``, drawn at random from ``SLICE_RANGE`` and checked by a bind.
    Never bind(0) here: Linux hands bind(0) even ports first, so a slice of odd ones would wait (and hold
    sockets) until every even port of the machine was taken."""
    lo, hi = SLICE_RANGE
    candidates = range(lo + (k - lo) % n, hi + 1, n)
    ports: list[int] = []
    refused: dict[str, int] = {}  # why binds failed, for the error: which errno, how often

    def take(port: int) -> bool:
        if (host, port) in _given or port in ports:
            return False
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError as exc:
                name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                refused[name] = refused.get(name, 0) + 1
                return False
        ports.append(port)
        return len(ports) == count

    for _ in range(_SLICE_TRIES):  # one draw at a time: random.sample drew all 2000 on every call (15 ms)
        if take(candidates[random.randrange(len(candidates))]):
            return ports
    # Random draws are fast while most of the slice is free; when they keep missing, walk the whole
    # slice once (a few thousand binds, tens of ms) so "none free" is a fact, not bad luck.
    start = random.randrange(len(candidates))
    for i in range(len(candidates)):
        if take(candidates[(start + i) % len(candidates)]):
            return ports
    held = sum(1 for h, p in _given if h == host and p % n == k)
    raise OSError(errno.EADDRINUSE, f"no {count} free ports equal to {k} modulo {n} in {lo}-{hi} "
                                    f"(MODELYARD_PORT_SLICE={k}/{n}): {held} handed out by this process in "
                                    f"the last {HOLD_S:.0f} s, binds refused {refused or 'never'}")


def free_port(host: str = "127.0.0.1") -> int:
    """One port, as ``free_ports`` gives them."""
    return free_ports(1, host)[0]


class PortTaken(OSError):
    """A port this process was told to listen on is in use by another socket."""


def bind_error(exc: OSError, message: str) -> OSError:
    """The error to raise for a failed bind: ``PortTaken`` when the port is in use, else a plain OSError."""
    return (PortTaken if exc.errno == errno.EADDRINUSE else OSError)(message)


_BIND_HINTS = {"gRPC": "is another server running? Use --port", "REST": "use --rest_api_port"}


def bind_failure(exc: OSError, what: str, host: str, port: int) -> OSError:
    """The error for a server's failed bind of its ``what`` ("gRPC" or "REST") port: one wording for a
    server, a worker and the supervisor that checks the ports before it starts any worker."""
    return bind_error(exc, f"cannot bind {what} port {host}:{port} ({exc.strerror}): {_BIND_HINTS[what]}")


def check_bindable(what: str, host: str, port: int) -> None:
    """Raise ``bind_failure`` unless ``host:port`` can be bound now as a server's workers bind it
    (SO_REUSEADDR and SO_REUSEPORT); binds nothing for port 0 and holds nothing after."""
    if not port:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise bind_failure(exc, what, host, port) from None


def exit_status(exc: BaseException) -> int:
    """A server's exit status for the error that stopped its start: ``PORT_TAKEN_EXIT`` or 1."""
    return PORT_TAKEN_EXIT if isinstance(exc, PortTaken) else 1
