"""Which Python a job's packages get: the platform's environment, or one of the job's own.

Every job's Python sees the platform's packages (``job_env.PythonEnv``), so a job whose packages need
nothing the platform lacks starts at once. But a job may ask for what cannot install beside them:
``CustomJob.from_local_script(..., enable_autolog=True)`` adds ``google-cloud-aiplatform[autologging]``,
whose MLflow (<= 2.16 below Python 3.13) pins protobuf < 6 and pandas < 3 while the platform runs
protobuf 7 and pandas 3. On Vertex such a job gets a fresh container; here it gets an environment of
its own. The one rule (``plan``):

- the requirements the job's packages declare are resolved by pip on their own, as a fresh container
  would install them (``resolve``: ``pip install --dry-run --ignore-installed --report``, with ``HINTS``,
  by a recent pip of the jobs' own, ``resolver``);
- they **conflict** with the platform (``conflicts``) when that resolution asks of a package the platform
  has a version the platform's does not satisfy (mlflow-skinny 2.16 needs protobuf<6: the platform has
  7.36.2);
- no conflict: the platform's environment, as before (``job_env``: what it lacks installed into a
  shared environment that sees it). A conflict: ``OwnPythonEnv``, a virtual environment that does not
  see the platform's site-packages, holding exactly the resolved versions. It is made once per
  requirement set (``.python-deps/own-{hash}`` beside the jobs' folders, the hash of the requirements,
  the hints and the interpreter), by the first job that needs it, with pip's progress in that job's log;
  the next job with the same requirements finds it ready. Requirements pip cannot resolve fail the job
  with pip's words (and are refused at create: ``job_packages.check``).

Inside an own environment the job still finds the platform without modelyard: its variables
(``AIP_*``, ``CLOUD_ML_*``, the experiment's, ``GCE_METADATA_HOST`` and ``STORAGE_EMULATOR_HOST`` of
its metadata server and storage gateway, ``HTTPS_PROXY`` for TensorFlow's gs://) are plain environment
variables, and ``sdk_defaults`` (standard library only) is copied in as into every job's Python.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from modelyard import tf_gcs
from modelyard.platform.jobs import job_env

# Constraints pip gets with every job requirement set it resolves here. google-cloud-aiplatform[autologging]
# allows mlflow>=1.27: given it, pip walks back through every MLflow 2 release (each pins protobuf<6, which the
# newest google-api-core excludes) instead of taking an older google-api-core, then reaches 1.27, whose metadata
# pip refuses, and had not ended after 5 minutes (pip 26.3, this machine); MLflow 1.x imports protos that
# protobuf >= 4 refuses anyway. With mlflow>=2 pip resolves the set in ~20 s (mlflow 2.16, protobuf 5.29).
HINTS = ("mlflow>=2",)
RESOLVE_TIMEOUT_S = 900.0  # the job's own resolution (create time has job_packages.DRY_RUN_TIMEOUT_S)


class ResolveError(Exception):
    """pip could not resolve the requirements (its words), or ran out of time (``timed_out``)."""

    def __init__(self, words: str, timed_out: bool = False) -> None:
        super().__init__(words)
        self.timed_out = timed_out


PIP = "pip>=26"  # the resolver's pip: pip 23's resolver did not finish the SDK's autologging set in 200 s, even with HINTS


def _pip(*args: str, python: str = sys.executable) -> list[str]:
    return [python, "-m", "pip", "--disable-pip-version-check", *args]


def pip_env() -> dict[str, str]:
    """This process's environment for pip reaching the package index: a job's process has its storage
    gateway as HTTPS proxy (job_identity, for TensorFlow's gs://), which is no way to the index."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    routed = env.get(tf_gcs.ROUTED_ENV)
    if routed:
        for name in ("HTTPS_PROXY", "https_proxy"):
            if env.get(name) == routed:
                env.pop(name)
        env.pop("CURL_CA_BUNDLE", None)  # the gateway's certificate authority
    return {**env, "PIP_NO_INPUT": "1"}


def resolver(cache: Path) -> str:
    """The interpreter of the jobs' resolver: a virtual environment under ``cache`` holding only a recent
    pip (``PIP``), made once, as a fresh container's ``pip install --upgrade pip`` would have it."""
    import fcntl
    import venv

    root = cache / "resolver"
    python = str(root / "bin" / "python")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "resolver.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "ready").exists():
            venv.EnvBuilder(with_pip=True, symlinks=True, clear=True).create(str(root))
            done = subprocess.run(_pip("install", "--quiet", "--upgrade", PIP, python=python),
                                  capture_output=True, text=True, env=pip_env())
            if done.returncode != 0:
                _fail(f"could not install {PIP} for the job's resolution: {done.stderr[-1500:]}")
            (root / "ready").write_text(PIP + "\n")
    return python


def resolve(requirements: list[str], python: str, timeout: float | None = RESOLVE_TIMEOUT_S) -> list[dict]:
    """What pip (of ``python``: ``resolver``'s) would install for ``requirements`` into an empty
    environment: ``[{"name", "version", "requires": [...], "extras": [...]}]`` (pip's installation report,
    nothing installed). ResolveError with pip's last words when it cannot."""
    with tempfile.TemporaryDirectory(prefix="modelyard-resolve-") as tmp:
        hints = Path(tmp) / "hints.txt"
        hints.write_text("\n".join(HINTS) + "\n")
        report = Path(tmp) / "report.json"
        try:
            done = subprocess.run(_pip("install", "--dry-run", "--quiet", "--ignore-installed", "--report",
                                       str(report), "-c", str(hints), *requirements, python=python),
                                  capture_output=True, text=True, timeout=timeout, env=pip_env())
        except subprocess.TimeoutExpired:
            raise ResolveError(f"pip did not resolve {requirements!r} within {timeout:.0f} s", timed_out=True) from None
        if done.returncode != 0 or not report.exists():
            raise ResolveError(pip_words(done.stderr))
        items = json.loads(report.read_text())["install"]
    return [{"name": i["metadata"]["name"], "version": i["metadata"]["version"],
             "requires": i["metadata"].get("requires_dist") or [], "extras": i.get("requested_extras") or []}
            for i in items]


def pip_words(stderr: str) -> str:
    """pip's error lines (its last lines when none says ERROR), without its notes on unused indexes."""
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("WARNING: Location")]
    return "\n".join([line for line in lines if line.startswith("ERROR:")] or lines[-6:])


