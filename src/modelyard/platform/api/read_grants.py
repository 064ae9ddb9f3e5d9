"""What a read token (``modelyard.read_tokens``) may do at the platform's storage: GET and HEAD of the
buckets it names (``*``: any bucket, for a batch job's file list, whose entries may be anywhere), nothing else, and nothing anywhere else (the control API, the predict front and the
console never take it: ``bearer.refusal`` does not know it). One derived from a job's token works only
while that job's token is live; one derived from the platform's token, for as long as that token.

May import: the standard library, ``modelyard.read_tokens`` and ``job_tokens`` (both leaves).
"""
from __future__ import annotations

from urllib.parse import unquote

from modelyard import read_tokens
from modelyard.platform.api import job_tokens

_READS = ("GET", "HEAD")


def grant(admin_token: str | None, header: bytes | str | None) -> read_tokens.ReadToken | None:
    """The checked read token in an ``Authorization: Bearer`` header, else None (not one, a forged or
    altered one, or one whose job has ended)."""
    if not admin_token or not header:
        return None
    value = header.decode(errors="replace") if isinstance(header, bytes) else header
    if not value.startswith(f"Bearer {read_tokens.PREFIX}"):
        return None
    token = read_tokens.parse(value[len("Bearer "):])
    if token is None:
        return None
    if token.parent:
        parent = job_tokens.of_payload(admin_token, token.parent)
        if job_tokens.parse(admin_token, parent) is None or not job_tokens.is_live(parent):
            return None
    else:
        parent = admin_token
    return token if read_tokens.signed_by(parent, token) else None


def may_read(token: read_tokens.ReadToken, method: str, path: str) -> bool:
    """Whether ``token`` lets this storage request through."""
    bucket = bucket_read(method, path)
    return bucket is not None and (bucket in token.buckets or "*" in token.buckets)


def bucket_read(method: str, path: str) -> str | None:
    """The bucket a storage request reads (object metadata, media, listing, the bucket's own record),
    or None when the request is not a read of one bucket (writes, IAM, bucket lists, batch)."""
    if method not in _READS:
        return None
    parts = path.split("/")
    if path.startswith("/download/storage/v1/b/") and len(parts) >= 8 and parts[6] == "o":
        return unquote(parts[5])
    if path.startswith("/storage/v1/b/") and len(parts) >= 5 and parts[4] and (len(parts) == 5 or parts[5] == "o"):
        return unquote(parts[4])
    return None
