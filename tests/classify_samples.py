"""Sample code for tests/test_classify.py to read (never called): which of these start a process?"""
from __future__ import annotations

import subprocess


def starts_directly() -> None:
    subprocess.run(["true"], check=True)


def through_a_helper() -> None:
    starts_directly()


class Launcher:
    def start(self) -> None:
        self.proc = subprocess.Popen(["true"])


def through_a_class() -> Launcher:
    return Launcher()


class QuietLauncher(Launcher):
    """Starts its process in the method it inherits."""


def through_a_subclass() -> QuietLauncher:
    return QuietLauncher()


def lazily_imported() -> bytes:
    import subprocess as sp

    return sp.check_output(["true"])


def only_an_exception() -> None:
    raise subprocess.TimeoutExpired(["true"], 1)


def pure() -> int:
    return sum([1, 2])


def imports_a_heavy_starter_lazily() -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright():
        pass