def _installed_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def conflicts(resolution: list[dict], requirements: list[str],
              installed: Callable[[str], str | None] = _installed_version) -> list[str]:
    """The platform's packages that ``resolution`` (``resolve``'s, of ``requirements``) needs at another
    version, each said as ``protobuf 7.36.2 (mlflow-skinny 2.16.0 needs protobuf<6,>=3.12.0)``; empty
    when the resolution installs beside the platform. ``installed``: a package's version here, or None."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name as canon

    # (who asks, requirement) for every requirement in force: the job's own, then each resolved package's,
    # an extra's only when someone asks for that extra.
    asked = [("the job", Requirement(r)) for r in requirements]
    extras: dict[str, set[str]] = {}
    for item in resolution:
        extras.setdefault(canon(item["name"]), set()).update(item["extras"])
    for _who, req in asked:
        extras.setdefault(canon(req.name), set()).update(req.extras)
    pending = list(resolution)
    parsed = {canon(i["name"]): [Requirement(r) for r in i["requires"]] for i in pending}
    changed = True
    while changed:  # extras asked for by a package's requirement turn on more requirements: to a fixed point
        changed = False
        for item in pending:
            for req in parsed[canon(item["name"])]:
                if _active(req, extras.get(canon(item["name"]), set()), default_environment()):
                    new = set(req.extras) - extras.setdefault(canon(req.name), set())
                    if new:
                        extras[canon(req.name)] |= new
                        changed = True
    env = default_environment()
    for item in pending:
        for req in parsed[canon(item["name"])]:
            if _active(req, extras.get(canon(item["name"]), set()), env):
                asked.append((f"{item['name']} {item['version']}", req))
    out = []
    for who, req in asked:
        have = installed(req.name)
        if req.url or (have is not None and not req.specifier.contains(have, prereleases=True)):
            line = f"{req.name} {have} ({who} needs {req.name}{req.specifier})"
            if have is not None and line not in out:
                out.append(line)
    return out


def _active(req, extras: set[str], env: dict) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**env, "extra": e}) for e in (extras | {""}))


def requirements_key(requirements: list[str]) -> str:
    """The cache key of a requirement set: the set, the hints and the interpreter."""
    return hashlib.sha256(json.dumps([sys.executable, sorted(requirements), list(HINTS)]).encode()).hexdigest()[:20]


def plan(requirements: list[str], unsatisfied: Callable[[list[str]], list[str]], cache: Path,
         say: Callable[[str], None] = print) -> list[dict] | None:
    """None when the platform's environment serves ``requirements`` (nothing they need is missing, or
    what is missing installs beside it); else the resolution an own environment installs, after saying
    why in the job's log (``say``). ``unsatisfied``: the requirements the platform does not meet
    (``job_packages``). The answer is kept under ``cache`` per requirement set: the next job asks pip nothing."""
    if not requirements or not unsatisfied(requirements):
        return None
    kept = cache / f"plan-{requirements_key(requirements)}.json"
    if kept.exists():
        resolution, clash = json.loads(kept.read_text())
    else:
        try:
            resolution = resolve(requirements, resolver(cache))
        except ResolveError as exc:
            _fail(f"pip cannot resolve the packages' requirements {requirements!r}: {exc}")
        clash = conflicts(resolution, requirements)
        cache.mkdir(parents=True, exist_ok=True)
        partial = kept.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps([resolution, clash]))
        partial.rename(kept)
    if not clash:
        return None
    say(f"[modelyard] the job's requirements conflict with the platform's packages ({'; '.join(clash)}): "
        f"the job gets a Python environment of its own ({len(resolution)} packages)")
    return resolution


def _fail(message: str):
    from modelyard.platform.jobs.job_runner import JobFailed

    raise JobFailed(f"python_package_spec: {message}", "INVALID_ARGUMENT")


class OwnPythonEnv(job_env.PythonEnv):
    """A job's virtual environment that does not see the platform's packages: the resolved requirements
    (a shared, cached environment, ``_own_deps``) and the job's packages, installed without their
    dependencies. pip is the platform's, pointed at this interpreter (``pip --python``)."""

    def __init__(self, work_dir: Path, resolution: list[dict]) -> None:
        super().__init__(work_dir)
        self.resolution = resolution

    def create(self) -> None:
        _bare_venv(self.root)
        purelib = self.purelib
        # google-cloud-aiplatform's defaults in a job (standard library only): the platform's API.
        purelib.mkdir(parents=True, exist_ok=True)
        (purelib / "_modelyard_sdk_defaults.py").write_bytes(Path(job_env.__file__).with_name("sdk_defaults.py")
                                                              .read_bytes())
        (purelib / "_modelyard_sdk_defaults.pth").write_text("import _modelyard_sdk_defaults\n")
        for name in ("pip", "pip3"):  # a job's pip installs into its own environment
            tool = self.root / "bin" / name
            tool.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m pip --python "{self.python}" "$@"\n')
            tool.chmod(0o700)
        _private(self.root)

    def env(self) -> dict[str, str]:
        # The platform's PYTHONPATH (its source tree, say) is no path of this job's.
        return {**super().env(), "PYTHONPATH": ""}

    def install(self, files: list[str]) -> None:
        deps = _own_deps(self.root.parent.parent / ".python-deps", self.resolution)
        (self.purelib / "_modelyard_deps.pth").write_text(str(deps.purelib) + "\n")
        if files:
            self._pip_into(self.python, ["--no-deps", *files])

    @staticmethod
    def _pip_into(python: str, args: list[str], progress: bool = False) -> None:
        """pip install ``args`` into the environment of ``python``; its output in the job's log when
        ``progress``; JobFailed(INVALID_ARGUMENT) with pip's words."""
        done = subprocess.run(_pip("--python", python, "install", "--no-input", "--progress-bar", "off",
                                   *([] if progress else ["--quiet"]), *args),
                              stdout=None if progress else subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=pip_env())
        if done.returncode != 0:
            _fail(f"pip could not install {' '.join(args)}:\n" + pip_words(done.stderr)[-1500:])


