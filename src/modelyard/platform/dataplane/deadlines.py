"""How long the gateway waits for one replica's answer before it retries the predict on another.

A replica that is up but stuck (stopped, swapped out, deadlocked) answers nothing and closes
nothing, so only a deadline frees the requests sent to it. The deadline is derived from what the
deployed model's replicas have taken lately: ``factor`` times the slowest of the last ``WINDOW``
answers, never under ``min_s`` (so a burst of fast answers does not make a normal one look stuck)
and never over ``max_s``. Predicts are idempotent, so a request past its first deadline is sent
again elsewhere; that retry (and any later one) waits up to ``max_s``, so a request that is really
slow still gets its answer.
"""
from __future__ import annotations

from dataclasses import dataclass

WINDOW = 256


@dataclass(frozen=True)
class DeadlinePolicy:
    min_s: float = 1.0  # --upstream-deadline-min-seconds
    factor: float = 10.0  # --upstream-deadline-factor
    max_s: float = 120.0  # --upstream-timeout-seconds: any one attempt, and every retry


class LatencyWindow:
    """The last ``WINDOW`` answer times of one deployed model, and the deadline they give."""

    def __init__(self, policy: DeadlinePolicy) -> None:
        self.policy = policy
        self._ring = [0.0] * WINDOW
        self._n = 0
        self._slowest = 0.0
        self._deadline = policy.max_s  # nothing seen yet: no basis to cut a request short

    def observe(self, seconds: float) -> None:
        i = self._n % WINDOW
        old = self._ring[i]
        self._ring[i] = seconds
        self._n += 1
        if seconds >= self._slowest:
            self._slowest = seconds
        elif old >= self._slowest:  # the slowest left the window: find the next (rare, O(WINDOW))
            self._slowest = max(self._ring[:min(self._n, WINDOW)])
        p = self.policy
        self._deadline = min(p.max_s, max(p.min_s, p.factor * self._slowest))

    def first_attempt_s(self) -> float:
        """The deadline of a request's first attempt."""
        return self._deadline
