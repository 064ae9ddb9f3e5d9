"""A job's own token, behind the platform's ``--auth-token``: what its metadata server gives its processes
instead of the platform's token.

A job token is ``myjob1.<payload>.<signature>``: the payload names the job and its project, the signature
is an HMAC keyed by the platform's token, so the API and the storage process (which both hold that
token) check it without asking anyone. It is live while a file named by its digest exists in the job
tokens directory (``MODELYARD_JOB_TOKENS_DIR``, which the platform sets before it starts its storage, so
both see it): the job runner writes that file when it starts the job and removes it when the job ends,
so the token stops working then. Scope (``bearer``): the storage, and the control API of its own project.

May import: the standard library only (the storage process checks tokens too).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

PREFIX = "myjob1."
DIR_ENV = "MODELYARD_JOB_TOKENS_DIR"


@dataclass(frozen=True)
class Grant:
    """Who a live job token speaks for."""

    job: str  # the job's resource name, projects/p/locations/l/customJobs/id
    project: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _key(admin_token: str) -> bytes:
    return hmac.new(admin_token.encode(), b"modelyard job token v1", hashlib.sha256).digest()


def _sign(admin_token: str, payload: str) -> str:
    return _b64(hmac.new(_key(admin_token), payload.encode(), hashlib.sha256).digest())


def mint(admin_token: str, job: str, project: str) -> str:
    """A new token for ``job`` of ``project`` (not live until ``activate``)."""
    payload = _b64(json.dumps({"job": job, "project": project, "n": secrets.token_hex(8)}).encode())
    return f"{PREFIX}{payload}.{_sign(admin_token, payload)}"


def of_payload(admin_token: str, payload: str) -> str:
    """The job token whose public payload is ``payload`` (what a read token derived from it names:
    ``modelyard.read_tokens``)."""
    return f"{PREFIX}{payload}.{_sign(admin_token, payload)}"


def parse(admin_token: str | None, token: str) -> Grant | None:
    """The grant of a token signed with ``admin_token`` (live or not); None for anything else."""
    if not admin_token or not token.startswith(PREFIX):
        return None
    payload, _, signature = token[len(PREFIX):].partition(".")
    if not hmac.compare_digest(signature.encode(), _sign(admin_token, payload).encode()):
        return None
    try:
        doc = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return Grant(str(doc["job"]), str(doc["project"]))
    except (ValueError, KeyError, TypeError):
        return None


def directory() -> Path | None:
    """Where live tokens are marked (``MODELYARD_JOB_TOKENS_DIR``); None: no job token is live."""
    value = os.environ.get(DIR_ENV)
    return Path(value) if value else None


def _marker(token: str, where: Path) -> Path:
    return where / hashlib.sha256(token.encode()).hexdigest()[:40]


def is_live(token: str, where: Path | None = None) -> bool:
    where = where or directory()
    return where is not None and _marker(token, where).exists()


def activate(token: str, job: str, where: Path | None = None) -> None:
    """Make ``token`` live (the file holds the job's name, for ``revoke``)."""
    where = where or directory()
    if where is None:
        raise RuntimeError(f"{DIR_ENV} is not set: job tokens cannot be made live")
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    _marker(token, where).write_text(job)


def revoke(job: str, where: Path | None = None) -> int:
    """End every live token of ``job``; how many."""
    where = where or directory()
    if where is None or not where.is_dir():
        return 0
    ended = 0
    for marker in where.iterdir():
        try:
            if marker.read_text() == job:
                marker.unlink()
                ended += 1
        except OSError:
            continue
    return ended


def live_grant(admin_token: str | None, header: bytes | str | None) -> Grant | None:
    """The grant of the live job token in an ``Authorization: Bearer`` header, else None."""
    if not header:
        return None
    value = header.decode(errors="replace") if isinstance(header, bytes) else header
    if not value.startswith(f"Bearer {PREFIX}"):
        return None
    token = value[len("Bearer "):]
    grant = parse(admin_token, token)
    return grant if grant is not None and is_live(token) else None
