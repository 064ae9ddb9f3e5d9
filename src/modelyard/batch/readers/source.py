"""Where a reader's bytes come from while a file is planned: a local file, or ranged reads of an object.

Planning needs a file's size and its bytes in order, only as far as the plan has got: the line
formats count newlines block by block, TFRecord hops from one record header to the next. A local
file is mapped (``FileSource``); a file in object storage (``RangedSource``) is read by ranged
reads, one block at a time as the plan advances, so a job's first chunk is planned once its own
bytes are read and the object is never copied whole first. Both hand the readers the same bytes
in the same blocks, so the one planning rule gives the same chunks wherever the file is.

A ``RangedSource(probe=True)`` is one whose chunks are read by whoever predicts them (the Ray
engine's actors): the plan only finds where chunks start, by small reads (``peek``) at each nominal
boundary (``split``), so it reads a few KiB per chunk, not the object.

May import: the standard library and NumPy only (the storage client is the caller's ``fetch``).
"""
from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator

import numpy as np

BLOCK = 4 << 20
# What a probe reads at a nominal chunk boundary (more when a record is longer).
PROBE = 64 << 10
# A mapping's touched pages count in the process's RSS: each WINDOW counted is dropped from it.
WINDOW = 64 << 20


class Source:
    """A file's ``name`` (what messages and the plan say), ``size``, and its bytes by position."""

    name: str
    size: int
    read_ahead = BLOCK  # bytes fetched for a small ``read``
    _gapless = False  # small reads fetch on from the last read-ahead's end when close to it
    probed = False  # split by probes (``split``), not scanned: see RangedSource

    def __init__(self) -> None:
        self._buffered = b""
        self._buffered_at = 0

    def _fetch(self, start: int, end: int) -> bytes:
        raise NotImplementedError

    def read(self, pos: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``pos`` (fewer at the end), through one block of read-ahead: the
        small reads of a record-by-record scan cost one fetch per block, not one each."""
        end = min(pos + n, self.size)
        if pos >= end:
            return b""
        at = self._buffered_at
        if not (at <= pos and end <= at + len(self._buffered)):
            if end - pos > self.read_ahead:
                return self._fetch(pos, end)
            after = at + len(self._buffered)
            if self._gapless and self._buffered and at <= pos < after + self.read_ahead:
                # A scan hopping over records still fetches every byte once (kept for the chunks): on
                # from the last read-ahead's end, what is left of it (a straddling header) kept in front.
                more = self._fetch(after, min(max(after + self.read_ahead, end), self.size))
                self._buffered = self._buffered[pos - at:] + more if pos < after else more
                self._buffered_at = at = min(pos, after)
            else:
                self._buffered = self._fetch(pos, min(pos + self.read_ahead, self.size))
                self._buffered_at = at = pos
        return self._buffered[pos - at:end - at]

    def peek(self, pos: int, least: int = 1) -> bytes:
        """The bytes from ``pos`` the read-ahead holds (at least ``least`` of them unless the file
        ends first), fetching one window (``read_ahead``) at ``pos`` when it holds fewer: a probe
        walks a window without fetching any byte twice."""
        if pos >= self.size:
            return b""
        at, after = self._buffered_at, self._buffered_at + len(self._buffered)
        if not (at <= pos < after and (pos + least <= after or after == self.size)):
            self._buffered = self._fetch(pos, min(pos + max(self.read_ahead, least), self.size))
            self._buffered_at = at = pos
        return self._buffered[pos - at:]

    def blocks(self, start: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(offset, bytes)`` of the BLOCK-sized pieces of the file from ``start`` to its end."""
        for pos in range(start, self.size, BLOCK):
            yield pos, np.frombuffer(self._fetch(pos, min(pos + BLOCK, self.size)), np.uint8)


class FileSource(Source):
    """A local file; its blocks are mapped rather than read (the page cache's bytes are counted where
    they are: a 2 GB file in 0.37 s, against 0.49 s through a read buffer)."""

    read_ahead = 64 << 10  # a local read is cheap: a TFRecord scan need not read the records' bodies

    def __init__(self, path: str) -> None:
        super().__init__()
        self.name = path
        self.size = os.stat(path).st_size

    def _fetch(self, start: int, end: int) -> bytes:
        with open(self.name, "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def blocks(self, start: int) -> Iterator[tuple[int, np.ndarray]]:
        base = start - start % mmap.ALLOCATIONGRANULARITY
        if self.size <= base:
            return
        with open(self.name, "rb") as f:
            # Not closed here: the caller may still hold the last block; the map goes with its last view.
            mapped = mmap.mmap(f.fileno(), self.size - base, access=mmap.ACCESS_READ, offset=base)
        mapped.madvise(mmap.MADV_SEQUENTIAL)
        whole = np.frombuffer(mapped, np.uint8)
        dropped = 0  # the mapping's bytes below this were dropped
        for pos in range(start, self.size, BLOCK):
            yield pos, whole[pos - base:pos - base + BLOCK]
            if pos + BLOCK - base - dropped >= WINDOW:
                done = (min(pos + BLOCK, self.size) - base) // mmap.PAGESIZE * mmap.PAGESIZE
                mapped.madvise(mmap.MADV_DONTNEED, dropped, done - dropped)
                dropped = done


class RangedSource(Source):
    """A file read by ranged reads: ``fetch(start, end)`` returns bytes ``[start, end)`` of the
    object named ``name`` (a ``gs://`` or ``s3://`` URI), whose ``size`` the caller looked up.

    ``probe``: the object's chunks are read by whoever predicts them, each its own range; the plan
    splits it by probes (``split``: a window of ``PROBE`` bytes at each nominal boundary).

    ``keep``: the bytes fetched are kept until ``take`` hands them out, so the plan's reads can be
    the chunks' reads too (for a format that cannot be probed, CSV: the plan reads every byte, and
    its reads are the chunks', so the object crosses storage once)."""

    def __init__(self, name: str, size: int, fetch: Callable[[int, int], bytes], keep: bool = False,
                 probe: bool = False) -> None:
        super().__init__()
        self.name, self.size, self._get = name, size, fetch
        self._kept: list[tuple[int, bytes]] | None = [] if keep and not probe else None
        self._gapless = self._kept is not None
        self.probed = probe
        if probe:
            self.read_ahead = PROBE

    def _checked(self, start: int, end: int, data: bytes) -> bytes:
        if len(data) != end - start:  # the object is shorter than when it was looked up
            raise ValueError(f"{self.name} changed while it was planned: bytes {start}-{end} gave "
                             f"{len(data)} bytes")
        return data

    def _fetch(self, start: int, end: int) -> bytes:
        data = self._checked(start, end, self._get(start, end))
        if self._kept is not None and data:
            self._kept.append((start, data))
        return data

    def take(self, start: int, end: int) -> bytes | None:
        """Bytes ``[start, end)`` (a chunk just planned): those the plan's reads hold, and any they
        skipped (a TFRecord scan reads headers, so a long record's body) fetched now; None without
        ``keep``. What lies wholly before ``end`` is let go: chunks are taken in order."""
        if self._kept is None:
            return None
        pieces, pos = [], start
        for at, data in sorted(self._kept, key=lambda kept: kept[0]):
            if pos >= end:
                break
            if at + len(data) <= pos:
                continue
            if at > pos:  # never read: read now, once
                pieces.append(self._checked(pos, min(at, end), self._get(pos, min(at, end))))
                pos = min(at, end)
            if pos < end and at <= pos:
                pieces.append(data[pos - at:min(end, at + len(data)) - at])
                pos += len(pieces[-1])
        if pos < end:  # past the scan's reads: the scan goes on from this read's end
            pieces.append(self._checked(pos, end, self._get(pos, end)))
            self._buffered, self._buffered_at = pieces[-1], pos
        self._kept = [(at, data) for at, data in self._kept if at + len(data) > end]
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def opened(file: str | Source) -> Source:
    """``file`` as a Source: a local path becomes a ``FileSource``."""
    return file if isinstance(file, Source) else FileSource(file)
