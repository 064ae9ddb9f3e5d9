"""``run(coro)``: ``asyncio.run`` for tests, in a thread of its own.

Playwright's sync API (the session's browser, tests/web) leaves its event loop marked running in
the thread that started it, and ``asyncio.run`` refuses to start in such a thread. Which tests
ran before in the same process must not decide whether a test can use asyncio.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Coroutine


def run(coro: Coroutine) -> Any:
    """Run ``coro`` to completion on a new event loop in a new thread; its result, or its exception."""
    with ThreadPoolExecutor(1, thread_name_prefix="test-asyncio") as pool:
        return pool.submit(asyncio.run, coro).result()
