"""Which models of a deployment resource pool are hot, and where they are loaded ahead of their requests.

A pool's replica loads a model on its first request; a hot model's requests spill from its home replica
to the others once the home is busy (``Routing.choose_replica``: fewest in flight, home first), and each
such replica would pay a load on that first spilled request. So a model whose request rate over the pool
crosses ``LoadAhead.hot_requests_per_s`` (counted over the last ``window_s``) is loaded ahead on
``copies`` replicas: its home and the next ones in the pool's order (the order the gateway tries them
in), and the gateway's spill spreads its traffic over them with no load in the way. A replica's loss
then costs that model no reload either. The model stays hot until its rate falls below
``cool_requests_per_s`` (hysteresis: a rate near the threshold does not flap); a replica that still lacks
a hot model (its budget unloaded it, or it is new) is told again at most once per ``retell_s``.

The rates come from the replicas' own per-model request counters, which the platform's probe reads once
a second (``GET /v1/models``'s ``on_demand``); a replica's first probe is its baseline (a restarted
platform does not read a replica's whole history as one burst), and a counter that went down (the replica
restarted) counts from zero. Pure bookkeeping here: ``dataplane/pools.py`` probes and tells the replicas.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from modelyard.platform.dataplane.pool_home import home_order


@dataclass(frozen=True)
class LoadAhead:
    """The policy, as data (docs/pools.md says it): a model is hot from ``hot_requests_per_s`` over the last
    ``window_s`` seconds (all the pool's replicas together) until it falls below ``cool_requests_per_s``;
    a hot model is kept loaded on ``copies`` replicas (fewer if the pool has fewer)."""
    hot_requests_per_s: float = 20.0
    cool_requests_per_s: float = 5.0
    window_s: float = 5.0
    copies: int = 2
    retell_s: float = 10.0


@dataclass
class HotModels:
    """One pool's request rates per model and the hot set they give."""
    policy: LoadAhead = field(default_factory=LoadAhead)
    _last: dict[str, dict[str, int]] = field(default_factory=dict)  # replica id -> model id -> counter seen
    _seen: dict[str, deque] = field(default_factory=dict)  # model id -> (time, requests since the last sample)
    hot: set[str] = field(default_factory=set)
    _told: dict[tuple[str, str], float] = field(default_factory=dict)  # (replica, model) -> when told

    def observe(self, replica_id: str, counters: dict[str, int], now: float) -> None:
        """A probe of one replica: the request counters there of the models it reported (those that changed;
        the others keep the count last seen)."""
        last = self._last.get(replica_id)
        if last is None:  # first seen (a platform that just started, an adopted replica): a baseline, no burst
            self._last[replica_id] = dict(counters)
            return
        for model_id, count in counters.items():
            before = last.get(model_id, 0)
            delta = count - before if count >= before else count  # went down: the replica restarted
            if delta:
                self._seen.setdefault(model_id, deque()).append((now, delta))
        last.update(counters)

    def forget_replica(self, replica_id: str) -> None:
        self._last.pop(replica_id, None)
        for key in [k for k in self._told if k[0] == replica_id]:
            del self._told[key]

    def rate(self, model_id: str, now: float) -> float:
        """Requests per second over the last ``window_s`` (an unfilled window counts as the whole one)."""
        seen = self._seen.get(model_id)
        if not seen:
            return 0.0
        while seen and seen[0][0] <= now - self.policy.window_s:
            seen.popleft()
        if not seen:
            del self._seen[model_id]
            return 0.0
        return sum(n for _, n in seen) / self.policy.window_s

    def update(self, now: float) -> set[str]:
        """The hot models now: those that crossed the threshold join, those below the cool rate leave."""
        for model_id in list(self._seen):
            if self.rate(model_id, now) >= self.policy.hot_requests_per_s:
                self.hot.add(model_id)
        for model_id in list(self.hot):
            if self.rate(model_id, now) < self.policy.cool_requests_per_s:
                self.hot.discard(model_id)
                for key in [k for k in self._told if k[1] == model_id]:
                    del self._told[key]
        return set(self.hot)

    def targets(self, home: int, replica_ids: list[str]) -> list[str]:
        """The replicas a hot model is kept loaded on: its home (``home`` modulo the count, as the gateway
        counts it) and the next ones, ``copies`` in all."""
        return home_order(home, replica_ids)[:max(1, self.policy.copies)]

    def should_tell(self, replica_id: str, model_id: str, now: float) -> bool:
        """True (and remembered) unless that replica was told to load that model within ``retell_s``."""
        told = self._told.get((replica_id, model_id))
        if told is not None and now - told < self.policy.retell_s:
            return False
        self._told[(replica_id, model_id)] = now
        return True
