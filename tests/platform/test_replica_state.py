"""A replica's state as operators see it: one rule (``Replica.state``) behind the replicas API and
both consoles, so a replica that misses its readiness deadline shows UNREADY everywhere, never SERVING."""
from __future__ import annotations

import time

from modelyard.platform.dataplane.routing import Replica
from modelyard.web.console import platform_page, platform_state


class _Deployed:
    def __init__(self, replicas):
        self.replicas = replicas


def _replica(rid: str, **flags) -> Replica:
    replica = Replica(row={"id": rid, "host": "127.0.0.1", "port": 1, "pid": None})
    for name, value in flags.items():
        setattr(replica, name, value)
    return replica


def test_each_condition_has_its_state_and_dead_wins_over_the_rest():
    now = time.monotonic()
    assert _replica("a").state == "SERVING"
    assert _replica("b", unready_since=now).state == "UNREADY"
    assert _replica("c", draining=True, unready_since=now).state == "DRAINING"
    assert _replica("d", dead=True, draining=True, unready_since=now).state == "DEAD"


def test_the_console_shows_an_unready_replica_as_unready_and_does_not_count_it_serving():
    replicas = platform_state._replicas(_Deployed([_replica("a"), _replica("b", unready_since=time.monotonic())]))
    assert [(r["id"], r["state"]) for r in replicas] == [("a", "SERVING"), ("b", "UNREADY")]
    assert platform_page._replica_summary(replicas) == "1/2 serving"
