"""The autoscaler: how many replicas each deployed model should have, from requests in flight.

Target: ``target_in_flight`` requests in flight per replica (the gateway's own count, sampled every
supervisor tick). Scale up when the *average* in flight over the last ``up_seconds`` calls for more
replicas: an average, because the instantaneous count of a saturated replica dips now and then
(a client between two requests), and a rule that every sample must call for more restarted its
wait at each dip (scale-ups took 20 s under a steady overload). A load far above the target tips
the average sooner than ``up_seconds`` after it starts, as in Knative's and Ray Serve's windowed
averages; a spike that the whole window's average absorbs does not scale. Scale down only after the load,
smoothed over about a second, has called for fewer for ``cooldown_seconds`` without a break (to
the most it asked for meanwhile; the supervisor then drains the replica it retires). Always within
[min_replica_count, max_replica_count].
"""
from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass, field


SMOOTHING = 0.25  # weight of each new sample (the supervisor samples every 0.25 s)


@dataclass
class Policy:
    target_in_flight: float = 4.0
    up_seconds: float = 3.0
    cooldown_seconds: float = 60.0


@dataclass
class _State:
    current: int = 0
    window: collections.deque = field(default_factory=collections.deque)  # (time, in flight) samples
    window_start: float = 0.0  # the window counts only samples after this (the last change)
    below_since: float | None = None
    peak: int = 0  # the most replicas the load asked for while below
    load: float = 0.0  # in-flight requests, smoothed over ~1 s of samples


class Autoscaler:
    def __init__(self, policy: Policy, clock=time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        self._state: dict[str, _State] = {}

    def _replicas_for(self, load: float, d) -> int:
        return max(d.min_replicas, min(d.max_replicas, math.ceil(load / self.policy.target_in_flight - 1e-9)))

    def desired(self, d) -> int:
        """Replicas deployed model ``d`` should have now (the supervisor clamps to min/max)."""
        now = self.clock()
        st = self._state.get(d.id)
        if st is None:
            st = self._state[d.id] = _State(current=max(d.min_replicas, len(d.live())), window_start=now)
        st.current = max(d.min_replicas, min(d.max_replicas, st.current))
        sample = d.in_flight()
        st.load += SMOOTHING * (sample - st.load)
        st.window.append((now, sample))
        while st.window and st.window[0][0] < now - self.policy.up_seconds:
            st.window.popleft()

        # Up: the window must span up_seconds of samples taken since the last change.
        if now - st.window_start >= self.policy.up_seconds:
            average = sum(v for _, v in st.window) / len(st.window)
            up = self._replicas_for(average, d)
            if up > st.current:
                st.current, st.window_start, st.below_since = up, now, None
                return st.current

        wanted = self._replicas_for(st.load, d)
        if wanted < st.current:
            if st.below_since is None:
                st.below_since, st.peak = now, wanted
            st.peak = max(st.peak, wanted)
            if now - st.below_since >= self.policy.cooldown_seconds:
                st.current, st.below_since, st.window_start = st.peak, None, now
        else:
            st.below_since = None
        return st.current

    def forget(self, dm_id: str) -> None:
        self._state.pop(dm_id, None)
