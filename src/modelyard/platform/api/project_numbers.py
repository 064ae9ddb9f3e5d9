"""A platform project's number: one rule for Cloud Resource Manager's ``projects.get``
(``resources/projects.py``) and the storage's buckets (``projectNumber``, which the SDK compares with
it before writing a pipeline's artifacts into a bucket). Vertex paths take any project id, so the number
is derived from the id: the same on every platform and every start, 12 digits as Google's are."""
from __future__ import annotations

import hashlib


def project_number(project_id: str) -> str:
    """A stable 12-digit number for ``project_id`` (a number stays as it is)."""
    if project_id.isdigit():
        return project_id
    digest = int.from_bytes(hashlib.sha256(project_id.encode()).digest()[:8], "big")
    return str(10**11 + digest % (9 * 10**11))
