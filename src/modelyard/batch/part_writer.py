"""A chunk's results file, written from reused page-aligned buffers by a thread, bypassing the page cache.

A batch job writes about as many bytes as it reads (each result line echoes its instance).
Through the page cache those writes cost the worker a kernel copy per byte and, once the
job has written a few GB, stall it while the kernel flushes dirty pages (measured here:
a 1M-row job's workers spent more time in ``write`` than in the model). With ``O_DIRECT``
the disk reads the bytes straight from our buffers, and a thread does the waiting while the
worker parses and predicts the next batch.

The caller fills ``buffer`` from ``offset`` (``room(size)`` guarantees the space) and moves
``offset`` on. Full 4 KiB blocks go to the thread; the unaligned tail is written last,
without ``O_DIRECT``, by ``close``. Where ``O_DIRECT`` is refused (tmpfs, some network file
systems), the same thread writes through the page cache instead.
"""
from __future__ import annotations

import mmap
import os
import queue
import threading
from pathlib import Path

_BLOCK = 4096
_BUFFER_BYTES = 4 << 20  # a few batches of result lines; large writes keep the disk busy

# Buffers outlive their writer: a worker writes chunk after chunk, and a fresh buffer costs a
# page fault per 4 KiB on first touch (measured: more than copying the bytes in).
_POOL: list[mmap.mmap] = []
_POOL_LOCK = threading.Lock()


def _take(size: int) -> mmap.mmap:
    with _POOL_LOCK:
        for i, buf in enumerate(_POOL):
            if len(buf) == size:
                return _POOL.pop(i)
    return mmap.mmap(-1, size)


def _give_back(buf: mmap.mmap) -> None:
    with _POOL_LOCK:
        if len(_POOL) < 6:
            _POOL.append(buf)
            return
    try:
        buf.close()
    except BufferError:  # a view of it is still alive (an exception's frame): the GC frees it later
        pass


class PartWriter:
    """Streams one file; ``close()`` returns when every byte is written, ``abort()`` drops it."""

    def __init__(self, path: Path, buffer_bytes: int = _BUFFER_BYTES):
        self.path = path
        self._direct = hasattr(os, "O_DIRECT")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        try:
            self._fd = os.open(path, flags | (os.O_DIRECT if self._direct else 0), 0o644)
        except OSError:  # EINVAL: the file system takes no O_DIRECT
            self._direct = False
            self._fd = os.open(path, flags, 0o644)
        self._size = buffer_bytes
        # Three buffers: one being filled, one being written, one spare so filling never waits for a write.
        self._free: queue.Queue[mmap.mmap] = queue.Queue()
        for _ in range(3):
            self._free.put(_take(buffer_bytes))
        self._jobs: queue.Queue[tuple[mmap.mmap, int] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write_loop, name="part-writer", daemon=True)
        self._thread.start()
        self.buffer = self._free.get()
        self.offset = 0

    def _write_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            buf, length = job
            try:
                if self._error is None:
                    with memoryview(buf) as whole, whole[:length] as view:
                        done = 0
                        while done < length:
                            done += os.write(self._fd, view[done:])
            except BaseException as exc:  # disk full, I/O error: raised to the caller at its next call
                self._error = exc
            finally:
                self._free.put(buf)

    def _check(self) -> None:
        if self._error is not None:
            raise OSError(f"writing {self.path}: {self._error}") from self._error

    def room(self, size: int) -> None:
        """Make sure ``size`` bytes fit at ``offset`` in ``buffer`` (handing full blocks to the thread)."""
        self._check()
        if self.offset + size <= self._size:
            return
        if size > self._size - _BLOCK:
            self._grow(self.offset + size)
            return
        full = self.offset - self.offset % _BLOCK if self._direct else self.offset
        nxt = self._free.get()
        tail = self.offset - full
        nxt[:tail] = self.buffer[full:self.offset]
        if full:
            self._jobs.put((self.buffer, full))
        else:
            self._free.put(self.buffer)
        self.buffer, self.offset = nxt, tail

    def _grow(self, size: int) -> None:
        """A single write larger than a buffer (a huge line): every buffer grows to hold it."""
        self._drain()
        self._size = -(-size // _BLOCK) * _BLOCK + _BLOCK
        bigger = mmap.mmap(-1, self._size)
        bigger[:self.offset] = self.buffer[:self.offset]
        while not self._free.empty():
            _give_back(self._free.get())
        _give_back(self.buffer)
        self.buffer = bigger
        for _ in range(2):
            self._free.put(mmap.mmap(-1, self._size))

    def _drain(self) -> None:
        """Wait until the thread has written everything handed to it."""
        while self._free.qsize() < 2:  # the two buffers not being filled are back
            self._thread.join(0.001)
            self._check()
        self._check()

    def write(self, data: bytes) -> None:
        self.room(len(data))
        self.buffer[self.offset:self.offset + len(data)] = data
        self.offset += len(data)

    def close(self) -> None:
        """Write what is left and close the file; raises if any write failed."""
        try:
            full = self.offset - self.offset % _BLOCK if self._direct else self.offset
            buf = self.buffer
            if full:
                self.buffer = None  # the thread hands it back through the free queue
                self._jobs.put((buf, full))
            self._jobs.put(None)
            self._thread.join()
            self._check()
            if self.offset > full:
                if self._direct:  # the tail is not a whole block: O_DIRECT would refuse it
                    import fcntl

                    fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                with memoryview(buf) as whole, whole[full:self.offset] as tail:
                    done = 0
                    while done < len(tail):
                        done += os.write(self._fd, tail[done:])
        finally:
            self._release()

    def abort(self) -> None:
        """Stop writing and close the file (the caller deletes it)."""
        self._error = self._error or RuntimeError("aborted")
        self._jobs.put(None)
        self._thread.join()
        self._release()

    def _release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            # The thread has stopped: every buffer is either free or the one being filled.
            while not self._free.empty():
                _give_back(self._free.get())
            if self.buffer is not None:
                _give_back(self.buffer)
                self.buffer = None
