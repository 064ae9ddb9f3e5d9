"""kill -9 of the tuning process mid-study, then the same command again: finished trials are
kept, the interrupted ones re-run with their parameters, and the study ends with max_trial_count."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from optuna.trial import TrialState

from modelyard.tuning.spec import SpecError
from modelyard.tuning.study import retried_numbers
from tests.tuning.conftest import kill_group, run, start, trials, write_study


def _group_alive(pgid: int) -> bool:
    """A live (not zombie) process is in the group."""
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(stat[2]) == pgid and stat[0] != "Z":
            return True
    return False


def test_kill_9_mid_study_then_resume(tmp_path: Path):
    study = write_study(tmp_path, "resume", [{"parameter_id": "quality", "double_value_spec": {"min_value": 0.5, "max_value": 1.0}}],
                        "slow_curve.py", study_spec={"algorithm": "RANDOM_SEARCH"},
                        max_trial_count=6, parallel_trial_count=2)
    # Each trial: 10 epochs of 0.15 s.
    text = study.read_text().replace("slow_curve.py", "slow_curve.py\n  - --epochs=10\n  - --epoch-seconds=0.15")
    study.write_text(text)
    tuner = start(["tune", str(study)])
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            time.sleep(0.3)
            try:
                now = trials(study)
            except SpecError:  # the tuner has not created the study yet
                continue
            done = [t for t in now if t.state == TrialState.COMPLETE]
            running = [t for t in now if t.state == TrialState.RUNNING and "pgid" in t.user_attrs]
            if len(done) >= 2 and running:
                break
        else:
            raise AssertionError("the study never had 2 finished trials and one running")
        os.kill(tuner.pid, signal.SIGKILL)
        tuner.wait()
    finally:
        kill_group(tuner)
    before = trials(study)
    finished = {t.number: t.values for t in before if t.state == TrialState.COMPLETE}
    interrupted = {t.number: t.params for t in before if t.state == TrialState.RUNNING}
    assert interrupted and len(finished) >= 2
    # The trials died with their tuner (parent-death signal), not left running.
    time.sleep(0.5)
    assert not any(_group_alive(t.user_attrs["pgid"]) for t in before if t.number in interrupted and "pgid" in t.user_attrs)

    result = run(["tune", str(study)])
    assert result.returncode == 0, result.stdout
    assert "study resumed: interrupted trial(s)" in result.stdout
    after = trials(study)
    retried = retried_numbers(after)
    assert set(interrupted) <= retried
    for number, values in finished.items():  # kept as they were
        assert after[number].state == TrialState.COMPLETE and after[number].values == values
    real = [t for t in after if t.number not in retried]
    assert len(real) == 6 and all(t.state == TrialState.COMPLETE for t in real), [(t.number, t.state) for t in after]
    for number, params in interrupted.items():
        reruns = [t for t in real if t.system_attrs.get("failed_trial") == number]
        assert len(reruns) == 1
        # A trial killed after drawing its parameters re-runs with them; one killed between
        # ask() and the draw had none to keep (the kill can land there) and draws afresh.
        assert reruns[0].params == params if params else set(reruns[0].params) == {"quality"}
    status = run(["tune", "status", str(study)])
    assert "6 complete, 0 pruned, 0 failed, 0 running of max_trial_count 6" in status.stdout, status.stdout
    assert "INTERRUPTED" in status.stdout
