"""What a training job's processes find around them, as on Vertex AI: their Python, their variables, /gcs/.

- **Python.** Every job gets its own virtual environment (``WORK_DIR/venv``, ``python -m venv
  --system-site-packages --without-pip`` over the platform's interpreter, plus a ``.pth`` adding the
  platform's own site directories, so TensorFlow, modelyard etc. stay importable even when the
  platform itself runs in a venv). Its ``bin`` is first on ``PATH`` (``python3``, ``pip`` and
  ``pip3`` are the venv's, so a job's ``pip install --upgrade pip`` never touches the platform; an
  install that conflicts with the platform's packages turns the venv into one of the job's own:
  ``job_packages.job_pip``), and
  ``PYTHONUSERBASE`` is in the work dir (``pip install --user`` stays in the job). A
  ``python_package_spec``'s packages are installed into it *with* their dependencies (PyPI;
  requirements the platform already has are not installed again; a requirement set the package
  declares is installed once into a shared environment all jobs with that set see). A job whose
  requirements cannot install beside the platform's packages gets instead a Python that does not see
  them (``job_python``: the one rule, and that environment).
- **Variables.** ``CLOUD_ML_PROJECT_ID``, ``CLOUD_ML_JOB_ID``, the ``AIP_*`` output directories (as
  ``gs://`` URIs when the base output directory is one, as on Vertex) and ``STORAGE_EMULATOR_HOST``
  when the platform has one, so gs:// reads and writes of the job reach the platform's storage.
- **/gcs/.** Vertex mounts Cloud Storage at ``/gcs/<bucket>/`` in every container. Here a job's
  ``/gcs/<bucket>/<path>`` in its command, args, env values and package URIs is rewritten to a
  local path: when the platform serves that bucket (its ``storage_root``), the object's own file
  (``storage.local_file``: reads and writes are the bucket's, no copy); otherwise (an outside
  ``STORAGE_EMULATOR_HOST``) ``WORK_DIR/gcs/<bucket>/<path>``, a mirror: before the job starts each
  object (or prefix) so named is copied there from storage, and when the job ends every file
  created or changed under the mirror is written back to its bucket. Paths a program builds itself
  (not from its command line or environment) are not rewritten. A ``/gcs/<name>/`` whose name storage
  refuses as a bucket's (``gcs_bucket``) is refused at create, or fails the job, never left a host path.

- **Identity and TensorFlow's gs://.** ``job_identity``: a metadata server, the job's own token, the
  storage gateway TensorFlow's ``gs://`` goes through; the job's Python points google-cloud-aiplatform
  at the platform (``sdk_defaults``, copied into the venv).

The platform side checks at create time that the buckets a job names exist (``check_storage``):
a missing one is FAILED_PRECONDITION with nothing started, as Vertex refuses it.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

from modelyard import objstore
from modelyard.platform.api.errors import ApiError

# /gcs/<bucket>/<rest>: any first segment, then the path up to a shell separator. Whether the segment is a
# bucket name is storage's one rule (``gcs_bucket``): a name it refuses is refused, never left as a host path.
_GCS_PATH = re.compile(r"(?<![\w/.-])/gcs/([^/\s'\"`;&|<>()]+)(/[^\s'\"`;&|<>()]*)?")
_GS_URI = re.compile(r"^gs://([^/]+)(/.*)?$")


# ---- create time (platform side) ---------------------------------------------------------------
def gcs_buckets(strings: list[str]) -> set[str]:
    """The buckets named by /gcs/ paths in ``strings``; INVALID_ARGUMENT for a name storage refuses."""
    buckets = {m.group(1) for s in strings for m in _GCS_PATH.finditer(s)}
    for bucket in sorted(buckets):
        try:
            gcs_bucket(bucket)
        except ValueError as exc:
            raise ApiError("INVALID_ARGUMENT", str(exc)) from None
    return buckets


def gcs_bucket(bucket: str) -> str:
    """``bucket`` of a /gcs/<bucket>/ path when storage allows the name (``storage.names.check_bucket``),
    else ValueError saying so: such a path maps to no bucket, and must not become a host folder."""
    from modelyard.platform.storage.errors import StorageApiError
    from modelyard.platform.storage.names import check_bucket

    try:
        return check_bucket(bucket)
    except StorageApiError as exc:
        raise ValueError(f"/gcs/{bucket}/: {exc.message} (a /gcs/ path names a Cloud Storage bucket).") from None


def pool_strings(job_spec: dict) -> list[str]:
    """Every string of a CustomJobSpec's pools where a /gcs/ path may appear."""
    out: list[str] = []
    for pool in job_spec.get("workerPoolSpecs") or []:
        spec = (pool or {}).get("containerSpec") or (pool or {}).get("pythonPackageSpec") or {}
        for key in ("command", "args", "packageUris"):
            out += [v for v in spec.get(key) or [] if isinstance(v, str)]
        out += [e.get("value", "") for e in spec.get("env") or [] if isinstance(e, dict)
                and isinstance(e.get("value", ""), str)]
    return out


