"""The security options on grpcio's server (``--grpc_implementation=grpcio``): TLS and tokens.

The connection limits and slow-client timeout are the lean server's; grpcio keeps its own
(``docs/security.md`` says which apply).
"""
from __future__ import annotations


def grpcio_interceptors(security) -> list:
    if security is None or security.auth is None:
        return []
    from modelyard.serving.security.auth import authorizer_for
    from modelyard.serving.security.grpcio_auth import TokenInterceptor

    return [TokenInterceptor(authorizer_for(security.auth))]


def bind_grpcio(server, address: str, security) -> int:
    """Add the port, with TLS when ``--ssl_config_file`` is set; the bound port, 0 when binding failed."""
    if security is None or security.tls is None:
        return server.add_insecure_port(address)
    from modelyard.serving.security.tls import grpcio_credentials

    return server.add_secure_port(address, grpcio_credentials(security.tls))
