"""`modelyard tune` as a new user meets it: the trial count and parallelism from the command line,
a study that failed says what to fix and how to retry, and `--restart` archives the old study and
starts over (issue 27, point 2)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from optuna.trial import TrialState

from tests.tuning.conftest import run, trials, write_study

X = {"parameter_id": "x", "double_value_spec": {"min_value": 0, "max_value": 1}}
UNITS = {"parameter_id": "units", "discrete_value_spec": {"values": [32, 64]}}

# A Vertex-style trial that needs a module this machine does not have (as `hypertune` was missing).
NEEDS_A_MODULE = """import argparse
import no_such_module_for_tuning
"""
FIXED = """import argparse, hypertune
parser = argparse.ArgumentParser()
parser.add_argument("--x", type=float)
args = parser.parse_args()
hypertune.HyperTune().report_hyperparameter_tuning_metric(
    hyperparameter_metric_tag="score", metric_value=1 - (args.x - 0.3) ** 2, global_step=1)
"""


def test_max_trials_and_parallel_flags_override_the_file(tmp_path: Path):
    study = write_study(tmp_path, "budget", [X, UNITS], "hypertune_quadratic.py", max_trial_count=20,
                        parallel_trial_count=1, trial={"command": [sys.executable, str(Path(__file__).parent / "trials"
                                                                                       / "hypertune_quadratic.py"),
                                                                  "--epochs=1"]})
    result = run(["tune", str(study), "--max-trials", "3", "--parallel", "2", "--devices", "none"])
    assert result.returncode == 0, result.stdout
    assert "3 trial(s), 2 at a time" in result.stdout, result.stdout
    assert [t.state for t in trials(study)] == [TrialState.COMPLETE] * 3
    bad = run(["tune", str(study), "--max-trials", "0"])
    assert bad.returncode == 2 and "--max-trials 0: must be at least 1" in bad.stdout, bad.stdout


def test_a_failed_study_says_what_to_fix_and_restart_starts_it_over(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(NEEDS_A_MODULE)
    study = write_study(tmp_path, "first-day", [X], [sys.executable, "train.py"], max_trial_count=2,
                        max_failed_trial_count=1)
    first = run(["tune", str(study)], cwd=tmp_path)
    assert first.returncode == 2, first.stdout
    error = first.stdout[first.stdout.index("modelyard tune: error:"):]
    # The cause, from the trial's log, a fix for it, and the command that starts over.
    assert "ModuleNotFoundError: No module named 'no_such_module_for_tuning'" in error, error
    assert f"{sys.executable} -m pip install no_such_module_for_tuning" in error, error
    assert f"modelyard tune {study} --restart" in error, error
    assert str(tmp_path / "runs" / "first-day" / "trial-0001" / "trial.log") in error, error

    # Fixed, the same command alone only shows the old failure again (the study is stopped) ...
    script.write_text(FIXED)
    again = run(["tune", str(study)], cwd=tmp_path)
    assert again.returncode == 2 and "--restart" in again.stdout, again.stdout
    # ... and --restart puts it aside, says where, and runs a new study.
    restarted = run(["tune", str(study), "--restart"], cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stdout
    archived_db = re.search(r"archived the old study's database to (\S+)", restarted.stdout).group(1)
    archived_runs = re.search(r"archived the old study's trial directories to (\S+)", restarted.stdout).group(1)
    assert Path(archived_db).is_file() and Path(archived_db).parent == tmp_path
    assert re.fullmatch(r"first-day\.tuning-\d{8}T\d{6}\.db", Path(archived_db).name), archived_db
    assert (Path(archived_runs) / "trial-0001" / "trial.log").is_file()
    assert [t.state for t in trials(study)] == [TrialState.COMPLETE] * 2
    assert (tmp_path / "runs" / "first-day" / "trial-0002").is_dir()


def test_hypertune_missing_names_the_package_to_install():
    from modelyard.tuning.advice import _fix

    fix = _fix("Traceback ...\nModuleNotFoundError: No module named 'hypertune'\n")
    assert "pip install cloudml-hypertune" in fix and "'.[vertex]'" in fix


def test_usage_reads_like_the_docs():
    """One study file, optionally after `status` (it read `[status] STUDY [[status] STUDY ...]`)."""
    from modelyard.cli import build_parser

    parser = build_parser(("modelyard.tuning.cli",))
    tune = parser._subparsers._group_actions[0].choices["tune"]
    usage = tune.format_usage()
    assert "[[status]" not in usage and "modelyard tune STUDY" in usage and "modelyard tune status STUDY" in usage
    args = parser.parse_args(["tune", "status", "s.yaml"])
    assert (args.status, args.study) == ("status", "s.yaml")
    args = parser.parse_args(["tune", "s.yaml", "--max-trials", "4"])
    assert (args.status, args.study, args.max_trials) == (None, "s.yaml", 4)


def test_restart_in_a_shared_database_keeps_the_old_study_under_a_new_name(tmp_path: Path, postgres_url: str):
    import optuna

    study = write_study(tmp_path, "shared-restart", [X, UNITS], "hypertune_quadratic.py", max_trial_count=1,
                        storage=postgres_url)
    assert run(["tune", str(study), "--devices", "none"]).returncode == 0
    restarted = run(["tune", str(study), "--restart", "--devices", "none"])
    assert restarted.returncode == 0, restarted.stdout
    archived = re.search(r"archived the old study's trials to (shared-restart-archived-\d{8}T\d{6}) in ",
                         restarted.stdout)
    assert archived, restarted.stdout
    from modelyard.tuning.study import open_storage

    storage = open_storage(postgres_url)
    names = {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    assert names[archived.group(1)] == 1 and names["shared-restart"] == 1
