"""Hand a future's completion from the thread that completes it back to an event loop."""
from __future__ import annotations

import asyncio
from typing import Callable


def when_done_on_loop(loop: asyncio.AbstractEventLoop, future, callback: Callable, *args) -> None:
    """Run ``callback(*args, future)`` on ``loop`` once ``future`` (a pool future) completes.

    Its done-callbacks run on the completing thread, which must not touch the loop's
    transports. When the loop has already closed (the server is stopping) the answer has
    nowhere to go and is dropped. (A batching future hands itself back with
    ``BatchFuture.call_on_loop``, a whole batch at once.)
    """
    def done(f) -> None:
        try:
            loop.call_soon_threadsafe(callback, *args, f)
        except RuntimeError:  # the loop has closed
            pass

    future.add_done_callback(done)
