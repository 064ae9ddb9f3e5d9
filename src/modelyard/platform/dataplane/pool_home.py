"""A pooled model's home replica and the order it tries the pool's replicas in: the one rule both the
gateway's routing (``Routing._join_pools``, ``Routing.choose_replica``) and the pools' load-ahead
(``HotModels.targets``) count from, so the replicas a hot model is loaded ahead on are the ones its
requests go to first.

Its own module because ``pools`` imports ``routing``: neither can hold the rule for the other. The
number must be the same in every process that routes (the control plane and the data-plane process)
and after a restart, so a non-numeric id is hashed with CRC-32, not Python's ``hash`` (randomized per
process for strings)."""
from __future__ import annotations

import zlib
from typing import TypeVar

T = TypeVar("T")


def home_of(dm_id: str) -> int:
    """The home replica number of the pooled deployed model ``dm_id`` (taken modulo the pool's size)."""
    return int(dm_id) if dm_id.isdigit() else zlib.crc32(dm_id.encode()) & 0xFFFF


def home_order(home: int, replicas: list[T]) -> list[T]:
    """``replicas`` in the order a pooled model tries them: its home (``home`` modulo their count) first,
    then the next ones, wrapping round."""
    k = home % len(replicas) if replicas else 0
    return replicas[k:] + replicas[:k]