def check_storage(job_spec: dict) -> None:
    """FAILED_PRECONDITION unless every bucket the job names (its gs:// base output directory, its
    gs:// packages, its /gcs/ paths) exists: found now, not when the job ends."""
    buckets: dict[str, str] = {}
    base = (job_spec.get("baseOutputDirectory") or {}).get("outputUriPrefix") or ""
    for uri in [base] + [u for pool in job_spec.get("workerPoolSpecs") or []
                         for u in ((pool or {}).get("pythonPackageSpec") or {}).get("packageUris") or []]:
        m = _GS_URI.match(uri) if isinstance(uri, str) else None
        if m:
            buckets.setdefault(m.group(1), uri)
    for bucket in gcs_buckets(pool_strings(job_spec)):
        buckets.setdefault(bucket, f"/gcs/{bucket}/")
    if not buckets:
        return
    fs = objstore.filesystem("gs")
    fs.invalidate_cache()  # a bucket made a moment ago must be seen
    for bucket, uri in sorted(buckets.items()):
        try:
            found = fs.exists(bucket)
        except Exception as exc:  # no storage reachable: say which and why
            raise ApiError("FAILED_PRECONDITION", f"The Cloud Storage bucket of `{uri}` cannot be reached: "
                           f"{type(exc).__name__}: {exc}") from None
        if not found:
            raise ApiError("FAILED_PRECONDITION", f"The Cloud Storage bucket of `{uri}` does not exist: "
                           f"create gs://{bucket} first.")


# ---- run time (the job's child process) --------------------------------------------------------
def vertex_env(project: str, job_id: str, dirs: dict[str, str]) -> dict[str, str]:
    """The variables Vertex sets in every training container (but the cluster ones, per replica)."""
    env = {"CLOUD_ML_PROJECT_ID": project, "CLOUD_ML_JOB_ID": job_id, **dirs}
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        env["STORAGE_EMULATOR_HOST"] = os.environ["STORAGE_EMULATOR_HOST"]
    return env


def experiment_env(job_spec: dict) -> dict[str, str]:
    """What Vertex sets in a job's containers for its experiment (``jobSpec.experiment`` / ``experimentRun``,
    full resource names): the SDK's experiment tracker reads them, so ``aiplatform.log_metrics`` in the job
    writes into that run."""
    names = {"AIP_EXPERIMENT_NAME": job_spec.get("experiment"), "AIP_EXPERIMENT_RUN_NAME": job_spec.get("experimentRun")}
    return {k: v for k, v in names.items() if v}


