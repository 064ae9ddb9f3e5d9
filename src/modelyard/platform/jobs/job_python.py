"""Which Python a job's packages get: the platform's environment, or one of the job's own.

Every job's Python sees the platform's packages (``job_env.PythonEnv``), so a job whose packages need
nothing the platform lacks starts at once. But a job may ask for what cannot install beside them:
``CustomJob.from_local_script(..., enable_autolog=True)`` adds ``google-cloud-aiplatform[autologging]``,
whose MLflow (<= 2.16 below Python 3.13) pins protobuf < 6 and pandas < 3 while the platform runs
protobuf 7 and pandas 3. On Vertex such a job gets a fresh container; here it gets an environment of
its own. The one rule (``plan``):

- requirements the platform's environment meets (extras included) need nothing;
- the others are resolved on their own first (``fresh_resolution``: what a fresh container of Vertex's gets;
  none at all fails the job with the resolver's words), then with every package the platform has held at
  its version (``platform_pins``) and every package the platform lacks held at the major version the
  fresh resolution gives it (``fresh_floors``): if that resolution exists, they install beside the
  platform, as before (``job_env``: what is missing goes into a shared environment that sees the
  platform's);
- if it does not, they **conflict** with the platform: the job gets ``OwnPythonEnv``, a virtual
  environment that does not see the platform's site-packages, holding exactly the requirements'
  resolution on their own (the job's log says so, naming the packages it holds below the platform's
  versions: ``protobuf 7.36.2 -> 5.29.6``). It is made once per requirement set
  (``.python-deps/own-{hash}`` beside the jobs' folders), by the first job that needs it, with the
  installer's progress in that job's log; the next job with the same requirements finds it ready.

The rule asks the same of a ``python_package_spec``'s packages (``job_packages.install``, before the job
starts) and of a job's own ``pip install`` (``job_packages.job_pip``: a custom container's command that
installs its package itself, as the SDK's ``from_local_script`` writes it); the latter turns the job's
platform-seeing environment into an own one in place, so the ``python3`` that runs next sees it.

The resolver is uv, a dependency of modelyard found beside this interpreter (``resolver``); the verdict
and the resolution are kept per requirement set, so a second job asks nothing.

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

# The resolver: uv (a dependency in pyproject.toml). pip's resolver took > 5 min on the SDK's autologging set
# here, even pip 26 (this index serves no PEP 658 metadata, so pip fetches every candidate wheel, ~2 GB, or
# with fast-deps a range request per candidate); uv resolves it in seconds, and installs ~90 wheels in parallel.
RESOLVE_TIMEOUT_S = 600.0


class ResolveError(Exception):
    """The requirements have no resolution (the resolver's words), or it ran out of time (``timed_out``)."""

    def __init__(self, words: str, timed_out: bool = False) -> None:
        super().__init__(words)
        self.timed_out = timed_out


def pip_env() -> dict[str, str]:
    """This process's environment for pip or uv reaching the package index: a job's process has its storage
    gateway as HTTPS proxy (job_identity, for TensorFlow's gs://), which is no way to the index."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    routed = env.get(tf_gcs.ROUTED_ENV)
    if routed:
        for name in ("HTTPS_PROXY", "https_proxy"):
            if env.get(name) == routed:
                env.pop(name)
        env.pop("CURL_CA_BUNDLE", None)  # the gateway's certificate authority
    return {**env, "PIP_NO_INPUT": "1"}


def resolver() -> str:
    """uv's executable, installed beside this interpreter with modelyard (its ``uv`` dependency); the job
    fails FAILED_PRECONDITION saying how to install it when it is missing."""
    from modelyard.platform.jobs.job_runner import JobFailed

    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError) as exc:  # uv's UvNotFound is a FileNotFoundError
        raise JobFailed(f"python_package_spec: uv, the resolver of jobs' requirements (a dependency of modelyard), "
                        f"is not installed beside the platform's Python {sys.executable} ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0]}): install it there (pip install 'uv>=0.5,<1') and restart "
                        "the platform", "FAILED_PRECONDITION") from None


def resolve(requirements: list[str], uv: str, constraints: list[str] = (),
            timeout: float | None = RESOLVE_TIMEOUT_S) -> list[dict]:
    """The versions an empty environment of this interpreter gets for ``requirements`` (and
    ``constraints``): ``[{"name", "version"}]``, nothing installed. ResolveError with the resolver's
    explanation when there is none."""
    with tempfile.TemporaryDirectory(prefix="modelyard-resolve-") as tmp:
        (Path(tmp) / "in.txt").write_text("\n".join(requirements) + "\n")
        (Path(tmp) / "c.txt").write_text("\n".join(constraints) + "\n")
        try:
            done = subprocess.run([uv, "pip", "compile", "--quiet", "--no-header", "--no-annotate", "--python",
                                   sys.executable, "-c", str(Path(tmp) / "c.txt"), str(Path(tmp) / "in.txt")],
                                  capture_output=True, text=True, timeout=timeout, env=pip_env())
        except subprocess.TimeoutExpired:
            raise ResolveError(f"no resolution of {requirements!r} within {timeout:.0f} s", timed_out=True) from None
    if done.returncode != 0:
        raise ResolveError(pip_words(done.stderr))
    out = []
    for line in done.stdout.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and not line.startswith("#"):
            out.append({"name": name.split("[", 1)[0], "version": version.split(";", 1)[0].strip()})
    return out


def fresh_resolution(requirements: list[str], uv: str) -> list[dict]:
    """What a fresh environment (Vertex's container) gets for ``requirements``: their resolution on their
    own, the requirements of the extras they name (``extra_requirements``) decided first, at their newest.

    Why first: which of two packages yields is the resolver's order. The SDK's autologging extra allows
    ``mlflow>=1.27,<=2.16`` and its base allows protobuf 7; uv decides protobuf first and walks MLflow back to
    1.27 (whose protos protobuf >= 4 refuses at import, and whose metadata pip refuses), while pip in a fresh
    container installs MLflow 2.16 with protobuf 5. Listing what the job asked for by naming the extra ahead
    of the rest gives uv pip's answer; it changes no requirement of the set, only the order."""
    alone = resolve(requirements, uv)
    extras = extra_requirements(requirements, alone, uv)
    return resolve([*extras, *requirements], uv) if extras else alone


def extra_requirements(requirements: list[str], resolution: list[dict], uv: str) -> list[str]:
    """The requirements the extras named in ``requirements`` add (``X[e]``: what ``X`` requires for ``e`` at
    the version ``resolution`` holds, markers evaluated here), read from ``X``'s metadata: the platform's
    own copy when it has that version, else the package fetched without its dependencies (uv)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    versions = {canonicalize_name(i["name"]): i["version"] for i in resolution}
    out: list[str] = []
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        version = versions.get(canonicalize_name(req.name))
        if not req.extras or version is None:
            continue
        for line in _requires(req.name, version, uv):
            sub = Requirement(line)
            if sub.marker is None or sub.marker.evaluate({"extra": ""}):
                continue  # the package's own requirements, not the extra's
            if any(sub.marker.evaluate({"extra": e}) for e in req.extras):
                sub.marker = None
                if str(sub) not in out:
                    out.append(str(sub))
    return out


def _requires(name: str, version: str, uv: str) -> list[str]:
    """``Requires-Dist`` of ``name==version``: the platform's distribution, or the package's own metadata."""
    from importlib import metadata

    try:
        if metadata.version(name) == version:
            return metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        pass
    with tempfile.TemporaryDirectory(prefix="modelyard-metadata-") as tmp:
        try:
            done = subprocess.run([uv, "pip", "install", "--quiet", "--no-deps", "--target", tmp, "--python",
                                   sys.executable, f"{name}=={version}"], capture_output=True, text=True,
                                  timeout=RESOLVE_TIMEOUT_S, env=pip_env())
        except subprocess.TimeoutExpired:
            raise ResolveError(f"{name}=={version} not fetched within {RESOLVE_TIMEOUT_S:.0f} s", timed_out=True) from None
        found = list(Path(tmp).glob("*.dist-info"))
        if done.returncode != 0 or not found:
            raise ResolveError(f"could not read the requirements of {name}=={version}: {pip_words(done.stderr)}")
        return metadata.Distribution.at(found[0]).requires or []


def pip_words(stderr: str) -> str:
    """A resolver's or pip's explanation: its error lines (its last lines when none says so), without pip's
    notes on unused indexes."""
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("WARNING: Location")]
    return "\n".join([line for line in lines if line.startswith(("ERROR:", "error:"))] or lines[-8:])


def _installed() -> dict[str, str]:
    """The platform's distributions, by canonical name: version."""
    from importlib import metadata

    from packaging.utils import canonicalize_name

    return {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()
            if d.metadata["Name"]}


def platform_pins(installed: dict[str, str]) -> list[str]:
    """Constraints holding every platform package at its version (modelyard itself left out: no index
    has this checkout)."""
    return sorted(f"{name}=={version}" for name, version in installed.items() if name != "modelyard")


def older_than_platform(resolution: list[dict], installed: dict[str, str]) -> list[str]:
    """The packages ``resolution`` holds at a version below the platform's (the ones a conflict is
    about), each as ``protobuf 7.36.2 -> 5.29.6``."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    out = []
    for item in resolution:
        have = installed.get(canonicalize_name(item["name"]))
        try:
            if have is not None and Version(item["version"]) < Version(have):
                out.append(f"{item['name']} {have} -> {item['version']}")
        except InvalidVersion:
            continue
    return out


def fresh_floors(resolution: list[dict], installed: dict[str, str]) -> list[str]:
    """Constraints holding each package of ``resolution`` (the requirements resolved on their own) that the
    platform lacks at that resolution's major version (its minor, for a 0.x release): ``mlflow>=2``.

    Why: resolved beside the platform, a package the platform lacks may be walked back to an old major
    version only because the platform's pins exclude the newer ones, and that resolution "succeeds" with a
    package the job's code was not written for: beside protobuf 7, the SDK's autologging extra resolves to
    MLflow 1.27, whose protos protobuf >= 4 refuses at import, while a fresh container gets MLflow 2.16
    (``fresh_resolution``). Held at the fresh major (``mlflow>=2``), such a set conflicts, and the job gets
    what Vertex would give it."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    out = []
    for item in resolution:
        if canonicalize_name(item["name"]) in installed:
            continue  # the platform's own: pinned at its version already
        try:
            release = Version(item["version"]).release
        except InvalidVersion:
            continue
        floor = f"{release[0]}" if release[0] or len(release) < 2 else f"0.{release[1]}"
        out.append(f"{item['name']}>={floor}")
    return out


RULE = "fresh-major"  # in the cache key: a verdict kept by an earlier rule is not this rule's


def requirements_key(requirements: list[str]) -> str:
    """The cache key of a requirement set: the set, the rule and the interpreter."""
    return hashlib.sha256(json.dumps([sys.executable, sorted(requirements), RULE]).encode()).hexdigest()[:20]


def plan(requirements: list[str], unsatisfied: Callable[[list[str]], list[str]], cache: Path,
         say: Callable[[str], None] = print, installed: Callable[[], dict[str, str]] = _installed
         ) -> list[dict] | None:
    """None when the platform's environment serves ``requirements``; else the resolution (``[{"name",
    "version"}]``) an own environment installs, after saying why in the job's log (``say``).

    The rule: requirements the platform meets (``unsatisfied``: ``job_packages``') need nothing; the
    others are resolved on their own (``fresh_resolution``; none: the job fails with the resolver's words), then with every
    platform package held at its version (``platform_pins``) and the packages the platform lacks at their
    fresh major version (``fresh_floors``): if that resolution exists they install beside the platform
    (None); if it does not, they conflict, and the job gets their own resolution. The answer is kept under
    ``cache`` per requirement set."""
    if not requirements or not unsatisfied(requirements):
        return None
    kept = cache / f"plan-{requirements_key(requirements)}.json"
    if kept.exists():
        resolution, why = json.loads(kept.read_text())
    else:
        uv = resolver()
        have = installed()
        try:
            alone = fresh_resolution(requirements, uv)
        except ResolveError as exc:
            if exc.timed_out:
                _fail(str(exc))
            _fail(f"the packages' requirements {requirements!r} cannot be resolved: {exc}")
        try:
            resolve(requirements, uv, platform_pins(have) + fresh_floors(alone, have))
            resolution, why = None, ""
        except ResolveError as exc:
            if exc.timed_out:
                _fail(str(exc))
            resolution = alone
            why = "; ".join(older_than_platform(resolution, have)) or str(exc).splitlines()[-1]
        cache.mkdir(parents=True, exist_ok=True)
        partial = kept.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps([resolution, why]))
        partial.rename(kept)
    if resolution is None:
        return None
    say(f"[modelyard] the job's requirements cannot install beside the platform's packages ({why}): "
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
        """Make the environment, or turn the job's platform-seeing one (``job_env.PythonEnv``, whose pip
        found a conflict: ``job_packages.job_pip``) into it in place: its interpreter then sees none of the
        platform's site-packages, nor what was installed beside them."""
        _bare_venv(self.root)
        _see_no_system_site(self.root)
        purelib = self.purelib
        purelib.mkdir(parents=True, exist_ok=True)
        for name in ("_modelyard_platform_site.pth", "_modelyard_deps.pth"):
            (purelib / name).unlink(missing_ok=True)
        # google-cloud-aiplatform's defaults in a job (standard library only): the platform's API.
        (purelib / "_modelyard_sdk_defaults.py").write_bytes(Path(job_env.__file__).with_name("sdk_defaults.py")
                                                              .read_bytes())
        (purelib / "_modelyard_sdk_defaults.pth").write_text("import _modelyard_sdk_defaults\n")
        # The platform's source tree, when it runs from a checkout, is on its PYTHONPATH and so on the job's
        # unless the job's environment is made here (``env``): a job's pip that turns it own cannot change
        # the shell it runs in, so the interpreter drops that folder itself.
        source = os.path.realpath(Path(job_env.__file__).parents[3])
        (purelib / "_modelyard_no_platform_path.pth").write_text(
            f"import os, sys; sys.path[:] = [p for p in sys.path if not p or os.path.realpath(p) != {source!r}]\n")
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
    def _pip_into(python: str, args: list[str]) -> None:
        """pip install ``args`` into the environment of ``python`` (this interpreter's pip, ``--python``);
        JobFailed(INVALID_ARGUMENT) with pip's words."""
        done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", python,
                               "install", "--no-input", "--quiet", *args], capture_output=True, text=True, env=pip_env())
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


def _see_no_system_site(root: Path) -> None:
    """The virtual environment at ``root`` no longer sees its base interpreter's site-packages (nor the
    user's, which Python then leaves out too)."""
    cfg = root / "pyvenv.cfg"
    lines = cfg.read_text().splitlines()
    out = [line for line in lines if line.split("=", 1)[0].strip() != "include-system-site-packages"]
    cfg.write_text("\n".join([*out, "include-system-site-packages = false"]) + "\n")


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
            done = subprocess.run([resolver(), "pip", "install", "--python", env.python, "--no-deps", "-r", f.name],
                                  stderr=subprocess.STDOUT, text=True, env=pip_env())  # its progress: the job's log
        finally:
            os.unlink(f.name)
        if done.returncode != 0:
            _fail(f"the job's own environment could not be installed (uv said so above, exit {done.returncode})")
        (cache / key / "ready").write_text("\n".join(pins) + "\n")
        print(f"[modelyard] built {cache / key} in {time.monotonic() - start:.0f} s", flush=True)
    return env
