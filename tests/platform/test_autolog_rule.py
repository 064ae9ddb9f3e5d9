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
# google-cloud-aiplatform 2.7.0's Requires-Dist, cut down: its own, its autologging extra's, another extra's.
SDK_REQUIRES = ['protobuf!=4.21.0,<7.0.0,>=3.20.2', 'mlflow<=2.16.0,>=1.27.0; python_version < "3.13" and extra == '
                '"autologging"', 'mlflow>=1.27.0; (python_version >= "3.13" and python_version < "3.15") and extra == '
                '"autologging"', 'pytest>=7; extra == "testing"']
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
    monkeypatch.setattr(job_python, "resolver", lambda: "uv")
    monkeypatch.setattr(job_python, "_requires", lambda name, version, uv: SDK_REQUIRES)
    said: list[str] = []
    got = job_python.plan(AUTOLOG, lambda reqs: reqs, tmp_path, said.append, lambda: PLATFORM)
    assert got == AUTOLOG_RESOLUTION
    # First alone (a fresh container's answer), then with every platform package held at its version
    # (modelyard, on no index, left out) and the packages the platform lacks at their fresh major version.
    # The fresh resolution asks again with the extra's requirement first (uv decides in that order, as pip would
    # in a fresh container: MLflow 2.16 over protobuf 7).
    assert calls == [(AUTOLOG, []), (["mlflow<=2.16.0,>=1.27.0", *AUTOLOG], []),
                     (AUTOLOG, ["google-cloud-aiplatform==2.7.0", "numpy==2.4.6", "pandas==3.1.1", "protobuf==7.36.2",
                                "mlflow>=2", "scikit-learn>=1"])]
    assert said == ["[modelyard] the job's requirements cannot install beside the platform's packages (protobuf 7.36.2 "
                    "-> 5.29.6; pandas 3.1.1 -> 2.3.3): the job gets a Python environment of its own (6 packages)"]
    # Kept per requirement set: the next job asks the resolver nothing.
    calls.clear()
    assert job_python.plan(AUTOLOG, lambda reqs: reqs, tmp_path, said.append, lambda: PLATFORM) == AUTOLOG_RESOLUTION
    assert calls == [] and said[-1] == said[0]


