"""Function trials (``trial: {function: FILE:NAME}``) in warm workers: the optimum found by few
worker processes (counted from inside the trials), each kind of misbehaving trial costs only its
worker, and kill -9 of the study then resume runs no trial twice. The objectives are plain Python
(tests/tuning/trials/objectives.py), so the workers start in a fraction of a second."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from modelyard.tuning import spec
from modelyard.tuning.spec import SpecError
from modelyard.tuning.study import retried_numbers
from tests.tuning.conftest import TRIALS, kill_group, run, start, trials, write_study

OBJECTIVES = TRIALS / "objectives.py"
XY = [{"parameter_id": "x", "double_value_spec": {"min_value": -1, "max_value": 1}},
      {"parameter_id": "y", "double_value_spec": {"min_value": -1, "max_value": 1}}]


def _function_study(tmp_path: Path, name: str, function: str, parameters: list, log: Path, **top) -> Path:
    trial = {"function": f"{OBJECTIVES}:{function}", "env": {"OBJECTIVE_LOG": str(log), **top.pop("env", {})}}
    trial.update(top.pop("trial", {}))
    path = write_study(tmp_path, name, parameters, "unused.py", **top)
    import yaml

    body = yaml.safe_load(path.read_text())
    body["trial"] = trial
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_function_trials_find_the_optimum_in_warm_workers(tmp_path: Path):
    log = tmp_path / "objective.jsonl"
    study = _function_study(tmp_path, "warm", "quadratic", XY, log, max_trial_count=16, parallel_trial_count=2, seed=0)
    result = run(["tune", str(study), "--devices", "cpu:0,1"], timeout=300)
    assert result.returncode == 0, result.stdout
    done = trials(study)
    assert len(done) == 16 and all(t.state == TrialState.COMPLETE for t in done)
    best = max(done, key=lambda t: t.value)
    # The optimum is 1 at (0.3, -0.2); TPE gets within 0.3 of it in 16 trials.
    assert best.value > 0.9, best.params
    assert abs(best.params["x"] - 0.3) < 0.3 and abs(best.params["y"] + 0.2) < 0.3
    # The returned value is the trial's value; the reports are its curve.
    assert best.intermediate_values[5] == pytest.approx(best.value * (1 - 0.5 ** 5))
    events = _log(log)
    pids = {e["pid"] for e in events}
    replaced = sum("note" in t.user_attrs for t in done)
    assert replaced == 0 and len(pids) <= 2, pids  # parallel_trial_count + replacements
    for pid in pids:  # each worker imported the module once and ran trial after trial
        starts = [e for e in events if e["pid"] == pid and e["event"] == "start"]
        assert len(starts) >= 2 and len({e["loaded"] for e in starts}) == 1
    assert {t.user_attrs["worker_pid"] for t in done} == pids
    # Placement as for process trials: one core each.
    assert {t.user_attrs["device"] for t in done} == {"cpu 0", "cpu 1"}


def test_each_worker_imports_inside_its_slot(tmp_path: Path):
    """Two workers on two cores: each one's module import (where TensorFlow would make its thread
    pools) already sees its own core and one-core thread counts, not the whole machine."""
    log = tmp_path / "objective.jsonl"
    study = _function_study(tmp_path, "placed", "placement", XY[:1], log, max_trial_count=6, parallel_trial_count=2,
                            study_spec={"algorithm": "RANDOM_SEARCH"})
    result = run(["tune", str(study), "--devices", "cpu:0,1"], timeout=300)
    assert result.returncode == 0, result.stdout
    events = [e for e in _log(log) if e["event"] == "placement"]
    assert len(events) == 6 and len({e["pid"] for e in events}) == 2, events  # no spare was needed
    device = {t.user_attrs["trial_id"]: t.user_attrs["device"] for t in trials(study)}
    for e in events:
        core = int(device[e["trial"]].split()[1])
        assert e["at_import"] == {"affinity": [core], "intra": "1", "inter": "1", "omp": "1", "cuda": ""}, e
        assert e["affinity"] == [core] and e["intra"] == "1" and e["trial_cpus"] == str(core), e
        # What the import left is frozen: a full collection between trials skips it.
        assert e["frozen"] > 1000, e


def test_misbehaving_trials_cost_only_their_worker(tmp_path: Path):
    modes = ["fine", "raise", "exit", "hang", "ignore", "memory", "again"]
    log = tmp_path / "objective.jsonl"
    study = _function_study(
        tmp_path, "rough", "misbehave", [{"parameter_id": "mode", "categorical_value_spec": {"values": modes}}], log,
        study_spec={"algorithm": "GRID_SEARCH", "median_automated_stopping_spec": {"min_completed_trials": 1}},
        max_trial_count=7, parallel_trial_count=1, max_failed_trial_count=10,
        trial={"timeout_seconds": 4, "memory_limit_mb": 300},
    )
    result = run(["tune", str(study), "--grace", "1", "--devices", "cpu:0"], timeout=300)
    assert result.returncode == 0, result.stdout
    by_mode = {t.user_attrs["params"]["mode"]: t for t in trials(study)}
    assert by_mode["fine"].state == TrialState.COMPLETE and by_mode["again"].state == TrialState.COMPLETE
    errors = {m: by_mode[m].user_attrs.get("error", "") for m in modes}
    assert by_mode["raise"].state == TrialState.FAIL
    assert errors["raise"] == "raised ValueError: bad batch shape; its worker was replaced"
    assert "ValueError: bad batch shape" in by_mode["raise"].user_attrs["log_tail"]  # the traceback
    assert by_mode["exit"].state == TrialState.FAIL
    assert errors["exit"] == "the worker process ended during the trial (exit code 7); it was replaced"
    assert by_mode["hang"].state == TrialState.FAIL
    assert errors["hang"] == "stopped after timeout_seconds 4: it hung past timeout_seconds; its worker was replaced"
    assert by_mode["memory"].state == TrialState.FAIL and "passed memory_limit_mb 300" in errors["memory"]
    ignore = by_mode["ignore"]
    assert ignore.state == TrialState.PRUNED and ignore.user_attrs["pruned_at_step"] == 1
    assert ignore.user_attrs["note"] == "kept running 1 s after TrialPruned; its worker was replaced"
    assert "PRUNED  (kept running 1 s after TrialPruned" in result.stdout
    # Every one of the five took its worker down; each next trial ran on a fresh (spare) worker.
    events = _log(log)
    pid_of = {e["mode"]: e["pid"] for e in events if e["event"] == "start"}
    assert len(set(pid_of.values())) == len(modes) - 1  # 1 worker + 5 replacements
    assert pid_of["fine"] == pid_of["raise"]
    for gone in ("raise", "exit", "hang", "ignore", "memory"):
        assert not os.path.exists(f"/proc/{pid_of[gone]}") or _zombie(pid_of[gone])
    mode_of = {e["trial"]: e["mode"] for e in events if e["event"] == "start"}
    assert [mode_of[e["trial"]] for e in events if e["event"] == "end"] == ["fine", "again"]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_kill_9_mid_study_then_resume_runs_no_trial_twice(tmp_path: Path):
    log = tmp_path / "objective.jsonl"
    study = _function_study(tmp_path, "again", "quadratic", XY, log, max_trial_count=8, parallel_trial_count=2,
                            study_spec={"algorithm": "RANDOM_SEARCH"}, env={"STEP_SECONDS": "0.2"})
    tuner = start(["tune", str(study), "--devices", "cpu:0,1"])
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            time.sleep(0.3)
            try:
                now = trials(study)
            except SpecError:
                continue
            if sum(t.state == TrialState.COMPLETE for t in now) >= 2 and any(
                    t.state == TrialState.RUNNING and "worker_pid" in t.user_attrs for t in now):
                break
        else:
            raise AssertionError("the study never had 2 finished trials and one running")
        os.kill(tuner.pid, signal.SIGKILL)
        tuner.wait()
    finally:
        kill_group(tuner)
    before = trials(study)
    finished = {t.number: t.value for t in before if t.state == TrialState.COMPLETE}
    interrupted = [t.number for t in before if t.state == TrialState.RUNNING]
    assert interrupted
    workers = {e["pid"] for e in _log(log)}
    deadline = time.time() + 10  # the workers die with their tuner (parent-death signal)
    while any(os.path.exists(f"/proc/{pid}") and not _zombie(pid) for pid in workers) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(os.path.exists(f"/proc/{pid}") and not _zombie(pid) for pid in workers)

    result = run(["tune", str(study), "--devices", "cpu:0,1"], timeout=300)
    assert result.returncode == 0, result.stdout
    after = trials(study)
    retried = retried_numbers(after)
    real = [t for t in after if t.number not in retried]
    assert len(real) == 8 and all(t.state == TrialState.COMPLETE for t in real)
    for number, value in finished.items():
        assert after[number].value == value
    # None ran twice: every counted trial started and ended once (by the objective's own log),
    # an interrupted one started once and never ended.
    events = _log(log)
    for t in real:
        mine = [e["event"] for e in events if e["trial"] == str(t.number + 1)]
        assert mine == ["start", "end"], (t.number, mine)
    for number in interrupted:
        assert [e["event"] for e in events if e["trial"] == str(number + 1)] in (["start"], [])


@pytest.mark.parametrize("trial, message", [
    ({"function": "train.py"}, "give FILE.py:NAME or module:NAME"),
    ({"function": "missing.py:objective"}, "trial.function: missing.py not found"),
    ({"function": "train.py:1bad"}, "'1bad' is not a Python name"),
    ({"function": "train.py:objective", "command": "python3 train.py"}, "give command or function, not both"),
    ({"function": "train.py:objective", "params_as": "flags"}, "trial.params_as: applies to command trials"),
    ({"function": "train.py:objective", "memory_limit_mb": -1}, "memory_limit_mb: must be > 0"),
    ({"command": "python3 train.py", "memory_limit_mb": 100}, "applies to function trials"),
])
def test_function_trial_spec_errors(tmp_path: Path, trial: dict, message: str):
    (tmp_path / "train.py").write_text("def objective(params, report):\n    return 1.0\n")
    raw = {"study_spec": {"metrics": [{"metric_id": "score", "goal": "MAXIMIZE"}], "parameters": XY}, "trial": trial}
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        spec.from_mapping(raw, tmp_path / "s.yaml")


def test_function_trial_spec_reads(tmp_path: Path):
    (tmp_path / "train.py").write_text("def objective(params, report):\n    return 1.0\n")
    raw = {"study_spec": {"metrics": [{"metric_id": "score", "goal": "MAXIMIZE"}], "parameters": XY},
           "trial": {"function": "train.py:objective", "timeout_seconds": 30, "memory_limit_mb": 2000}}
    study = spec.from_mapping(raw, tmp_path / "s.yaml")
    assert (study.function, study.command, study.timeout, study.memory_limit_mb) == (
        "train.py:objective", [], 30.0, 2000.0)


def test_tuning_page_function_trials_run_as_written(tmp_path: Path):
    """docs/tuning.md's function-trial blocks as written: objective.py (a small Keras model of the digits,
    TensorFlow in the workers), function_study.yaml, `modelyard tune` on it, then tune_digits.py
    (modelyard.tune from Python) taking the same study on to 6 trials."""
    from tests.doc_blocks import blocks, sh, shell_env

    page = blocks((Path(__file__).resolve().parents[2] / "docs" / "tuning.md").read_text())
    first = {b.body.splitlines()[0]: b for b in page if b.body}
    for name in ("objective.py", "function_study.yaml", "tune_digits.py"):
        (tmp_path / name).write_text(first[f"# {name}"].body)
    env = shell_env(tmp_path)
    out = sh(first["modelyard tune function_study.yaml"].body, tmp_path, env, timeout=600).stdout
    assert "4 trial(s), 2 at a time" in out, out
    best_line = [line for line in out.splitlines() if line.startswith("best: trial")]
    assert best_line and float(best_line[0].split("accuracy = ")[1].split()[0]) > 0.5, out  # it learnt
    study = tmp_path / "function_study.yaml"
    done = trials(study)
    assert len(done) == 4 and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in done)
    assert len({t.user_attrs["worker_pid"] for t in done}) <= 2  # two warm workers ran the four trials
    out = sh(first["python3 tune_digits.py"].body, tmp_path, env, timeout=600).stdout
    assert "best accuracy 0." in out, out
    assert len(trials(study)) == 6


def test_warm_command_trials_match_cold_ones(tmp_path: Path):
    """The same seeded study of a TensorFlow script, forked from the warm server and started cold:
    the same parameters, the same per-epoch losses; only the warm trials found TensorFlow (and the
    script's other top-level imports, preloaded by the server) imported."""
    import yaml

    runs = {}
    for warm in (True, False):
        folder = tmp_path / ("warm" if warm else "cold")
        folder.mkdir()
        study = write_study(folder, "seeded", [
            {"parameter_id": "learning_rate", "double_value_spec": {"min_value": 0.001, "max_value": 0.1},
             "scale_type": "UNIT_LOG_SCALE"},
            {"parameter_id": "units", "integer_value_spec": {"min_value": 2, "max_value": 16}}],
            "tf_seeded.py", metric="val_loss", goal="MINIMIZE", study_spec={"algorithm": "RANDOM_SEARCH"},
            max_trial_count=2, parallel_trial_count=2, seed=3, trial={"warm_start": warm})
        assert yaml.safe_load(study.read_text())["trial"]["warm_start"] is warm
        result = run(["tune", str(study), "--devices", "cpu:0,1"], timeout=600)
        assert result.returncode == 0, result.stdout
        done = trials(study)
        starts = [json.loads((Path(t.user_attrs["job_dir"]) / "start.json").read_text()) for t in done]
        assert all(s["warm"] is warm and s["hypertune_imported"] is warm for s in starts), starts
        if warm:  # every trial was forked by the one server (its parent), each a process of its own
            assert len({s["ppid"] for s in starts}) == 1 and len({s["pid"] for s in starts}) == 2
            assert starts[0]["argv"][0] == str(TRIALS / "tf_seeded.py")
        runs[warm] = [(t.params, t.intermediate_values, t.value) for t in sorted(done, key=lambda t: t.number)]
    assert all(t.state == TrialState.COMPLETE for t in done)
    assert runs[True] == runs[False]
