"""The platform's one bearer-token decision (``--auth-token``): the control API, the predict front,
the console and the storage API all ask it, and each answers a refusal in its own protocol's format
(Google's API error, Cloud Storage's error, the console's JSON).

Besides the platform's token, ``refusal`` lets through a live job token (``job_tokens``: what a job's
metadata server hands its processes): the storage takes it for every call, as a job's service account
reads and writes its project's buckets. The control API narrows it further (``errors.check_bearer``:
its own project only); the console and the predict front, which ask without a project, refuse it.

May import: the standard library only (the storage process, a leaf, uses it too).
"""
from __future__ import annotations

import hmac

from modelyard.platform.api import job_tokens

MISSING, INVALID = "missing", "invalid"


def refusal(expected: str | None, header: bytes | str | None) -> str | None:
    """Why a request with this ``Authorization`` header may not pass (``MISSING`` or ``INVALID``), or
    None when it may (always, when the platform has no token). Compared in constant time."""
    if not expected:
        return None
    if not header:
        return MISSING
    given = header.encode() if isinstance(header, str) else header
    if hmac.compare_digest(given, f"Bearer {expected}".encode()) or job_grant(expected, header) is not None:
        return None
    return INVALID


def job_grant(expected: str | None, header: bytes | str | None) -> job_tokens.Grant | None:
    """The job a live job token in this header speaks for (None: not one, or its job has ended)."""
    return job_tokens.live_grant(expected, header)


def project_of(path: str) -> str | None:
    """The project a request path (``projects/p/...``, with or without ``/v1/`` before it) is under."""
    parts = path.lstrip("/").split("/")
    if parts and parts[0] in ("v1", "v1beta1", "ui"):
        parts = parts[1:]
    return parts[1] if len(parts) > 1 and parts[0] == "projects" and parts[1] else None