class PythonEnv:
    """The job's own virtual environment under ``work_dir``."""

    def __init__(self, work_dir: Path) -> None:
        self.root = work_dir / "venv"
        self.userbase = work_dir / "userbase"
        self.python = str(self.root / "bin" / "python")

    def create(self) -> None:
        if not Path(self.python).exists():  # `python -m venv --system-site-packages --without-pip`, in this process
            import venv

            venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=os.name != "nt").create(str(self.root))
        purelib = self.purelib
        # The platform's own site directories (its venv's, when it runs in one), .pth files and all.
        parents = [p for p in [*site.getsitepackages(), sysconfig.get_paths()["purelib"]] if os.path.isdir(p)]
        (purelib / "_modelyard_platform_site.pth").write_text(
            f"import site; list(map(site.addsitedir, {sorted(set(parents))!r}))\n")
        # google-cloud-aiplatform's defaults in a job: the platform's API (sdk_defaults), loaded on import.
        shutil.copyfile(Path(__file__).with_name("sdk_defaults.py"), purelib / "_modelyard_sdk_defaults.py")
        (purelib / "_modelyard_sdk_defaults.pth").write_text("import _modelyard_sdk_defaults\n")
        self.write_pip()
        # venv copies its activate scripts with their templates' modes (0644), past the platform's umask:
        # the job's files are its user's alone, as the rest of the state directory.
        for root, _dirs, files in os.walk(self.root):
            for name in files:
                path = os.path.join(root, name)
                if not os.path.islink(path):
                    os.chmod(path, os.stat(path).st_mode & 0o700)

    def write_pip(self) -> None:
        """The venv's ``pip``, ``pip3`` and ``pip3.X``: pip of the platform's interpreter installing into this
        venv, an install whose packages conflict with the platform's making the venv one of the job's own
        first (job_packages.job_pip: the rule). Written again after each pip run (an upgrade of pip, the
        SDK's first step in a custom image, writes pip's own scripts over them)."""
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parents[3])!r}); "
                "from modelyard.platform.jobs.job_packages import job_pip; sys.exit(job_pip())")
        for name in ("pip", "pip3", f"pip{sys.version_info[0]}.{sys.version_info[1]}"):
            tool = self.root / "bin" / name
            tool.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(code)} '
                            f'{shlex.quote(str(self.root))} "$@"\n')
            tool.chmod(0o700)

    def env(self) -> dict[str, str]:
        return {"VIRTUAL_ENV": str(self.root), "PYTHONUSERBASE": str(self.userbase),
                "PATH": str(self.root / "bin") + os.pathsep + os.environ.get("PATH", "")}

    def install(self, files: list[str]) -> None:
        """pip-install the packages with their dependencies; JobFailed(INVALID_ARGUMENT) with pip's words.

        When the packages declare their requirements in their metadata (as the SDK's staged script
        package does), those are installed once per requirement set into a shared environment under
        the jobs' directory (``.python-deps/<hash>``) that this venv then sees, and the packages
        themselves go in without dependencies: the next job with the same requirements installs none."""
        if not files:
            return
        declared = [declared_requirements(f) for f in files]
        if all(r is not None for r in declared):
            wanted = sorted({r for reqs in declared for r in reqs})
            if wanted:
                deps = _shared_deps(self.root.parent.parent / ".python-deps", wanted)
                (self.purelib / "_modelyard_deps.pth").write_text(str(deps.purelib) + "\n")
            self._pip(files, "--no-deps")
        else:  # requirements known only to the build: pip resolves them
            self._pip(files)

    @property
    def purelib(self) -> Path:
        return self.root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"

    def _pip(self, items: list[str], *flags: str) -> None:
        from modelyard.platform.jobs.job_runner import JobFailed

        done = subprocess.run([self.python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                               "--no-build-isolation", *flags, *items], capture_output=True, text=True,
                              env={**os.environ, **self.env()})
        if done.returncode != 0:
            raise JobFailed(f"python_package_spec: pip could not install {', '.join(items)} (with their "
                            f"requirements):\n{done.stderr[-1500:]}", "INVALID_ARGUMENT")


