"""A read-only storage token derived from a token its holder has (issue 43): what a replica or a batch
worker on a Ray node gets instead of the token of the process that started it (the platform's own, or a
job's).

``attenuate(token, buckets)`` needs no key but the token itself, as a macaroon's caveat does: the
derived token is ``myro1.<payload>.<signature>``; its payload names the buckets it may read and the
token it was derived from (a job token's public payload, or nothing for the platform's own token; never
a secret), and its signature is an HMAC keyed by that parent token. Whoever holds a token can derive a
narrower one; a derived token gives back neither its parent nor a wider grant. The storage, which holds
the platform's token, rebuilds the parent and checks the signature (``platform.api.read_grants``): reads
(GET, HEAD) of the named buckets only, and for a job's token, only while that job's token is live.

May import: the standard library only (batch workers and the platform both use it).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Iterable

PREFIX = "myro1."
JOB_PREFIX = "myjob1."  # platform.api.job_tokens.PREFIX: a job token's payload is public, its signature not


@dataclass(frozen=True)
class ReadToken:
    """A parsed read token (not yet checked: ``signed_by``)."""

    parent: str  # the payload of the job token it was derived from; "" for the platform's own token
    buckets: frozenset[str]
    payload: str
    signature: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _sign(parent_token: str, payload: str) -> str:
    key = hmac.new(parent_token.encode(), b"modelyard read token v1", hashlib.sha256).digest()
    return _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())


def attenuate(token: str, buckets: Iterable[str]) -> str:
    """A token that may only read objects of ``buckets``, derived from ``token`` (the platform's or a
    job's). A read token is not derived again: ValueError."""
    if token.startswith(PREFIX):
        raise ValueError("a read token cannot be narrowed again: derive it from the token it came from")
    parent = token[len(JOB_PREFIX):].partition(".")[0] if token.startswith(JOB_PREFIX) else ""
    doc = {"parent": parent, "buckets": sorted(set(buckets)), "n": secrets.token_hex(8)}
    payload = _b64(json.dumps(doc, separators=(",", ":")).encode())
    return f"{PREFIX}{payload}.{_sign(token, payload)}"


def parse(token: str) -> ReadToken | None:
    """The read token's claims (unchecked), or None when ``token`` is not one."""
    if not token.startswith(PREFIX):
        return None
    payload, _, signature = token[len(PREFIX):].partition(".")
    try:
        doc = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        parent, buckets = doc["parent"], doc["buckets"]
        if not isinstance(parent, str) or not isinstance(buckets, list) or \
                not all(isinstance(b, str) for b in buckets):
            return None
    except (ValueError, KeyError, TypeError):
        return None
    return ReadToken(parent, frozenset(buckets), payload, signature)


def signed_by(parent_token: str, token: ReadToken) -> bool:
    """Whether ``token`` was derived from ``parent_token`` (compared in constant time)."""
    return hmac.compare_digest(token.signature.encode(), _sign(parent_token, token.payload).encode())
