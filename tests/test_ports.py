"""modelyard.ports: a port handed to one child is never handed to the next one.

Plain bind-to-0-and-close hands the same number out again: on Linux, 2000 such picks repeat
about a hundred times (the kernel chooses at random among ~14k ports). A platform that started two
replicas side by side got one port for both, and the second replica died with EADDRINUSE.
"""
from __future__ import annotations

import errno
import os
import socket
import threading
import time

import pytest

from modelyard import ports as ports_module
from modelyard.ports import SLICE_RANGE, free_ports


@pytest.fixture(autouse=True)
def own_hand_outs(monkeypatch):
    """These tests hand out thousands of ports; held for HOLD_S in the process's record, they would
    crowd the port slice of every later test in this process (a test worker's)."""
    monkeypatch.setattr(ports_module, "_given", {})


def test_ports_handed_out_never_repeat_while_children_have_not_bound_them():
    got = [port for _ in range(2000) for port in free_ports(1)]
    assert len(got) == len(set(got))


def test_ports_from_threads_starting_children_side_by_side_are_distinct():
    got: list[int] = []

    def pick() -> None:
        for _ in range(200):
            got.extend(free_ports(2))

    threads = [threading.Thread(target=pick) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 1600 and len(set(got)) == 1600


def test_a_port_handed_out_is_free_for_the_child():
    for port in free_ports(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen(1)


def test_a_port_slice_hands_out_only_ports_of_its_residue(monkeypatch):
    # MODELYARD_PORT_SLICE=K/N (set per pytest-xdist worker): two workers never pick the same port.
    monkeypatch.setenv("MODELYARD_PORT_SLICE", "1/2")
    odd = free_ports(50)
    monkeypatch.setenv("MODELYARD_PORT_SLICE", "0/2")
    even = free_ports(50)
    assert all(p % 2 == 1 for p in odd) and all(p % 2 == 0 for p in even)
    assert len(set(odd) | set(even)) == 100


def test_a_slice_of_odd_ports_is_handed_out_at_once_and_holds_no_socket(monkeypatch):
    # bind(0) gives even ports first on Linux: a slice must not wait for them to run out (it once held
    # 6000 sockets for minutes, and no process of the machine could bind a port another had picked).

    monkeypatch.setenv("MODELYARD_PORT_SLICE", "1/2")
    before = len(os.listdir("/proc/self/fd"))
    start = time.monotonic()
    ports = free_ports(200)
    assert time.monotonic() - start < 10 and len(set(ports)) == 200 and all(p % 2 == 1 for p in ports)
    assert len(os.listdir("/proc/self/fd")) == before
    with socket.socket() as s:  # and another process's bind gets it: nothing holds it
        s.bind(("127.0.0.1", ports[-1]))


def test_a_slice_almost_all_handed_out_still_finds_its_last_free_port(monkeypatch):
    # Random draws would miss the one port left most of the time; the walk over the slice finds it.
    monkeypatch.setenv("MODELYARD_PORT_SLICE", "1/2")
    odd = [p for p in range(SLICE_RANGE[0], SLICE_RANGE[1] + 1) if p % 2 == 1]
    left = next(p for p in reversed(odd) if _bindable(p))  # a port of the slice free on this machine now
    now = time.monotonic()
    ports_module._given.update({("127.0.0.1", p): now for p in odd if p != left})
    assert free_ports(1) == [left]
    with pytest.raises(OSError) as raised:  # and none left: a clear error saying why
        free_ports(1)
    assert raised.value.errno == errno.EADDRINUSE
    assert f"{len(odd)} handed out by this process" in str(raised.value), raised.value


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
