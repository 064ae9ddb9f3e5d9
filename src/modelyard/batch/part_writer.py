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

import errno
import fcntl
import mmap
import os
import queue
import threading
from pathlib import Path
from typing import Callable

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


# Writers finishing on their own threads (``finish``): a worker waits for them before it exits.
_FINISHING: set[threading.Thread] = set()
_FINISHING_LOCK = threading.Lock()


def wait_finished() -> None:
    """Return once every ``finish``-ed writer of this process has written, closed and run its ``then``."""
    while True:
        with _FINISHING_LOCK:
            if not _FINISHING:
                return
            thread = next(iter(_FINISHING))
        thread.join()
        with _FINISHING_LOCK:
            _FINISHING.discard(thread)


class PartWriter:
    """Streams one file; ``close()`` (or ``finish()``) when every byte is given, ``abort()`` to drop it."""

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
        self._jobs: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write_loop, name="part-writer", daemon=True)
        self._thread.start()
        self.buffer: mmap.mmap | None = self._free.get()
        self.offset = 0

    # ------------------------------------------------------------------ the writer thread
    def _write_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:  # abort
                return
            if job[0] == "end":
                self._end_of_file(*job[1:])
                return
            buf, length = job
            try:
                if self._error is None:
                    self._write(buf, 0, length)
            except BaseException as exc:  # disk full, I/O error: raised to the caller at its next call
                self._error = exc
            finally:
                self._free.put(buf)

    def _write(self, buf: mmap.mmap, start: int, stop: int) -> None:
        with memoryview(buf) as whole, whole[start:stop] as view:
            done = 0
            while done < len(view):
                try:
                    done += os.write(self._fd, view[done:])
                except OSError as exc:
                    if exc.errno != errno.EINVAL or not self._direct:
                        raise
                    # The device wants a larger alignment than 4 KiB: through the page cache.
                    self._buffered()

    def _end_of_file(self, buf: mmap.mmap, full: int, stop: int, then, failed) -> None:
        """Last job: the unaligned tail, close, then ``then()`` (or ``failed(error)``)."""
        try:
            if self._error is None and stop > full:
                if self._direct:  # the tail is not a whole block: O_DIRECT would refuse it
                    self._buffered()
                self._write(buf, full, stop)
        except BaseException as exc:
            self._error = exc
        if not full:
            self._free.put(buf)  # never handed to a write job: back with the others
        self._release()
        if then is None:  # close(): the caller joins and checks
            return
        try:
            self._check()
            then()
        except BaseException as exc:
            failed(exc)
        finally:
            with _FINISHING_LOCK:
                _FINISHING.discard(threading.current_thread())

    def _buffered(self) -> None:
        """Drop O_DIRECT for the rest of the file (the fd first, then the flag the caller reads)."""
        fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        self._direct = False

    def _check(self) -> None:
        if self._error is not None:
            raise OSError(f"writing {self.path}: {self._error}") from self._error

    # ------------------------------------------------------------------ the caller's side
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

    def _end(self, then, failed) -> None:
        full = self.offset - self.offset % _BLOCK if self._direct else self.offset
        buf, self.buffer = self.buffer, None  # from here on the thread owns every buffer
        if full:
            self._jobs.put((buf, full))
        self._jobs.put(("end", buf, full, self.offset, then, failed))

    def close(self) -> None:
        """Write what is left and close the file; raises if any write failed."""
        self._end(None, None)
        self._thread.join()
        self._check()

    def finish(self, then: Callable[[], None], failed: Callable[[BaseException], None]) -> None:
        """``close()`` on the writer's thread, which then calls ``then()`` (or ``failed(error)`` when a
        write or ``then`` fails); returns at once, so the caller goes on with its next file."""
        with _FINISHING_LOCK:
            _FINISHING.add(self._thread)
        self._end(then, failed)

    def abort(self) -> None:
        """Stop writing and close the file (the caller deletes it)."""
        self._error = self._error or RuntimeError("aborted")
        if self.buffer is not None:  # not yet ended: stop the thread here
            self._jobs.put(None)
            self._thread.join()
            self._release()

    def _release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            # The thread has stopped or is ending: every buffer is either free or the one being filled.
            while not self._free.empty():
                _give_back(self._free.get())
            if self.buffer is not None:
                _give_back(self.buffer)
                self.buffer = None
