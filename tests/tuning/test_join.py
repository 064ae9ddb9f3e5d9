"""Two `modelyard tune --join` processes on one PostgreSQL server (started by the test) split
the trials of one study, which ends with exactly max_trial_count counted trials."""
from __future__ import annotations

import sys
from pathlib import Path

from optuna.trial import TrialState

from modelyard.tuning import spec
from modelyard.tuning.study import load_study, retried_numbers
from tests.tuning.conftest import TRIALS, kill_group, run, start, write_study


def _two_hosts_run(study: Path, postgres_url: str, timeout: float) -> list:
    """Two `tune --join` hosts (one core each) run ``study`` to its end; its counted trials, each
    COMPLETE, ``max_trial_count`` (8) of them, and both hosts ran some."""
    hosts = [start(["tune", str(study), "--join", "--storage", postgres_url, "--devices", f"cpu:{i}"]) for i in (0, 1)]
    try:
        outputs = [h.communicate(timeout=timeout)[0] for h in hosts]
    finally:
        for h in hosts:
            kill_group(h)
    assert [h.returncode for h in hosts] == [0, 0], outputs
    trials = load_study(spec.load(study, postgres_url), create=False).get_trials(deepcopy=False)
    skip = retried_numbers(trials)
    counted = [t for t in trials if t.number not in skip]
    assert len(counted) == 8 and all(t.state == TrialState.COMPLETE for t in counted)
    owners = {t.user_attrs["owner"].split(":")[1] for t in counted}
    assert owners == {str(h.pid) for h in hosts}, owners  # both hosts ran trials
    return counted


def test_two_hosts_split_one_study(tmp_path: Path, postgres_url: str):
    study = write_study(tmp_path, "shared", [{"parameter_id": "quality", "double_value_spec": {"min_value": 0.5, "max_value": 1.0}}],
                        [sys.executable, str(TRIALS / "slow_curve.py"), "--epochs=6", "--epoch-seconds=0.1"],
                        study_spec={"algorithm": "RANDOM_SEARCH"}, max_trial_count=8, parallel_trial_count=1)
    # SQLite is for one tuning process: --join without a shared database is refused up front.
    refused = run(["tune", str(study), "--join"])
    assert refused.returncode == 2 and "--join needs a database several hosts reach" in refused.stdout
    _two_hosts_run(study, postgres_url, timeout=120)
    assert not (tmp_path / "shared.tuning.db").exists()  # nothing went to the default SQLite


def test_two_hosts_split_one_study_of_function_trials(tmp_path: Path, postgres_url: str):
    """--join with function trials: each host runs its share in its own warm worker."""
    from tests.tuning.test_function_trials import XY, _function_study, _log

    log = tmp_path / "objective.jsonl"
    study = _function_study(tmp_path, "shared-functions", "quadratic", XY, log, max_trial_count=8,
                            parallel_trial_count=1, seed=0)
    counted = _two_hosts_run(study, postgres_url, timeout=180)
    # One warm worker per host ran all of that host's trials (the objective logs its process).
    workers = {t.user_attrs["worker_pid"] for t in counted}
    assert len(workers) == 2 and workers == {e["pid"] for e in _log(log) if e["event"] == "start"}
    assert all(t.intermediate_values for t in counted)  # report() reached the shared database
