"""Flags of the security options and their checks; ``serving/options.py`` adds and resolves them here."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from modelyard.serving.security.auth import AuthPolicy, Authorizer, TokenFileError
from modelyard.serving.security.limits import DEFAULT_MAX_DECODED_TENSOR_BYTES, Limits
from modelyard.serving.security.paths import parse_roots
from modelyard.serving.security.tls import TlsConfig, TlsConfigError, read_ssl_config


@dataclass(frozen=True)
class SecurityOptions:
    tls: TlsConfig | None = None
    auth: AuthPolicy | None = None
    limits: Limits = field(default_factory=Limits)
    max_decoded_tensor_bytes: int = DEFAULT_MAX_DECODED_TENSOR_BYTES
    model_roots: tuple[str, ...] = ()  # resolved directories every model base path must be inside

    @property
    def guards_connections(self) -> bool:
        """Whether the transports need their guarded connection classes (else the plain, faster ones)."""
        return self.tls is not None or self.auth is not None or self.limits.any


def add_flags(parser: argparse.ArgumentParser, parse_bool) -> None:
    add = parser.add_argument
    flag = dict(type=parse_bool, nargs="?", const=True, default=False, metavar="BOOL")
    add("--ssl_config_file", default=None,
        help="text SSLConfig (server_key, server_cert, custom_ca, client_verify: PEM contents) "
        "turning on TLS for both the gRPC and the REST port")
    add("--auth_token_file", default=None,
        help="bearer tokens and their scopes, one 'TOKEN predict,read,admin,metrics' per line; "
        "re-read when it changes. Every call then needs 'Authorization: Bearer TOKEN'")
    add("--auth_open_metrics", **flag, help="with --auth_token_file: serve the metrics path without a token")
    add("--auth_open_health", **flag,
        help="with --auth_token_file: serve model status (GET /v1/models/NAME, GetModelStatus) without a token")
    add("--max_connections", type=int, default=0, help="open connections per port and process (0: unlimited)")
    add("--max_header_bytes", type=int, default=0, help="REST: largest total of request headers (0: unlimited)")
    add("--max_request_line_bytes", type=int, default=0, help="REST: longest request URL (0: unlimited)")
    add("--client_timeout_seconds", type=float, default=0.0,
        help="a TLS handshake, a REST request or a gRPC call must be received within this (0: no limit)")
    add("--max_decoded_tensor_bytes", type=int, default=DEFAULT_MAX_DECODED_TENSOR_BYTES,
        help="refuse a request tensor whose declared shape decodes to more bytes (default 1 GiB)")
    add("--model_roots", default=None,
        help="DIR[,DIR...]: every model base path (flags, config file, HandleReloadConfigRequest) must "
        "resolve inside one of these, symlinks followed (default: anywhere)")


def resolve(args: argparse.Namespace) -> SecurityOptions:
    """Checked security options; ValueError (with what to fix) for a bad file or number."""
    for name in ("max_connections", "max_header_bytes", "max_request_line_bytes",
                 "client_timeout_seconds", "max_decoded_tensor_bytes"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name} cannot be negative")
    if (args.auth_open_metrics or args.auth_open_health) and not args.auth_token_file:
        raise ValueError("--auth_open_metrics/--auth_open_health only apply with --auth_token_file")
    try:
        tls = read_ssl_config(args.ssl_config_file) if args.ssl_config_file else None
        auth = None
        if args.auth_token_file:
            auth = AuthPolicy(str(args.auth_token_file), args.auth_open_metrics, args.auth_open_health)
            Authorizer(auth)  # read the file now so a malformed one stops the server before it starts
    except (TlsConfigError, TokenFileError) as exc:
        raise ValueError(str(exc)) from None
    roots = parse_roots(args.model_roots)
    limits = Limits(args.max_connections, args.max_header_bytes, args.max_request_line_bytes,
                    args.client_timeout_seconds)
    return SecurityOptions(tls, auth, limits, args.max_decoded_tensor_bytes or DEFAULT_MAX_DECODED_TENSOR_BYTES,
                           roots)
