"""Replicas trust only their platform: each ``modelyard serve`` replica gets a bearer secret of its own.

A replica listens on a port of its host, where any local user (or, with the Ray engine, anyone on the
cluster's network) can connect. So every replica runs with ``modelyard serve``'s own token check
(``--auth_token_file``, docs/security.md): its platform writes a random secret to a file only the
platform's user can read (0600, in the replica's directory under the private state directory, or on
a Ray node in the actor's own directory), never on the command line (``ps`` shows that) nor in an
environment; the gateway and the readiness probe send it (``authorization``); a call without it is
refused by the replica (401 in TF Serving's format, gRPC UNAUTHENTICATED), health checks included.

The secret's scopes are ``predict,read,metrics`` and nothing else: no token of a replica holds
``admin``, so ``HandleReloadConfigRequest`` and the Open Inference Protocol's repository load and
unload are refused to everyone (PERMISSION_DENIED even with the secret): a replica serves only the
model its platform started it with. ``--model_roots`` confines it to that model's directory as well
(``serve_flags``). Replicas never get the platform's own token in their environment (``private_env``).

Where the platform finds a replica's secret (``authorization(row)``): what it remembered when it
started or adopted the replica, else the token file beside the replica's log (local replicas, also
those another platform of this host started).
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

TOKEN_FILE = "auth"  # in the replica's directory, beside serve.log
SCOPES = "predict,read,metrics"  # never admin: nothing may reload a replica or load a model into it
FLAG = "--auth_token_file"
# The platform's own credentials: in its environment (the user's export, or set at start for its own
# gs:// reads), never in a replica's.
PRIVATE_ENV = ("MODELYARD_PLATFORM_TOKEN", "MODELYARD_STORAGE_TOKEN")

_known: dict[str, str] = {}  # replica id -> secret, for the replicas this process started or adopted


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def write_token_file(rdir: Path, secret: str) -> Path:
    """``rdir``/auth holding ``secret`` with the replica's scopes, readable by this user only (0600 from
    its creation: never a moment readable by others)."""
    rdir.mkdir(parents=True, exist_ok=True)
    path = rdir / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        os.write(fd, f"{secret} {SCOPES}\n".encode())
    finally:
        os.close(fd)
    return path


def serve_flags(token_file: Path, model_dirs: list[Path]) -> list[str]:
    """The ``modelyard serve`` flags that make a replica trust only its platform: the token file, and
    ``--model_roots`` (the replica's own directory and its model's) so no config may name anything else.
    Appended after the operator's ``--replica-arg`` flags: the last value of a flag wins."""
    flags = [FLAG, str(token_file)]
    roots = [os.path.realpath(d) for d in model_dirs]
    if not any("," in r for r in roots):  # --model_roots is comma-separated: such a path cannot be named
        flags += ["--model_roots", ",".join(roots)]
    return flags


def remember(replica_id: str, secret: str | None) -> None:
    if secret:
        _known[replica_id] = secret


def forget(replica_id: str) -> None:
    _known.pop(replica_id, None)


def read_secret(token_file: Path) -> str | None:
    try:
        line = token_file.read_text().split("\n", 1)[0]
    except OSError:
        return None
    return line.split()[0] if line.split() else None


def secret_of(row: dict) -> str | None:
    """The secret of the replica of ``row`` (a store row), or None for a replica started without one."""
    secret = _known.get(row["id"])
    if secret is None and row.get("log_path"):
        secret = read_secret(Path(row["log_path"]).parent / TOKEN_FILE)
        remember(row["id"], secret)
    return secret


def authorization(row: dict) -> bytes | None:
    """The ``Authorization`` header value the platform sends to ``row``'s replica."""
    secret = secret_of(row)
    return f"Bearer {secret}".encode() if secret else None


def private_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the platform's credentials: neither the variables that hold them nor any other
    variable holding the same value."""
    values = {env[k] for k in PRIVATE_ENV if env.get(k)}
    return {k: v for k, v in env.items() if k not in PRIVATE_ENV and v not in values}


def token_file_of(pid: int) -> Path | None:
    """The token file a running replica was started with (read from its command line), for operators
    and tools that talk to one replica directly."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return None
    if FLAG.encode() not in args:
        return None
    return Path(os.fsdecode(args[args.index(FLAG.encode()) + 1]))
