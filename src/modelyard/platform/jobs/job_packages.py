"""A job's Python packages (Vertex AI's ``pythonPackageSpec``): one rule for every job that runs them.

A worker pool may name, instead of a container command, ``packageUris`` (sdists or wheels in Cloud
Storage, ``/gcs/`` paths or local files) and a ``pythonModule``: its replicas run ``python -m
pythonModule args`` in the job's own Python (job_env.PythonEnv) into which the packages were
installed with the requirements they declare (``CustomJob.from_local_script(requirements=...)``
and ``CustomTrainingJob`` build such a source distribution, ``aiplatform_custom_trainer_script``).
The same rule holds for a CustomJob's every pool, a training pipeline (its backing CustomJob), every
trial of a HyperparameterTuningJob (installed once for the job, then each trial runs the module),
and a replica on a Ray node (``install`` there, from storage). A job that installs packages itself (a
custom container's command ``pip install ...``, as the SDK's ``from_local_script`` writes it for a custom
image) meets the same rule through its pip (``job_pip``).

What is checked when the job is created (``check``; 400 INVALID_ARGUMENT naming the field, nothing
made), because it costs little and every replica or trial would fail on it otherwise:

- ``pythonModule`` is a dotted Python name and ``packageUris`` lists at least one file;
- each package file exists (gs:// and /gcs/ objects in storage, local files on the platform's host)
  and is a wheel or source distribution pip can read (files up to ``CHECK_BYTES`` are read);
- each requirement the packages declare is a valid requirement, and each one the platform's
  environment does not satisfy already (an extra's requirements included) exists at a version it
  allows (``pip install --dry-run --no-deps``: pip asks its index for those only; nothing is
  installed). A package whose requirements only its build can tell is dry-run itself, with them.

How the requirements resolve together is the job's to find (``job_python.plan``: beside the platform's
packages, or in a Python of the job's own when they cannot be), so what can only fail the job (its
error says so, with the resolver's, pip's or Python's words) is: requirements that have no resolution
together, a package whose build fails, an install that fails after a successful resolution (a
download cut, a dependency that does not build), a dry run that took longer than
``DRY_RUN_TIMEOUT_S`` (then the job tries), and a module that is not in the packages or fails when it runs.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from modelyard import objstore
from modelyard.platform.api.errors import ApiError, invalid
from modelyard.platform.jobs import job_env, job_python
from modelyard.platform.jobs.job_identity import without_admin_token

CHECK_BYTES = 64 << 20  # larger package files are checked to exist only: their install tells the rest
DRY_RUN_TIMEOUT_S = 120.0
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_ARCHIVES = (".whl", ".tar.gz", ".tgz", ".zip", ".tar.bz2", ".tar.xz", ".tar")


def parse(spec: dict, where: str) -> tuple[str, list[str]]:
    """``(pythonModule, packageUris)`` of a pythonPackageSpec (proto3 JSON), INVALID_ARGUMENT naming
    ``where`` for a missing or malformed field."""
    module = spec.get("pythonModule")
    uris = spec.get("packageUris")
    if not isinstance(module, str) or not module or not isinstance(uris, list) or not uris:
        raise invalid(f"{where} needs python_module and package_uris.")
    if not _MODULE.fullmatch(module):
        raise invalid(f"{where}.python_module {module!r} is not a Python module name (e.g. trainer.task).")
    for i, uri in enumerate(uris):
        if not isinstance(uri, str) or not uri or uri.endswith("/"):
            raise invalid(f"{where}.package_uris[{i}] must name a package file (a wheel or a source "
                          f"distribution), got {uri!r}.")
    return module, list(uris)


def package_pools(job_spec: dict, where: str = "job_spec") -> list[tuple[str, dict]]:
    """``(field path, pythonPackageSpec)`` of each pool of a CustomJobSpec that has one."""
    pools = job_spec.get("workerPoolSpecs") if isinstance(job_spec, dict) else None
    return [(f"{where}.worker_pool_specs[{i}].python_package_spec", pool["pythonPackageSpec"])
            for i, pool in enumerate(pools if isinstance(pools, list) else [])
            if isinstance(pool, dict) and isinstance(pool.get("pythonPackageSpec"), dict)]


# ---- create time (the platform, in a worker thread) ---------------------------------------------
def check(job_spec: dict, where: str = "job_spec") -> None:
    """Refuse, before anything is made, a job whose packages cannot be installed (see the module's
    docstring for what is checked here and what only the job can find)."""
    pools = package_pools(job_spec, where)
    if not pools:
        return
    with tempfile.TemporaryDirectory(prefix="modelyard-package-check-") as tmp:
        for field, spec in pools:
            _, uris = parse(spec, field)
            files = [_fetch_for_check(uri, f"{field}.package_uris[{i}]", Path(tmp) / str(i))
                     for i, uri in enumerate(uris)]
            _check_installable(field, uris, files)


def storage_uri(uri: str) -> str:
    """A /gcs/BUCKET/PATH (Vertex's mount) as the gs:// URI it stands for; others as they are."""
    return "gs://" + uri[len("/gcs/"):] if uri.startswith("/gcs/") else uri


def _fetch_for_check(uri: str, field: str, into: Path) -> str | None:
    """The package file, local (downloaded into ``into`` when it is in storage), or None when it is
    too large to read here; INVALID_ARGUMENT when it does not exist."""
    uri = storage_uri(uri)
    scheme = objstore.scheme_of(uri)
    if not scheme:
        path = Path(objstore.local_path(uri))
        if not path.is_file():
            raise invalid(f"{field}: {uri} does not exist (or is not a file) on the platform's host.")
        return str(path) if path.stat().st_size <= CHECK_BYTES else None
    fs = objstore.filesystem(scheme)
    fs.invalidate_cache()  # the SDK has just uploaded it: a cached listing must not hide it
    try:
        info = fs.info(uri) if fs.exists(uri) else None
    except Exception as exc:  # no storage reachable: say which and why
        raise ApiError("FAILED_PRECONDITION", f"{field}: {uri} cannot be read: {type(exc).__name__}: {exc}") from None
    if info is None or info.get("type") == "directory":
        raise invalid(f"{field}: {uri} does not exist: upload the package there first.")
    if int(info.get("size") or 0) > CHECK_BYTES:
        return None
    into.mkdir(parents=True, exist_ok=True)
    target = into / uri.rstrip("/").rsplit("/", 1)[-1]
    fs.get_file(uri, str(target))
    return str(target)


def _check_installable(field: str, uris: list[str], files: list[str | None]) -> None:
    for i, (uri, path) in enumerate(zip(uris, files)):
        if path is not None and not _readable_archive(path):
            raise invalid(f"{field}.package_uris[{i}]: {uri} is not a Python package pip can install "
                          f"(a wheel or a source distribution: {', '.join(_ARCHIVES)}).")
    readable = [f for f in files if f is not None]
    declared = [job_env.declared_requirements(f) for f in readable]
    wanted: list[str] = []
    for reqs in declared:
        wanted += [r for r in reqs or [] if r not in wanted]
    items = _unsatisfied(wanted, field)
    if items:
        # Each one exists at a version it allows; how they resolve together, and whether beside the
        # platform's packages or in a Python of the job's own, the job's resolution says (job_python.plan).
        _dry_run(field, items, "--no-deps", "--ignore-installed")
    # Requirements only a build can tell: pip builds the package's metadata in the dry run.
    undeclared = [f for f, reqs in zip(readable, declared) if reqs is None]
    if undeclared:
        _dry_run(field, undeclared)


def _readable_archive(path: str) -> bool:
    import tarfile
    import zipfile

    if path.endswith((".whl", ".zip")):
        return zipfile.is_zipfile(path)
    if path.endswith(_ARCHIVES):
        try:
            with tarfile.open(path) as tar:
                return tar.next() is not None
        except (OSError, tarfile.TarError, EOFError):
            return False
    return False


def _unsatisfied(requirements: list[str], field: str) -> list[str]:
    """The requirements the platform's environment (which every job's Python sees) does not meet, an
    extra's requirements included (``google-cloud-aiplatform[autologging]`` needs MLflow even where the
    SDK itself is installed); INVALID_ARGUMENT for one that is not a requirement at all."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise invalid(f"{field}: the package's requirement {text!r} is not a valid requirement: {exc}") from None
        if not _met(req, set()):
            out.append(text)
    return out


def _met(req, seen: set[str]) -> bool:
    """Whether the platform's environment meets ``req`` (a packaging Requirement): its version, and what
    each extra it names requires, transitively."""
    from importlib import metadata

    from packaging.requirements import Requirement

    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        return True
    try:
        version = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        return False
    if req.url or not req.specifier.contains(version, prereleases=True):
        return False
    for extra in sorted(req.extras):
        if f"{req.name}[{extra}]".lower() in seen:
            continue
        seen.add(f"{req.name}[{extra}]".lower())
        for text in metadata.requires(req.name) or []:
            sub = Requirement(text)
            if sub.marker is not None and sub.marker.evaluate({"extra": extra}) \
                    and not sub.marker.evaluate({"extra": ""}) and not _met(_unmarked(sub), seen):
                return False
    return True


def _unmarked(req):
    """``req`` without its environment marker (already evaluated by the caller)."""
    from packaging.requirements import Requirement

    return Requirement(str(req).split(";", 1)[0])


def _dry_run(field: str, items: list[str], *flags: str) -> None:
    """``pip install --dry-run`` of ``items`` (with ``flags``); INVALID_ARGUMENT with pip's last lines
    when it cannot."""
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
                               "--disable-pip-version-check", "--no-build-isolation", *flags, *items],
                              capture_output=True, text=True, timeout=DRY_RUN_TIMEOUT_S,
                              # The user's setup.py may run here: never with the platform's token.
                              env={**without_admin_token(os.environ), "PIP_NO_INPUT": "1"})
    except subprocess.TimeoutExpired:
        return  # a slow index is not a refusal: the job's own install will say
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        words = "\n".join([line for line in lines if line.startswith("ERROR:")] or lines[-6:])
        raise invalid(f"{field}: pip cannot install the package's requirements {items!r}: {words}")


# ---- run time (the job's process, or a Ray node) ------------------------------------------------
def install(work_dir: Path, uris: list[str], mount: job_env.GcsMount | None = None) -> job_env.PythonEnv:
    """The job's own Python under ``work_dir`` with ``uris`` (storage URIs, /gcs/ paths through
    ``mount``, local files) installed with their requirements; JobFailed(INVALID_ARGUMENT) with
    pip's words when they cannot be."""
    files = fetch([mount.rewrite(u) if mount else u for u in dict.fromkeys(uris)], work_dir / "packages")
    declared = [job_env.declared_requirements(f) for f in files]
    wanted = sorted({r for reqs in declared for r in reqs or []})
    # The one rule (job_python.plan): requirements that conflict with the platform's packages get a Python
    # environment of the job's own; the others the platform's.
    own = job_python.plan(wanted, lambda reqs: _unsatisfied(reqs, "python_package_spec"),
                           work_dir.parent / ".python-deps") \
        if all(r is not None for r in declared) else None
    python = job_env.PythonEnv(work_dir) if own is None else job_python.OwnPythonEnv(work_dir, own)
    python.create()
    if files:
        python.install(files)
    return python


