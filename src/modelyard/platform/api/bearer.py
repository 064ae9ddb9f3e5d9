"""The platform's one bearer-token decision (``--auth-token``): the control API, the predict front,
the console and the storage API all ask it, and each answers a refusal in its own protocol's format
(Google's API error, Cloud Storage's error, the console's JSON).

May import: the standard library only (the storage process, a leaf, uses it too).
"""
from __future__ import annotations

import hmac

MISSING, INVALID = "missing", "invalid"


def refusal(expected: str | None, header: bytes | str | None) -> str | None:
    """Why a request with this ``Authorization`` header may not pass (``MISSING`` or ``INVALID``), or
    None when it may (always, when the platform has no token). Compared in constant time."""
    if not expected:
        return None
    if not header:
        return MISSING
    given = header.encode() if isinstance(header, str) else header
    return None if hmac.compare_digest(given, f"Bearer {expected}".encode()) else INVALID