def _private(root: Path) -> None:
    """venv copies its activate scripts with their templates' modes (0644), past the platform's umask: a
    job's files are its user's alone, as the rest of the state directory."""
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode & 0o700)


def _bare_venv(root: Path) -> None:
    """A virtual environment of this interpreter at ``root`` seeing no other site-packages, no pip."""
    import venv

    if not (root / "bin" / "python").exists():
        venv.EnvBuilder(system_site_packages=False, with_pip=False, symlinks=True).create(str(root))


def _own_deps(cache: Path, resolution: list[dict]) -> job_env.PythonEnv:
    """The environment holding exactly ``resolution``, seeing nothing else; made once per resolution
    (concurrent jobs wait for the one making it), its pip output in the maker's log."""
    import fcntl
    import shutil
    import time

    pins = sorted(f"{i['name']}=={i['version']}" for i in resolution)
    key = "own-" + requirements_key(pins)
    cache.mkdir(parents=True, exist_ok=True)
    env = job_env.PythonEnv(cache / key)
    with open(cache / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (cache / key / "ready").exists():
            print(f"[modelyard] the job's own Python environment: {cache / key} (ready)", flush=True)
            return env
        shutil.rmtree(cache / key, ignore_errors=True)
        print(f"[modelyard] building the job's own Python environment {cache / key}: {len(pins)} packages "
              "(once: the next job with these requirements finds it ready)", flush=True)
        start = time.monotonic()
        _bare_venv(env.root)
        _private(env.root)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="pins-", dir=cache, delete=False) as f:
            f.write("\n".join(pins) + "\n")
        try:
            # No byte-compiling of ~100 packages up front: a job compiles what it imports.
            OwnPythonEnv._pip_into(env.python, ["--no-deps", "--no-compile", "-r", f.name], progress=True)
        finally:
            os.unlink(f.name)
        (cache / key / "ready").write_text("\n".join(pins) + "\n")
        print(f"[modelyard] built {cache / key} in {time.monotonic() - start:.0f} s", flush=True)
    return env