def fetch(uris: list[str], into: Path) -> list[str]:
    """Local files for ``uris``: local ones as they are, those in storage downloaded under ``into``,
    each in a folder of its own so that its file name (which pip reads: a wheel's tags) is kept."""
    out = []
    for i, uri in enumerate(uris):
        if not objstore.scheme_of(uri):
            out.append(objstore.local_path(uri))
            continue
        target = into / str(i) / uri.rstrip("/").rsplit("/", 1)[-1]
        if not target.exists():  # a resumed job keeps what it fetched
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            objstore.filesystem(objstore.scheme_of(uri)).get_file(uri, str(partial))
            partial.rename(target)
        out.append(str(target))
    return out


def trial_pool(pool: dict, python: job_env.PythonEnv, mount: job_env.GcsMount | None) -> dict:
    """A tuning job's trial pool as the container pool its trials run, finding what a CustomJob's
    replica finds: the job's own Python (first on PATH; a python_package_spec's module run by it, where
    its packages were installed) and /gcs/ paths rewritten by ``mount``."""
    rewrite = mount.rewrite if mount else (lambda s: s)
    package = pool.get("pythonPackageSpec")
    spec = package or pool.get("containerSpec") or {}
    env = [{"name": e["name"], "value": rewrite(str(e.get("value", "")))} for e in spec.get("env") or []
           if isinstance(e, dict) and e.get("name")]
    env += [{"name": k, "value": v} for k, v in python.env().items()]
    out = {k: v for k, v in pool.items() if k not in ("pythonPackageSpec", "containerSpec")}
    if package:
        module, _ = parse(package, "trial_job_spec.worker_pool_specs[0].python_package_spec")
        command, image = [python.python, "-m", module], package.get("executorImageUri", "")
    else:
        command, image = [rewrite(str(c)) for c in spec.get("command") or []], spec.get("imageUri", "")
    out["containerSpec"] = {"imageUri": image, "command": command,
                            "args": [rewrite(str(a)) for a in spec.get("args") or []], "env": env}
    return out


