"""Parallel trials on disjoint cores (checked from inside the trials), early stopping that
kills promptly, and failing trials recorded with their errors."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from optuna.trial import TrialState

from tests.tuning.conftest import TRIALS, run, trials, write_study


def test_parallel_trials_run_on_disjoint_cores(tmp_path: Path):
    study = write_study(tmp_path, "par", [{"parameter_id": "x", "discrete_value_spec": {"values": [1, 2, 3, 4]}}],
                        "probe.py", study_spec={"algorithm": "GRID_SEARCH"}, max_trial_count=4, parallel_trial_count=2)
    result = run(["tune", str(study), "--devices", "cpu:0,1"])
    assert result.returncode == 0, result.stdout
    probes = [json.loads((Path(t.user_attrs["job_dir"]) / "probe.json").read_text()) for t in trials(study)]
    assert len(probes) == 4
    for probe in probes:
        assert len(probe["affinity"]) == 1 and set(probe["seen"]) <= set(probe["affinity"]), probe
        assert (probe["intra"], probe["omp"], probe["cuda"]) == ("1", "1", ""), probe
    overlapping = [(a, b) for i, a in enumerate(probes) for b in probes[i + 1:]
                   if a["start"] < b["end"] and b["start"] < a["end"]]
    assert overlapping, "no two trials ran at the same time"
    for a, b in overlapping:
        assert not set(a["seen"]) & set(b["seen"]), (a, b)
        assert a["affinity"] != b["affinity"]


def test_median_stopping_kills_hopeless_trials_within_seconds(tmp_path: Path):
    # Grid order: two good trials complete first, then two bad ones meet the median rule at their
    # first measurements; one of them ignores SIGTERM and must be SIGKILLed after the grace.
    study = write_study(
        tmp_path, "prune", [{"parameter_id": "quality", "categorical_value_spec": {"values": ["0.9", "0.8", "0.1", "0.2"]}}],
        [sys.executable, str(TRIALS / "slow_curve.py"), "--epochs=40", "--epoch-seconds=0.08"], study_spec={"algorithm": "GRID_SEARCH",
                                     "median_automated_stopping_spec": {"min_completed_trials": 2}},
        max_trial_count=4, parallel_trial_count=2, trial={"env": {"IGNORE_TERM_AT_OR_BELOW": "0.1"}},
    )
    result = run(["tune", str(study), "--grace", "1"])
    assert result.returncode == 0, result.stdout
    by_quality = {t.user_attrs["params"]["quality"]: t for t in trials(study)}
    assert [by_quality[q].state for q in ("0.9", "0.8")] == [TrialState.COMPLETE] * 2
    for q in ("0.1", "0.2"):
        t = by_quality[q]
        assert t.state == TrialState.PRUNED, result.stdout
        epochs = (Path(t.user_attrs["job_dir"]) / "epochs.log").read_text().split("\n")
        last_epoch_at = float([line for line in epochs if line][-1].split()[1])
        # Unpruned, the trial would run 40 epochs (3.2 s or more); it stopped soon after the decision,
        # the SIGTERM-ignoring one after the grace.
        assert int([line for line in epochs if line][-1].split()[0]) < 40
        # SIGTERM stops the 0.2 trial at once; the 0.1 trial ignores it and is SIGKILLed after the 1 s grace.
        limit = 2.0 if q == "0.2" else 1.0 + 2.0
        assert t.user_attrs["exited_at"] - t.user_attrs["pruned_at"] < limit, t.user_attrs
        assert last_epoch_at - t.user_attrs["pruned_at"] < limit


def test_failed_trials_are_recorded_with_their_reason_and_stop_the_study_at_the_limit(tmp_path: Path):
    quiet = write_study(tmp_path, "quiet", [{"parameter_id": "x", "double_value_spec": {"min_value": 0, "max_value": 1}}],
                        "reports_loss_only.py", max_trial_count=4, max_failed_trial_count=2,
                        trial={"params_as": "env"})
    result = run(["tune", str(quiet)])
    assert result.returncode == 2 and "2 trial(s) failed (max_failed_trial_count 2)" in result.stdout, result.stdout
    failed = [t for t in trials(quiet) if t.state == TrialState.FAIL]
    assert len(failed) == 2 and len(trials(quiet)) == 2
    assert "metric 'score' was never reported; the trial reported cloudml-hypertune: loss" in failed[0].user_attrs["error"]

    crash = write_study(tmp_path, "crash", [{"parameter_id": "x", "double_value_spec": {"min_value": 0, "max_value": 1}}],
                        "crash.py", max_trial_count=1, max_failed_trial_count=1)
    result = run(["tune", str(crash)])
    assert result.returncode == 2, result.stdout
    (t,) = trials(crash)
    assert t.state == TrialState.FAIL and t.user_attrs["error"] == "exit code 1"
    assert "trial crashed: data file missing" in t.user_attrs["log_tail"]
    assert "trial crashed: data file missing" in result.stdout  # the live view shows the tail too
    assert "trial 1 failed: exit code 1" in result.stdout  # under the final table


def test_epochs_read_in_one_poll_are_judged_step_by_step(tmp_path: Path):
    # The second trial's three epochs reach the tuner in one poll: 0.1 at step 1 is below the
    # completed trial's 0.9 (pruned there by the median rule), though its best by step 3 (0.95)
    # is above. Judged only on the poll's last step it would run its whole 60 s hold.
    study = write_study(
        tmp_path, "burst", [{"parameter_id": "curve", "categorical_value_spec": {"values": ["0.9,0.9,0.9", "0.1,0.95,0.95"]}}],
        [sys.executable, str(TRIALS / "burst_curve.py"), "--hold=60", "--hold-below=0.5"],
        study_spec={"algorithm": "GRID_SEARCH", "median_automated_stopping_spec": {"min_completed_trials": 1}},
        max_trial_count=2, parallel_trial_count=1,
    )
    result = run(["tune", str(study), "--grace", "1"], timeout=120)
    assert result.returncode == 0, result.stdout
    by_curve = {t.user_attrs["params"]["curve"]: t for t in trials(study)}
    assert by_curve["0.9,0.9,0.9"].state == TrialState.COMPLETE, result.stdout
    late = by_curve["0.1,0.95,0.95"]
    assert late.state == TrialState.PRUNED, result.stdout
    assert late.user_attrs["pruned_at_step"] == 1, late.user_attrs
    assert late.intermediate_values == {1: 0.1, 2: 0.95, 3: 0.95}
