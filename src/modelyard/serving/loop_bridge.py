"""Hand a future's completion from the thread that completes it back to an event loop."""
from __future__ import annotations

import asyncio
from typing import Callable


def when_done_on_loop(loop: asyncio.AbstractEventLoop, future, callback: Callable, *args,
                      if_closed: Callable[[], object] | None = None) -> None:
    """Run ``callback(*args, future)`` on ``loop`` once ``future`` completes.

    ``future`` is anything with ``add_done_callback`` (a pool future, a batching future);
    its callbacks run on the completing thread, which must not touch the loop's transports.
    When the loop has already closed (the server is stopping) ``if_closed`` runs instead,
    on the completing thread, so resources the callback would free are still freed.
    """
    call_on_loop = getattr(future, "call_on_loop", None)
    if call_on_loop is not None:  # a batching future: its whole batch reaches the loop in one hop
        call_on_loop(loop, callback, *args, if_closed=if_closed)
        return

    def done(f) -> None:
        try:
            loop.call_soon_threadsafe(callback, *args, f)
        except RuntimeError:  # the loop has closed
            if if_closed is not None:
                if_closed()

    future.add_done_callback(done)
