"""The progress bar: rows done, rows/s and ETA on stderr; a line every few seconds when not a TTY."""
from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    def __init__(self, total: int, done: int = 0, stream: TextIO | None = None, enabled: bool = True):
        self.total, self.done, self.start_done = total, done, done
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.started = self.last = time.monotonic()
        self.drawn: tuple[int, int] | None = None  # (done, total) of the last line drawn

    def restart(self) -> None:
        """Start the rate clock now (after the model loaded), so rows/s measures predicting."""
        self.started = self.last = time.monotonic()
        self.start_done = self.done

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return (self.done - self.start_done) / elapsed if elapsed > 0 else 0.0

    def advance(self, rows: int) -> None:
        self.done += rows
        now = time.monotonic()
        if self.enabled and (now - self.last >= (0.2 if self.tty else 2.0) or self.done >= self.total):
            self.last = now
            self._draw()

    def _draw(self) -> None:
        rate = self.rate()
        total = max(self.total, self.done)  # an estimated total (an input split by probes) may fall short
        frac = self.done / total if total else 1.0
        eta = _clock((total - self.done) / rate) if rate > 0 else "?"
        bar = "#" * int(frac * 30)
        text = (f"[{bar:<30}] {self.done:,}/{total:,} rows {frac:6.1%} | "
                f"{rate:,.0f} rows/s | ETA {eta}")
        self.stream.write(("\r" + text) if self.tty else (text + "\n"))
        self.stream.flush()
        self.drawn = (self.done, total)

    def close(self) -> None:
        """The final state, drawn unless the last line already showed it: the last advance may have come
        before the total was exact (a job planned while it runs estimates its total until the plan is
        whole), and a last line drawn again is the 100% line printed twice."""
        if not self.enabled:
            return
        if self.drawn != (self.done, max(self.total, self.done)):
            self._draw()
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
