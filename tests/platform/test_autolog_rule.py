"""The rule that gives a job a Python environment of its own (platform/jobs/job_python.py), one layer
below test_autolog_jobs.py: no process, no pip. A resolution here has the shape of pip's installation
report as ``job_python.resolve`` returns it."""
from __future__ import annotations

import json

import pytest

from modelyard.platform.jobs import job_packages, job_python

PLATFORM = {"protobuf": "7.36.2", "pandas": "3.1.1", "numpy": "2.4.6", "google-cloud-aiplatform": "2.7.0",
            "requests": "2.32.5"}
AUTOLOG = ["google-cloud-aiplatform[autologging]==2.7.0", "scikit-learn", "pandas"]
# What pip resolves for the SDK's autologging requirement on its own (pip 26, Python 3.11), cut down.
AUTOLOG_RESOLUTION = [
    {"name": "google-cloud-aiplatform", "version": "2.7.0", "extras": ["autologging"],
     "requires": ["protobuf<8.0.0,>=3.20.2", "pandas>=1.0; extra == \"full\"",
                  "mlflow<=2.16.0,>=1.27.0; python_version < \"3.13\" and extra == \"autologging\"",
                  "mlflow>=1.27.0; python_version >= \"3.13\" and extra == \"autologging\""]},
    {"name": "mlflow", "version": "2.16.0", "extras": [],
     "requires": ["mlflow-skinny==2.16.0", "pandas<3", "numpy<3", "pyarrow<18,>=4.0.0"]},
    {"name": "mlflow-skinny", "version": "2.16.0", "extras": [], "requires": ["protobuf<6,>=3.12.0", "requests<3,>=2.17.3"]},
    {"name": "protobuf", "version": "5.29.6", "extras": [], "requires": []},
    {"name": "pandas", "version": "2.3.3", "extras": [], "requires": ["numpy>=1.23.2; python_version == \"3.11\""]},
    {"name": "numpy", "version": "2.4.6", "extras": [], "requires": []},
    {"name": "pyarrow", "version": "17.0.0", "extras": [], "requires": []},
    {"name": "scikit-learn", "version": "1.9.1", "extras": [], "requires": ["numpy>=1.22"]},
    {"name": "requests", "version": "2.32.5", "extras": [], "requires": ["PySocks!=1.5.7,>=1.5.6; extra == \"socks\""]},
]


def test_requirements_that_need_another_version_of_a_platform_package_conflict():
    clash = job_python.conflicts(AUTOLOG_RESOLUTION, AUTOLOG, PLATFORM.get)
    assert clash == ["pandas 3.1.1 (mlflow 2.16.0 needs pandas<3)",
                     "protobuf 7.36.2 (mlflow-skinny 2.16.0 needs protobuf<6,>=3.12.0)"]


def test_requirements_that_install_beside_the_platform_do_not_conflict():
    # Missing packages (pyarrow, mlflow here) and newer resolved versions are no conflict: only a
    # platform package whose version does not meet what the resolution asks of it.
    assert job_python.conflicts(AUTOLOG_RESOLUTION, AUTOLOG, {**PLATFORM, "protobuf": "5.29.0", "pandas": "2.2"}.get) == []
    resolution = [{"name": "cloudml-hypertune", "version": "0.1.0.dev6", "extras": [], "requires": []},
                  {"name": "requests", "version": "2.33.0", "extras": [], "requires": ["urllib3<3,>=1.21.1"]}]
    assert job_python.conflicts(resolution, ["cloudml-hypertune", "requests"], {**PLATFORM, "urllib3": "2.5.0"}.get) == []
    # The job's own requirement counts too, and an extra's requirements only when that extra is asked for.
    assert job_python.conflicts([], ["numpy<2"], PLATFORM.get) == ["numpy 2.4.6 (the job needs numpy<2)"]
    extra = [{"name": "requests", "version": "2.32.5", "extras": [], "requires": ["PySocks<1; extra == \"socks\""]}]
    assert job_python.conflicts(extra, ["requests"], {**PLATFORM, "PySocks": "1.7.1"}.get) == []
    assert job_python.conflicts(extra, ["requests[socks]"], {**PLATFORM, "PySocks": "1.7.1"}.get) == [
        "PySocks 1.7.1 (requests 2.32.5 needs PySocks<1)"]


def test_an_extra_the_platform_lacks_is_unsatisfied():
    # The platform has the SDK (same version) and mlflow-skinny, not the autologging extra's MLflow.
    from importlib import metadata

    version = metadata.version("google-cloud-aiplatform")
    assert job_packages._unsatisfied([f"google-cloud-aiplatform=={version}"], "f") == []
    wanted = [f"google-cloud-aiplatform[autologging]=={version}"]
    assert job_packages._unsatisfied(wanted, "f") == wanted


def test_the_plan_asks_pip_nothing_when_satisfied_or_known(tmp_path, monkeypatch):
    def no_pip(*a, **k):
        raise AssertionError("pip was asked")

    monkeypatch.setattr(job_python, "resolve", no_pip)
    said: list[str] = []
    assert job_python.plan(["numpy"], lambda reqs: [], tmp_path, said.append) is None
    # A requirement set seen before: its resolution and verdict are kept per set, under the jobs' cache.
    kept = tmp_path / f"plan-{job_python.requirements_key(AUTOLOG)}.json"
    clash = job_python.conflicts(AUTOLOG_RESOLUTION, AUTOLOG, PLATFORM.get)
    kept.write_text(json.dumps([AUTOLOG_RESOLUTION, clash]))
    assert job_python.plan(AUTOLOG, lambda reqs: reqs, tmp_path, said.append) == AUTOLOG_RESOLUTION
    assert said == [f"[modelyard] the job's requirements conflict with the platform's packages ({'; '.join(clash)}): "
                    f"the job gets a Python environment of its own ({len(AUTOLOG_RESOLUTION)} packages)"]
    kept.write_text(json.dumps([AUTOLOG_RESOLUTION, []]))
    assert job_python.plan(AUTOLOG, lambda reqs: reqs, tmp_path, said.append) is None


def test_an_unresolvable_set_fails_the_job_with_pips_words(tmp_path, monkeypatch):
    from modelyard.platform.jobs.job_runner import JobFailed

    def unresolvable(reqs, *a, **k):
        raise job_python.ResolveError("ERROR: ResolutionImpossible: for help visit ...")

    monkeypatch.setattr(job_python, "resolve", unresolvable)
    monkeypatch.setattr(job_python, "resolver", lambda cache: "python")
    with pytest.raises(JobFailed, match="ResolutionImpossible") as info:
        job_python.plan(AUTOLOG, lambda reqs: reqs, tmp_path)
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
