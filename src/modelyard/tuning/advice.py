"""What a stopped study tells its user: why its trials failed, what to fix, and the command to retry.

A study stops launching trials once ``max_failed_trial_count`` have failed, and a later run of the
same command finds them still failed, so the message names the cause (the last failed trial's
error and the line of its log that says most, e.g. ``ModuleNotFoundError``), a fix for the causes
we can recognise (a missing module: the pip command for the interpreter trials run with), and the
two ways on: ``--restart`` (the old study archived, a new one started), or a larger
``max_failed_trial_count`` to go on with the trials already done.
"""
from __future__ import annotations

import re
import shlex
import sys

from optuna.trial import FrozenTrial, TrialState

from modelyard.tuning.spec import Study

# Modules whose pip package has another name.
_PACKAGES = {"hypertune": "cloudml-hypertune", "sklearn": "scikit-learn", "yaml": "pyyaml", "cv2": "opencv-python",
             "PIL": "pillow", "google.cloud.aiplatform": "google-cloud-aiplatform"}
_MISSING = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")


def _cause(log_tail: str) -> str | None:
    """The log line that says what went wrong: the exception's own line, if the tail holds one."""
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b.*", line) or line.startswith("error:"):
            return line
    return lines[-1] if lines else None


def _fix(log_tail: str) -> str | None:
    missing = _MISSING.search(log_tail)
    if not missing:
        return None
    module = missing.group(1)
    package = _PACKAGES.get(module, _PACKAGES.get(module.split(".")[0], module.split(".")[0]))
    extra = " (or pip install -e '.[vertex]' in a modelyard clone)" if package == "cloudml-hypertune" else ""
    return (f"the trials' Python ({sys.executable}) has no module {module!r}: install it with "
            f"`{shlex.quote(sys.executable)} -m pip install {package}`{extra}")


def stopped_study(study: Study, trials: list[FrozenTrial], failed: int) -> str:
    """The error printed when a study stopped on failed trials: cause, fix, and how to retry."""
    failures = [t for t in trials if t.state == TrialState.FAIL and "error" in t.user_attrs]
    command = f"modelyard tune {shlex.quote(str(study.path))}"
    parts = [f"{failed} trial(s) failed (max_failed_trial_count {study.max_failed}), so the study stopped "
             f"launching trials."]
    if failures:
        last = max(failures, key=lambda t: t.number)
        tail = str(last.user_attrs.get("log_tail") or "")
        cause = _cause(tail)
        where = last.user_attrs.get("job_dir")
        parts.append(f"Trial {last.number + 1} failed: {last.user_attrs['error']}"
                     + (f": {cause}" if cause else "") + (f" (log: {where}/trial.log)" if where else "") + ".")
        fix = _fix(tail)
        if fix:
            parts.append(f"Fix: {fix}.")
    parts.append(f"Once the cause is fixed, `{command} --restart` archives this study (database and trial "
                 f"directories, renamed with the time) and starts it over; or raise max_failed_trial_count in "
                 f"{study.path.name} and run `{command}` to go on with the trials done so far. "
                 f"`modelyard tune status {shlex.quote(str(study.path))}` shows every trial's log tail.")
    return " ".join(parts)
