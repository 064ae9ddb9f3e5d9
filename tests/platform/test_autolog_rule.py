"""The rule that gives a job a Python environment of its own (platform/jobs/job_python.py), one layer
below test_autolog_jobs.py: no process, no resolver run (a stand-in answers as uv does)."""
from __future__ import annotations

import pytest

from modelyard.platform.jobs import job_packages, job_python

PLATFORM = {"protobuf": "7.36.2", "pandas": "3.1.1", "numpy": "2.4.6", "google-cloud-aiplatform": "2.7.0",
            "modelyard": "0.1.0"}
AUTOLOG = ["google-cloud-aiplatform[autologging]==2.7.0", "pandas", "scikit-learn"]
# What the SDK's autologging requirement resolves to on its own (uv, Python 3.11), cut down.
AUTOLOG_RESOLUTION = [{"name": "google-cloud-aiplatform", "version": "2.7.0"}, {"name": "mlflow", "version": "2.16.0"},
                      {"name": "protobuf", "version": "5.29.6"}, {"name": "pandas", "version": "2.3.3"},
                      {"name": "numpy", "version": "2.4.6"}, {"name": "scikit-learn", "version": "1.9.1"}]
NO_SOLUTION = "  And because you require google-cloud-aiplatform[autologging]==2.7.0, your requirements are unsatisfiable."


def _resolver(calls: list, beside: bool):
    """A stand-in for uv: no resolution with the platform's packages pinned unless ``beside``."""
    def resolve(requirements, uv, constraints=(), timeout=None):
        calls.append((list(requirements), list(constraints)))
        if constraints and not beside:
            raise job_python.ResolveError(NO_SOLUTION)
        return AUTOLOG_RESOLUTION
    return resolve


def test_requirements_with_no_resolution_beside_the_platform_get_their_own(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(job_python, "resolve", _resolver(calls, beside=False))
    monkeypatch.setattr(job_python, "resolver", lambda cache: "uv")
    said: list[str] = []
    got = job_python.plan(AUTOLOG, lambda reqs: reqs, tmp_path, said.append, lambda: PLATFORM)
    assert got == AUTOLOG_RESOLUTION
    # First with every platform package held at its version (modelyard, on no index, left out), then alone.
    assert calls == [(AUTOLOG, ["google-cloud-aiplatform==2.7.0", "numpy==2.4.6", "pandas==3.1.1",
                                "protobuf==7.36.2"]), (AUTOLOG, [])]
    assert said == ["[modelyard] the job's requirements cannot install beside the platform's packages (protobuf 7.36.2 "
                    "-> 5.29.6; pandas 3.1.1 -> 2.3.3): the job gets a Python environment of its own (6 packages)"]
    # Kept per requirement set: the next job asks the resolver nothing.
    calls.clear()
    assert job_python.plan(AUTOLOG, lambda reqs: reqs, tmp_path, said.append, lambda: PLATFORM) == AUTOLOG_RESOLUTION
    assert calls == [] and said[-1] == said[0]


def test_requirements_that_resolve_beside_the_platform_use_its_environment(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(job_python, "resolve", _resolver(calls, beside=True))
    monkeypatch.setattr(job_python, "resolver", lambda cache: "uv")
    assert job_python.plan(["cloudml-hypertune"], lambda reqs: reqs, tmp_path, print, lambda: PLATFORM) is None
    assert len(calls) == 1 and calls[0][1]  # asked once, with the platform pinned
    # Requirements the platform meets already: nothing is asked at all.
    assert job_python.plan(["numpy"], lambda reqs: [], tmp_path / "other", print, lambda: PLATFORM) is None
    assert len(calls) == 1


def test_the_conflict_is_said_by_the_packages_held_below_the_platforms_versions():
    assert job_python.older_than_platform(AUTOLOG_RESOLUTION, PLATFORM) == ["protobuf 7.36.2 -> 5.29.6",
                                                                           "pandas 3.1.1 -> 2.3.3"]
    newer = [{"name": "numpy", "version": "2.5.0"}, {"name": "pyarrow", "version": "17.0.0"}]
    assert job_python.older_than_platform(newer, PLATFORM) == []  # newer or missing: not what conflicts


def test_an_extra_the_platform_lacks_is_unsatisfied():
    # The platform has the SDK (same version) and mlflow-skinny, not the autologging extra's MLflow.
    from importlib import metadata

    version = metadata.version("google-cloud-aiplatform")
    assert job_packages._unsatisfied([f"google-cloud-aiplatform=={version}"], "f") == []
    wanted = [f"google-cloud-aiplatform[autologging]=={version}"]
    assert job_packages._unsatisfied(wanted, "f") == wanted


def test_an_unresolvable_set_fails_the_job_with_the_resolvers_words(tmp_path, monkeypatch):
    from modelyard.platform.jobs.job_runner import JobFailed

    def unresolvable(reqs, *a, **k):
        raise job_python.ResolveError("  Because modelyard-no-such-xq was not found in the package registry ...")

    monkeypatch.setattr(job_python, "resolve", unresolvable)
    monkeypatch.setattr(job_python, "resolver", lambda cache: "uv")
    with pytest.raises(JobFailed, match="modelyard-no-such-xq was not found") as info:
        job_python.plan(["modelyard-no-such-xq"], lambda reqs: reqs, tmp_path, print, lambda: PLATFORM)
    assert info.value.status == "INVALID_ARGUMENT"


def test_an_own_environment_hides_the_platforms_path(tmp_path):
    env = job_python.OwnPythonEnv(tmp_path / "job", AUTOLOG_RESOLUTION).env()
    assert env["PYTHONPATH"] == "" and env["VIRTUAL_ENV"] == str(tmp_path / "job" / "venv")
    assert env["PATH"].startswith(str(tmp_path / "job" / "venv" / "bin"))


def test_pip_reaches_the_index_without_the_jobs_storage_gateway(monkeypatch):
    from modelyard import tf_gcs

    monkeypatch.setenv(tf_gcs.ROUTED_ENV, "https://127.0.0.1:4443")
    monkeypatch.setenv("HTTPS_PROXY", "https://127.0.0.1:4443")
    monkeypatch.setenv("CURL_CA_BUNDLE", "/state/identity/ca.pem")
    monkeypatch.setenv("PYTHONPATH", "/platform/src")
    env = job_python.pip_env()
    assert "HTTPS_PROXY" not in env and "CURL_CA_BUNDLE" not in env and "PYTHONPATH" not in env
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")  # the user's own proxy stays
    assert job_python.pip_env()["HTTPS_PROXY"] == "http://proxy.example:3128"
