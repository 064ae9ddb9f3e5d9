"""A pooled model's home replica: the one rule both the gateway's routing (``Routing._join_pools``) and
the pools' load-ahead (``Pools._load_ahead``) count from, so the replica a hot model is loaded ahead on is
the one its requests go to first.

Its own module because ``pools`` imports ``routing``: neither can hold the rule for the other. The
number must be the same in every process that routes (the control plane and the data-plane process)
and after a restart, so a non-numeric id is hashed with CRC-32, not Python's ``hash`` (randomized per
process for strings)."""
from __future__ import annotations

import zlib


def home_of(dm_id: str) -> int:
    """The home replica number of the pooled deployed model ``dm_id`` (taken modulo the pool's size)."""
    return int(dm_id) if dm_id.isdigit() else zlib.crc32(dm_id.encode()) & 0xFFFF
