"""modelyard.ports: a port handed to one child is never handed to the next one.

Plain bind-to-0-and-close hands the same number out again: on Linux, 2000 such picks repeat
about a hundred times (the kernel chooses at random among ~14k ports). A platform that started two
replicas side by side got one port for both, and the second replica died with EADDRINUSE.
"""
from __future__ import annotations

import os
import socket
import threading

from modelyard.ports import free_ports


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
    import time

    monkeypatch.setenv("MODELYARD_PORT_SLICE", "1/2")
    before = len(os.listdir("/proc/self/fd"))
    start = time.monotonic()
    ports = free_ports(200)
    assert time.monotonic() - start < 10 and len(set(ports)) == 200 and all(p % 2 == 1 for p in ports)
    assert len(os.listdir("/proc/self/fd")) == before
    with socket.socket() as s:  # and another process's bind gets it: nothing holds it
        s.bind(("127.0.0.1", ports[-1]))
