"""The platform's public port: its listening sockets and its TLS context.

The control plane binds the sockets (so a port in use stops the start as before, and the port stays
open while the data-plane process that accepts on it is restarted: connections wait in the backlog);
the data-plane process inherits them and builds the TLS context from the same files.
"""
from __future__ import annotations

import socket
import ssl

BACKLOG = 2048


def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for ``host:port`` as asyncio's ``create_server`` binds them (every address the
    host resolves to, SO_REUSEADDR, IPv6 sockets v6-only)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise OSError(exc.errno, f"error while attempting to bind on address {address!r}: "
                              f"{(exc.strerror or str(exc)).lower()}") from None
            sock.listen(BACKLOG)  # not inheritable: only the data plane gets it (pass_fds), no replica or job
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def tls_context(cert: str | None, key: str | None, client_ca: str | None) -> ssl.SSLContext | None:
    """The server's SSL context from the --tls-* flags, or None for plain HTTP; a wrong file stops the start."""
    if not cert and not key and not client_ca:
        return None
    if not (cert and key):
        raise ValueError("--tls-cert and --tls-key go together (and --tls-client-ca needs both)")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
        if client_ca:
            context.load_verify_locations(client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except ssl.SSLError as exc:
        raise ValueError(f"cannot use the TLS files ({exc.reason or exc}): check that --tls-key matches "
                         "--tls-cert and that both are PEM") from None
    context.set_alpn_protocols(["http/1.1"])
    return context
