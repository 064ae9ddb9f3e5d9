"""Answers written at the end of the event loop's pass: every connection's in one call, GIL released.

A completed batch wakes the loop with dozens of answers at once. Written one by one through
the transport, each loopback ``send()`` ran in the kernel for tens of microseconds with the
GIL held, while the batch thread waited for the GIL to start its next model run. Here the
answers of a pass queue per connection and a single ``_sendmany.send_many`` call sends them
all with the GIL released; what a socket does not take goes to its transport, which queues it
(or reports the connection's error) as usual.

Order on a connection is kept: its answers are joined in the order written, and a connection
whose transport already holds unsent bytes writes through the transport. Without the C
extension (installed without a compiler) every write goes straight to the transport.
"""
from __future__ import annotations

import asyncio

try:
    from modelyard.serving.transport._sendmany import send_many
except ImportError:  # the extension is optional
    send_many = None


def socket_fd(transport: asyncio.BaseTransport) -> int:
    """The transport's socket descriptor for ``ResponseWriter``, or -1 (write through the transport)."""
    if send_many is None or transport.get_extra_info("sslcontext") is not None:
        return -1  # a TLS transport must encrypt: never write its socket directly
    sock = transport.get_extra_info("socket")
    return sock.fileno() if sock is not None else -1


class ResponseWriter:
    """One per event loop, shared by its connections."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        # transport -> [fd, chunk, chunk, ...], in the order first written this pass
        self._pending: dict[asyncio.WriteTransport, list] = {}

    def write(self, transport: asyncio.WriteTransport, fd: int, data: bytes) -> None:
        """Send ``data`` on ``transport`` (socket ``fd``, or -1) at the end of this pass."""
        queued = self._pending.get(transport)
        if queued is not None:
            queued.append(data)
        elif fd < 0 or transport.get_write_buffer_size():
            transport.write(data)
        else:
            if not self._pending:
                self.loop.call_soon(self.flush)
            self._pending[transport] = [fd, data]

    def close(self, transport: asyncio.WriteTransport) -> None:
        """Close ``transport`` once what was written to it is sent (the transport sends its queue first)."""
        self.hand_over(transport)
        transport.close()

    def hand_over(self, transport: asyncio.WriteTransport) -> None:
        """Give ``transport`` its queued bytes now: its peer half-closed, so the transport is about to
        close, and it sends what it holds before closing (a queued answer would be skipped)."""
        queued = self._pending.pop(transport, None)
        if queued is not None:
            transport.write(b"".join(queued[1:]))

    def forget(self, transport: asyncio.BaseTransport) -> None:
        """The connection is gone: drop its unsent answers (its descriptor may be reused)."""
        self._pending.pop(transport, None)

    def flush(self) -> None:
        pending, self._pending = self._pending, {}
        transports, fds, buffers = [], [], []
        for transport, queued in pending.items():
            if transport.is_closing():  # closed since: its descriptor is no longer ours to write
                continue
            data = queued[1] if len(queued) == 2 else b"".join(queued[1:])
            if transport.get_write_buffer_size():
                transport.write(data)
                continue
            transports.append(transport)
            fds.append(queued[0])
            buffers.append(data)
        if not fds:
            return
        for transport, data, sent in zip(transports, buffers, send_many(fds, buffers)):
            if sent < len(data):
                # The rest, or all of it after an error: the transport queues it, or fails the
                # connection the way it fails any write.
                transport.write(data[sent:] if sent > 0 else data)
