"""Timestamps as Vertex AI writes them (RFC 3339, UTC, ``Z``)."""
from __future__ import annotations

import datetime as _dt


def rfc3339(epoch: float) -> str:
    return _dt.datetime.fromtimestamp(epoch, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
