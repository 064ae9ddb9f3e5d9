"""The autoscaler's policy against scripted in-flight samples on a scripted clock (the supervisor
samples every 0.25 s): a steady overload whose samples dip scales up after ``up_seconds``, a short
spike does not, and each step back towards the minimum waits for a cool-down."""
from __future__ import annotations

from dataclasses import dataclass

from modelyard.platform.dataplane.autoscale import Autoscaler, Policy

TICK = 0.25


@dataclass
class FakeDeployed:
    """What the autoscaler reads of a deployed model: id, bounds, live replicas, requests in flight."""
    id: str = "dm"
    min_replicas: int = 1
    max_replicas: int = 3
    flight: int = 0

    def live(self) -> list:
        return [object()] * self.min_replicas

    def in_flight(self) -> int:
        return self.flight


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(scaler: Autoscaler, clock: Clock, d: FakeDeployed, samples: list[int]) -> list[int]:
    """Feed one sample per tick; the replica counts the autoscaler asked for after each."""
    out = []
    for s in samples:
        d.flight = s
        out.append(scaler.desired(d))
        clock.now += TICK
    return out


def test_steady_overload_with_dips_scales_up_after_the_window():
    clock, d = Clock(), FakeDeployed()
    scaler = Autoscaler(Policy(target_in_flight=4, up_seconds=1, cooldown_seconds=5), clock)
    # Saturated, but every third sample sees a client between two requests (0 in flight).
    counts = run(scaler, clock, d, [8, 8, 0] * 4)
    assert counts[:4] == [1, 1, 1, 1]  # not before the window of 1 s is full
    assert counts[4] == 2 and counts[-1] == 2  # average 5.3 in flight: 2 replicas, and no flapping back


def test_short_spike_does_not_scale():
    clock, d = Clock(), FakeDeployed()
    scaler = Autoscaler(Policy(target_in_flight=4, up_seconds=3, cooldown_seconds=5), clock)
    assert set(run(scaler, clock, d, [0] * 4 + [40] + [0] * 16)) == {1}  # average over 3 s: 3.3 < 4


def test_scale_down_only_after_the_cooldown():
    clock, d = Clock(), FakeDeployed()
    scaler = Autoscaler(Policy(target_in_flight=4, up_seconds=1, cooldown_seconds=5), clock)
    assert run(scaler, clock, d, [20] * 8)[-1] == 3  # 20 in flight: 5 wanted, clamped to max 3
    counts = run(scaler, clock, d, [0] * 48)
    assert counts[:16] == [3] * 16  # the smoothed load falls below within a second; the cool-down is 5 s
    # Down one step per cool-down: the smoothed load still asked for 2 early in the first one.
    assert 2 in counts and counts.index(1) - counts.index(2) >= 5 / TICK
    assert counts[-1] == 1
    assert run(scaler, clock, d, [0] * 4) == [1] * 4
