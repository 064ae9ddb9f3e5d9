"""Splitting an object into chunks by probes: a small read at each nominal boundary, never a scan.

The standard way to split a large input among readers that each read their own range: the plan
fixes a nominal chunk size ``C`` and, for every ``k``, the boundary ``b_k`` = the first record start
at or after ``k * C`` (the object's end when there is none). Chunk ``k`` is ``[b_k, b_(k+1))``; a
record longer than ``C`` spans several nominal boundaries, which then name the same start and give
no empty chunk. Finding ``b_k`` reads a window from ``k * C`` (``Source.peek``: 64 KiB for an
object in storage) and looks for a record start in it, reading on while a record outlasts the window.

``C`` comes from the object itself: ``chunk_rows`` records at the mean record size of the object's
first window. Nothing but the object's bytes decides a boundary, so the same version of the same
object is split into the same chunks by every run: a resumed job repeats its recorded plan (the
reads are pinned to the version the job was created with, ``remote.RemoteInputs``). The rows of
a chunk are not counted here (``UNCOUNTED``): whoever reads the chunk counts them.

Where a record starts is the format's rule (``lines.next_line_start``, ``tfrecord.next_record_start``).

May import: the standard library and ``source`` only.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from modelyard.batch.readers.source import Source

UNCOUNTED = -1  # a chunk's rows (and its first row's number) when the plan did not count them
MIN_WINDOW = 4 << 10


def byte_ranges(source: Source, chunk_rows: int, records: int, spanned: int,
                next_start: Callable[[Source, int], int]) -> Iterator[tuple[int, int, int]]:
    """``(start, end, UNCOUNTED)`` of every chunk of ``source``, about ``chunk_rows`` records each at
    ``records`` records per ``spanned`` bytes (counted in the object's first window: the same object
    gives the same figure): each ends at the first record start at or after a multiple of the
    nominal chunk size (``next_start(source, offset)``, the size when none)."""
    size = source.size
    mean = spanned / max(records, 1)
    chunk_bytes = max(1, round(chunk_rows * mean))
    if source.probed:
        # A few records' worth is enough to find a start (a longer record reads on): a whole
        # PROBE per boundary would read small chunks' objects over and over.
        source.read_ahead = int(min(source.read_ahead, max(4 * mean, MIN_WINDOW)))
    start, k = 0, 1
    while start < size:
        nominal = k * chunk_bytes
        end = size if nominal >= size else next_start(source, nominal)
        # Every nominal boundary up to ``end`` names ``end`` (no record starts between): skip them.
        k = max(k + 1, end // chunk_bytes + 1)
        if end > start:
            yield start, end, UNCOUNTED
            start = end