def test_requirements_that_resolve_beside_the_platform_use_its_environment(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(job_python, "resolve", _resolver(calls, beside=True))
    monkeypatch.setattr(job_python, "resolver", lambda: "uv")
    assert job_python.plan(["cloudml-hypertune"], lambda reqs: reqs, tmp_path, print, lambda: PLATFORM) is None
    assert len(calls) == 2 and not calls[0][1] and calls[1][1]  # alone, then with the platform pinned
    # Requirements the platform meets already: nothing is asked at all.
    assert job_python.plan(["numpy"], lambda reqs: [], tmp_path / "other", print, lambda: PLATFORM) is None
    assert len(calls) == 2


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
    monkeypatch.setattr(job_python, "resolver", lambda: "uv")
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


def test_the_extras_a_job_names_add_their_requirements(monkeypatch):
    monkeypatch.setattr(job_python, "_requires", lambda name, version, uv: SDK_REQUIRES)
    sdk = [{"name": "google-cloud-aiplatform", "version": "2.7.0"}]
    assert job_python.extra_requirements(AUTOLOG, sdk, "uv") == ["mlflow<=2.16.0,>=1.27.0"]  # this Python's marker
    assert job_python.extra_requirements(["google-cloud-aiplatform==2.7.0"], sdk, "uv") == []  # no extra named


def test_packages_the_platform_lacks_are_held_at_the_major_version_a_fresh_environment_gets():
    fresh = [{"name": "mlflow", "version": "2.16.0"}, {"name": "protobuf", "version": "5.29.6"},
             {"name": "uv", "version": "0.13.9"}, {"name": "graphql-core", "version": "0"}]
    assert job_python.fresh_floors(fresh, PLATFORM) == ["mlflow>=2", "uv>=0.13", "graphql-core>=0"]


def test_a_set_that_resolves_beside_the_platform_only_with_an_older_major_conflicts(tmp_path, monkeypatch):
    # As uv answers the SDK's autologging set: beside protobuf 7 it settles on MLflow 1.27 (no protobuf cap,
    # but protos protobuf >= 4 refuses at import); a fresh environment gets MLflow 2.16.
    def resolve(requirements, uv, constraints=(), timeout=None):
        if not constraints and requirements[0].startswith("mlflow"):  # the extra's packages decided first
            return AUTOLOG_RESOLUTION
        walked_back = [{"name": "google-cloud-aiplatform", "version": "2.7.0"}, {"name": "mlflow", "version": "1.27.0"},
                       {"name": "protobuf", "version": "7.36.2"}]
        if not constraints:  # uv's own order: protobuf first, MLflow walked back
            return walked_back
        if "mlflow>=2" in constraints:
            raise job_python.ResolveError(NO_SOLUTION)
        return walked_back

    monkeypatch.setattr(job_python, "resolve", resolve)
    monkeypatch.setattr(job_python, "resolver", lambda: "uv")
    monkeypatch.setattr(job_python, "_requires", lambda name, version, uv: SDK_REQUIRES)
    assert job_python.plan(AUTOLOG, lambda reqs: reqs, tmp_path, print, lambda: PLATFORM) == AUTOLOG_RESOLUTION


def test_the_resolver_is_uv_beside_the_platforms_python_or_the_job_says_how_to_install_it(monkeypatch):
    import sys

    from modelyard.platform.jobs.job_runner import JobFailed

    import uv

    assert job_python.resolver() == uv.find_uv_bin()
    monkeypatch.setitem(sys.modules, "uv", None)  # not installed
    with pytest.raises(JobFailed, match=r"uv, the resolver .*\(pip install 'uv>=0.5,<1'\)") as info:
        job_python.resolver()
    assert info.value.status == "FAILED_PRECONDITION"


def test_a_jobs_pip_reads_plain_installs_only(tmp_path):
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("# pinned\nscikit-learn==1.9.1  # the fit\n\npandas\n")
    items = job_packages.pip_install_items
    assert items(["install", "-q", "--user", "/gcs/b/pkg.tar.gz"]) == ["/gcs/b/pkg.tar.gz"]
    assert items(["install", "--upgrade", "pip"]) == ["pip"]
    assert items(["install", "-r", str(reqs), "numpy"]) == ["scikit-learn==1.9.1", "pandas", "numpy"]
    # Anything else stays pip's own: other commands, options the rule does not read, nothing to install.
    for args in (["list"], ["install", "-e", "."], ["install", "--index-url", "http://x", "a"], ["install", "-q"],
                 ["install", "-r", str(tmp_path / "missing.txt")], []):
        assert items(args) is None, args


def _job_venv(tmp_path):
    from modelyard.platform.jobs import job_env

    python = job_env.PythonEnv(tmp_path / "jobs" / "job-1")
    python.create()
    return python


def test_a_jobs_pip_install_that_conflicts_turns_its_environment_into_its_own(tmp_path, monkeypatch):
    from modelyard.platform.jobs import job_env

    python = _job_venv(tmp_path)
    wrapper = (python.root / "bin" / "pip3").read_text()
    assert "job_pip" in wrapper and str(python.root) in wrapper  # every job's pip goes through the rule
    package = tmp_path / "pkg.tar.gz"
    package.write_bytes(b"")
    monkeypatch.setattr(job_env, "declared_requirements", lambda f: list(AUTOLOG))
    asked, installed = [], []
    monkeypatch.setattr(job_python, "plan", lambda reqs, unsatisfied, cache, say: asked.append((reqs, cache))
                        or AUTOLOG_RESOLUTION)
    monkeypatch.setattr(job_python, "_own_deps", lambda cache, resolution: installed.append(resolution)
                        or job_env.PythonEnv(tmp_path / "deps"))
    monkeypatch.setattr(job_python.OwnPythonEnv, "_pip_into", staticmethod(lambda py, args: installed.append(args)))
    # The SDK's custom-container command: `pip3 install -q --user /gcs/.../pkg.tar.gz` (rewritten to a file).
    assert job_packages.job_pip([str(python.root), "install", "-q", "--user", str(package)]) == 0
    assert asked == [(sorted(AUTOLOG), tmp_path / "jobs" / ".python-deps")]  # the jobs' one cache
    assert installed == [AUTOLOG_RESOLUTION, ["--no-deps", str(package)]]
    cfg = (python.root / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg and "= true" not in cfg
    site = sorted(p.name for p in python.purelib.iterdir())
    assert "_modelyard_platform_site.pth" not in site and "_modelyard_no_platform_path.pth" in site
    assert (python.purelib / "_modelyard_deps.pth").read_text().strip() == str(job_env.PythonEnv(tmp_path / "deps")
                                                                               .purelib)
    assert "--python" in (python.root / "bin" / "pip").read_text()  # its pip now installs into it alone


def test_a_jobs_pip_install_the_platform_serves_is_pips_as_before(tmp_path, monkeypatch):
    import subprocess

    python = _job_venv(tmp_path)
    monkeypatch.setattr(job_python, "plan", lambda *a, **k: None)
    ran = []

    def pip(argv):  # an upgrade of pip writes pip's own scripts over the venv's
        ran.append(argv)
        (python.root / "bin" / "pip3").write_text("#!/venv/bin/python\nfrom pip._internal.cli.main import main\n")
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(job_packages.subprocess, "run", pip)
    assert job_packages.job_pip([str(python.root), "install", "--upgrade", "pip"]) == 0
    assert job_packages.job_pip([str(python.root), "list"]) == 0
    assert ran == [[python.python, "-m", "pip", "install", "--upgrade", "pip"], [python.python, "-m", "pip", "list"]]
    assert "include-system-site-packages = true" in (python.root / "pyvenv.cfg").read_text()
    assert "job_pip" in (python.root / "bin" / "pip3").read_text()  # the rule's pip again, for the next install