# ---- a job's own `pip install` (its environment's pip and pip3) ----------------------------------
# The options of an install the rule reads (any other: pip's, as before: -e, --index-url, -c, ...).
_PIP_QUIET_FLAGS = {"-q", "--quiet", "-U", "--upgrade", "--user", "--no-cache-dir", "--disable-pip-version-check",
                    "--no-input", "--no-warn-script-location", "-v", "--verbose"}


def pip_install_items(args: list[str]) -> list[str] | None:
    """The packages and requirements of a plain ``pip install`` (``args``: pip's arguments; ``-r FILE``
    read), None for any other pip command or an option the rule does not read."""
    if not args or args[0] != "install":
        return None
    items: list[str] = []
    rest = iter(args[1:])
    for arg in rest:
        if arg in ("-r", "--requirement"):
            try:
                lines = Path(next(rest)).read_text().splitlines()
            except (StopIteration, OSError):
                return None
            lines = [line.split(" #", 1)[0].strip() for line in lines]
            if any(line.startswith("-") for line in lines):
                return None
            items += [line for line in lines if line and not line.startswith("#")]
        elif arg.startswith("-"):
            if arg not in _PIP_QUIET_FLAGS:
                return None
        else:
            items.append(arg)
    return items or None


def job_pip(argv: list[str] | None = None) -> int:
    """A job's ``pip`` (``argv``: its environment's root, then pip's arguments; default ``sys.argv[1:]``).

    A plain install (``pip_install_items``) follows the rule of a ``python_package_spec``'s packages
    (``job_python.plan``): when what it installs conflicts with the platform's packages, the job's
    environment becomes one of its own in place (``OwnPythonEnv``: the requirements' own resolution, the
    packages without their dependencies; ``--user`` then means that environment), so the ``python3`` the
    job runs next sees what it asked for and the platform's packages are untouched, as in a fresh
    container on Vertex. Anything else is pip of the job's interpreter, as before (its ``bin/pip*`` then
    written again: ``PythonEnv.write_pip``). Exit status: pip's, or 1 with the reason on stderr."""
    from modelyard.platform.jobs.job_runner import JobFailed

    argv = sys.argv[1:] if argv is None else argv
    root, args = Path(argv[0]), list(argv[1:])
    try:
        own = _conflicting(root, args)
        if own is not None:
            import fcntl

            resolution, files = own
            with open(root / ".own.lock", "w") as lock:  # the replicas of one job share its environment
                fcntl.flock(lock, fcntl.LOCK_EX)
                python = job_python.OwnPythonEnv(root.parent, resolution)
                python.create()
                python.install(files)
            return 0
    except JobFailed as exc:
        print(f"[modelyard] pip {' '.join(args)}: {exc}", file=sys.stderr, flush=True)
        return 1
    done = subprocess.run([str(root / "bin" / "python"), "-m", "pip", *args])
    if "include-system-site-packages = true" in (root / "pyvenv.cfg").read_text():  # not turned own meanwhile
        job_env.PythonEnv(root.parent).write_pip()  # a pip upgrade wrote pip's own scripts over the rule's
    return done.returncode


def _conflicting(root: Path, args: list[str]) -> tuple[list[dict], list[str]] | None:
    """``(resolution, package files)`` when the install ``args`` conflicts with the platform's packages
    (job_python.plan, its reason said on stdout: the job's log), else None."""
    items = pip_install_items(args)
    if items is None:
        return None
    files = [i for i in items if i.endswith(_ARCHIVES) and os.path.isfile(i)]
    named = [i for i in items if i not in files]
    if any("/" in i or i.startswith(".") for i in named):  # a folder, a URL: only pip's build tells
        return None
    declared = [job_env.declared_requirements(f) for f in files]
    if any(reqs is None for reqs in declared):
        return None
    wanted = sorted({*named, *(r for reqs in declared for r in reqs)})
    try:
        resolution = job_python.plan(wanted, lambda reqs: _unsatisfied(reqs, "pip install"),
                                     root.parent.parent / ".python-deps", lambda words: print(words, flush=True))
    except ApiError:  # not a requirement at all: pip says so in its words
        return None
    return None if resolution is None else (resolution, files)
