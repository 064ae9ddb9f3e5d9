"""TLS from TF Serving's ``--ssl_config_file``: an SSLConfig text proto holding PEM *contents*.

SSLConfig (tensorflow_serving/config/ssl_config.proto) has four fields: ``server_key``,
``server_cert``, ``custom_ca`` and ``client_verify``. The tensorflow-serving-api wheel ships
no generated class for it, so the message is declared here from the same field numbers.
One config serves both ports: the REST server and the lean gRPC server get an
``ssl.SSLContext`` (ALPN ``h2`` for gRPC, ``http/1.1`` for REST); grpcio gets its own
credentials object built from the same PEM strings.
"""
from __future__ import annotations

import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from modelyard.serving.textproto import parse_text_proto, read_flag_file

FLAG = "--ssl_config_file"


def _ssl_config_class():
    # Field numbers and names as in tensorflow_serving/config/ssl_config.proto.
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="modelyard/ssl_config.proto", package="tensorflow.serving", syntax="proto3")
    message = file_proto.message_type.add(name="SSLConfig")
    F = descriptor_pb2.FieldDescriptorProto
    for number, name, kind in ((1, "server_key", F.TYPE_STRING), (2, "server_cert", F.TYPE_STRING),
                               (3, "custom_ca", F.TYPE_STRING), (4, "client_verify", F.TYPE_BOOL)):
        message.field.add(name=name, number=number, type=kind, label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.serving.SSLConfig"))


SSLConfigProto = _ssl_config_class()


@dataclass(frozen=True)
class TlsConfig:
    """The PEM texts of an SSLConfig (plain strings, so worker processes can receive it)."""

    server_key: str
    server_cert: str
    custom_ca: str = ""
    client_verify: bool = False


class TlsConfigError(ValueError):
    """An SSLConfig that cannot serve; the message names the file and what to fix."""


def read_ssl_config(path: str | Path) -> TlsConfig:
    """Read and check ``--ssl_config_file``: both contexts are built once here so a bad key fails at start."""
    from modelyard.errors import ServingError

    try:
        proto = parse_text_proto(read_flag_file(path, FLAG), SSLConfigProto(), f"{FLAG} {path}")
    except ServingError as exc:
        raise TlsConfigError(exc.message) from None
    config = TlsConfig(proto.server_key, proto.server_cert, proto.custom_ca, proto.client_verify)
    if not config.server_key or not config.server_cert:
        raise TlsConfigError(f"{FLAG} {path}: server_key and server_cert must both hold PEM text")
    if config.client_verify and not config.custom_ca:
        raise TlsConfigError(f"{FLAG} {path}: client_verify needs custom_ca, the CA that signs client certificates")
    try:
        server_context(config, "http/1.1")
    except (ssl.SSLError, ValueError) as exc:
        raise TlsConfigError(f"{FLAG} {path}: the key, certificate or CA is not usable PEM: {exc}") from None
    return config


def server_context(config: TlsConfig, alpn: str) -> ssl.SSLContext:
    """A server-side context offering ``alpn`` (``h2`` or ``http/1.1``), TLS 1.2 or later."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols([alpn])
    # ssl reads a key and certificate only from files: a private (0600) temporary file that
    # lives for the duration of this call.
    fd, name = tempfile.mkstemp(prefix="modelyard-tls-", dir=_private_dir())
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(config.server_key.strip() + "\n" + config.server_cert.strip() + "\n")
        context.load_cert_chain(name)
    finally:
        os.unlink(name)
    if config.custom_ca:
        context.load_verify_locations(cadata=config.custom_ca)
    if config.client_verify:
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _private_dir() -> str | None:
    shm = "/dev/shm"  # memory-backed: the key never reaches a disk
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def grpcio_credentials(config: TlsConfig):
    """The same config as grpcio server credentials (``--grpc_implementation=grpcio``)."""
    import grpc

    return grpc.ssl_server_credentials(
        [(config.server_key.encode(), config.server_cert.encode())],
        root_certificates=config.custom_ca.encode() if config.custom_ca else None,
        require_client_auth=config.client_verify,
    )