def _shared_deps(cache: Path, requirements: list[str]) -> PythonEnv:
    """The environment holding ``requirements`` (over the platform's interpreter), made once per set;
    concurrent jobs wait for the one making it."""
    import fcntl
    import hashlib
    import shutil

    key = hashlib.sha256(json.dumps([sys.executable, requirements]).encode()).hexdigest()[:20]
    cache.mkdir(parents=True, exist_ok=True)
    env = PythonEnv(cache / key)
    with open(cache / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (cache / key / "ready").exists():
            shutil.rmtree(cache / key, ignore_errors=True)
            env.create()
            env._pip(requirements)
            (cache / key / "ready").write_text("\n".join(requirements) + "\n")
    return env


def declared_requirements(path: str) -> list[str] | None:
    """The requirements a wheel or sdist declares (``Requires-Dist``; an sdist's ``*.egg-info/requires.txt``),
    extras left out; None when they cannot be told without building it (then pip resolves them)."""
    import tarfile
    import zipfile
    from email.parser import Parser

    def unconditional(lines: list[str]) -> list[str] | None:
        out = []
        for line in lines:
            line = line.strip()
            if line.startswith("[:"):  # an environment-marker section: leave it to pip
                return None
            if line.startswith("["):  # the extras: not asked for
                break
            if line and not line.startswith("#"):
                out.append(line)
        return out

    try:
        if path.endswith(".whl"):
            with zipfile.ZipFile(path) as z:
                name = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
                meta = Parser().parsestr(z.read(name).decode())
            return [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r.replace("extra==", "extra ==")]
        if path.endswith((".tar.gz", ".tgz")):
            with tarfile.open(path) as t:
                members = {m.name: m for m in t.getmembers() if m.isfile()}
                requires = [n for n in members if n.count("/") == 2 and n.endswith(".egg-info/requires.txt")]
                if requires:
                    return unconditional(t.extractfile(members[requires[0]]).read().decode().splitlines())
                egg_info = [n for n in members if n.count("/") == 2 and n.endswith(".egg-info/PKG-INFO")]
                if egg_info:  # setuptools wrote the egg-info, and no requires.txt: no requirements
                    return []
                pkg_info = [n for n in members if n.count("/") == 1 and n.endswith("/PKG-INFO")]
                if not pkg_info:
                    return None
                meta = Parser().parsestr(t.extractfile(members[pkg_info[0]]).read().decode())
                # Metadata 2.2+ says which fields the build decides; before it, an sdist's fields may be empty.
                if meta.get("Metadata-Version", "1.0") < "2.2" or "requires-dist" in \
                        [d.lower() for d in meta.get_all("Dynamic") or []]:
                    return None
                return [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    except (OSError, StopIteration, KeyError, UnicodeDecodeError, tarfile.TarError, zipfile.BadZipFile):
        return None
    return None


class GcsMount:
    """/gcs/<bucket>/<path> of a job: the platform's own file of the object when it serves the bucket
    (``storage_root``), else mirrored under ``work_dir/gcs`` (staged in, rewritten, written back)."""

    def __init__(self, work_dir: Path, storage_root: str | None = None) -> None:
        self.root = work_dir / "gcs"
        self.storage_root = Path(storage_root) if storage_root else None
        self._before: dict[str, tuple[int, int]] = {}

    def _served(self, bucket: str) -> bool:
        return self.storage_root is not None and (self.storage_root / bucket).is_dir()

    def rewrite(self, value: str) -> str:
        return _GCS_PATH.sub(self._local, value)

    def _local(self, m: re.Match) -> str:
        from modelyard.platform.jobs.job_runner import JobFailed
        from modelyard.platform.storage import StorageApiError, local_file

        bucket, rest = m.group(1), m.group(2) or ""
        try:
            gcs_bucket(bucket)
        except ValueError as exc:  # a job made before this was checked at create, or a path known only now
            raise JobFailed(str(exc), "INVALID_ARGUMENT") from None
        if not self._served(bucket):
            return f"{self.root}/{bucket}{rest}"
        if not rest.strip("/"):
            return f"{self.storage_root / bucket}{rest}"
        try:
            path = local_file(f"/gcs/{bucket}{rest.rstrip('/')}", self.storage_root)
        except StorageApiError as exc:
            raise JobFailed(f"/gcs/{bucket}{rest}: {exc}", "INVALID_ARGUMENT") from None
        return str(path) + ("/" if rest.endswith("/") else "")

    def stage_in(self, strings: list[str]) -> None:
        """Copy every object or prefix a /gcs/ path names from storage; remember what was there."""
        for s in strings:  # a bad bucket name fails the job saying why (_local), before any folder is made
            _GCS_PATH.sub(self._local, s)
        refs = sorted({(m.group(1), (m.group(2) or "/").lstrip("/")) for s in strings for m in _GCS_PATH.finditer(s)
                       if not self._served(m.group(1))})
        if not refs:
            return
        fs = objstore.filesystem("gs")
        # The filesystem object is shared and caches listings: objects written since by other clients
        # (the SDK, another job) must be seen at a job's start.
        fs.invalidate_cache()
        for bucket, key in refs:
            local = self.root / bucket / key
            (self.root / bucket).mkdir(parents=True, exist_ok=True)
            uri = f"{bucket}/{key}".rstrip("/")
            try:
                if key and fs.isfile(uri):
                    local.parent.mkdir(parents=True, exist_ok=True)
                    fs.get_file(uri, str(local))
                elif fs.isdir(uri):
                    local.mkdir(parents=True, exist_ok=True)
                    fs.get(uri + "/", str(local) + "/", recursive=True)
                else:  # not there yet: the job may write it
                    (local if key.endswith("/") or not key else local.parent).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise objstore.StorageError("FAILED_PRECONDITION", f"/gcs/{bucket}/{key} could not be read: {exc}")
        self._before = self._snapshot()

    def publish(self) -> int:
        """Write every file created or changed under the mirror back to its bucket; how many."""
        if not self.root.is_dir():
            return 0
        changed = [rel for rel, sig in self._snapshot().items() if self._before.get(rel) != sig]
        if not changed:
            return 0
        fs = objstore.filesystem("gs")
        for rel in changed:
            fs.put_file(str(self.root / rel), rel)
        return len(changed)

    def _snapshot(self) -> dict[str, tuple[int, int]]:
        out = {}
        for path in self.root.rglob("*"):
            if path.is_file():
                st = path.stat()
                out[str(path.relative_to(self.root))] = (st.st_size, st.st_mtime_ns)
        return out
