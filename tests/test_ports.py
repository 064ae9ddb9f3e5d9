"""modelyard.ports: a port handed to one child is never handed to the next one.

Plain bind-to-0-and-close hands the same number out again: on Linux, 2000 such picks repeat
about a hundred times (the kernel chooses at random among ~14k ports). A platform that started two
replicas side by side got one port for both, and the second replica died with EADDRINUSE.
"""
from __future__ import annotations

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
