"""The gateway's per-request upstream deadline (platform/dataplane/deadlines.py), one layer below the SIGSTOP
test of test_faults.py: derived from recent answer times, bounded both ways."""
from __future__ import annotations

from modelyard.platform.dataplane.deadlines import WINDOW, DeadlinePolicy, LatencyWindow


def test_the_deadline_follows_the_slowest_recent_answer_within_its_bounds():
    w = LatencyWindow(DeadlinePolicy(min_s=1.0, factor=10.0, max_s=120.0))
    assert w.first_attempt_s() == 120.0  # nothing seen: no basis to cut a request short
    for _ in range(50):
        w.observe(0.01)
    assert w.first_attempt_s() == 1.0  # fast answers: the floor
    w.observe(0.5)
    assert w.first_attempt_s() == 5.0  # 10x the slowest in the window
    w.observe(30.0)
    assert w.first_attempt_s() == 120.0  # never past the cap
    for _ in range(WINDOW):
        w.observe(0.2)
    assert w.first_attempt_s() == 2.0  # the slow ones left the window
