"""The autoscaler: how many replicas each deployed model should have, from requests in flight.

Target: ``target_in_flight`` requests in flight per replica (the gateway's own count, sampled every
supervisor tick). Scale up when the load has called for more replicas for ``up_seconds`` without a
break; scale down only after it has called for fewer for ``cooldown_seconds`` (the supervisor then
drains the replica it retires). Always within [min_replica_count, max_replica_count].
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass


SMOOTHING = 0.25  # weight of each new sample (the supervisor samples every 0.25 s)


@dataclass
class Policy:
    target_in_flight: float = 4.0
    up_seconds: float = 3.0
    cooldown_seconds: float = 60.0


@dataclass
class _State:
    current: int = 0
    above_since: float | None = None
    below_since: float | None = None
    peak: int = 0  # the most replicas the load asked for during the current stretch
    load: float = 0.0  # in-flight requests, smoothed over ~1 s of samples


class Autoscaler:
    def __init__(self, policy: Policy, clock=time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        self._state: dict[str, _State] = {}

    def desired(self, d) -> int:
        """Replicas deployed model ``d`` should have now (the supervisor clamps to min/max)."""
        st = self._state.setdefault(d.id, _State(current=max(d.min_replicas, len(d.live()))))
        st.current = max(d.min_replicas, min(d.max_replicas, st.current))
        st.load += SMOOTHING * (d.in_flight() - st.load)
        wanted = max(d.min_replicas, min(d.max_replicas, math.ceil(st.load / self.policy.target_in_flight - 1e-9)))
        now = self.clock()
        if wanted > st.current:
            st.below_since = None
            if st.above_since is None:
                st.above_since, st.peak = now, wanted
            st.peak = min(st.peak, wanted)  # sustained: the least the whole stretch asked for
            if now - st.above_since >= self.policy.up_seconds:
                st.current, st.above_since = st.peak, None
        elif wanted < st.current:
            st.above_since = None
            if st.below_since is None:
                st.below_since, st.peak = now, wanted
            st.peak = max(st.peak, wanted)
            if now - st.below_since >= self.policy.cooldown_seconds:
                st.current, st.below_since = st.peak, None
        else:
            st.above_since = st.below_since = None
        return st.current

    def forget(self, dm_id: str) -> None:
        self._state.pop(dm_id, None)
