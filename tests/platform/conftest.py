"""Shared, session-scoped parts of the platform tests: two tiny SavedModels and one real ``modelyard
platform`` process (restartable) whose replicas are real ``modelyard serve`` processes; it serves its
own Cloud Storage over the root of ``gcs_emulator`` (tests/conftest.py), the session's storage.
Every process started here is stopped at the end, replicas included."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from modelyard.ports import PORT_TAKEN_EXIT, free_port

REPO_SRC = Path(__file__).resolve().parents[2] / "src"
PARENT = "projects/local/locations/us-central1"
STAGING_BUCKET = "modelyard-staging"
TOKEN = "s3cret-token"  # the guarded platform's --auth-token
# Quick to react, so the scaling test stays short (the defaults are 4 in flight, 3 s up, 60 s cool-down).
AUTOSCALE_FLAGS = ["--autoscale-target-in-flight", "1.5", "--autoscale-up-seconds", "1",
                   "--autoscale-cooldown-seconds", "4"]


def _env(**extra: str) -> dict:
    env = dict(os.environ)
    # A platform serves its own Cloud Storage unless a test names one (the session's gcs_emulator sets this
    # process's STORAGE_EMULATOR_HOST for its clients; a platform must not pick it up by the order tests run in).
    env.pop("STORAGE_EMULATOR_HOST", None)
    env["PYTHONPATH"] = str(REPO_SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def require(module: str, how: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as exc:
        pytest.fail(f"{module} is needed by the platform tests ({exc}): {how}", pytrace=False)


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}: {log.read_text()[-3000:] if log else ''}")
        try:
            if requests.get(url, timeout=1).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def build_tiny_models(out: Path) -> dict:
    """The platform tests' tiny models (build_models.py) written under ``out``, with what each must answer.

    The ``tiny_models`` fixture (tests/conftest.py) builds them once per session for every folder."""
    subprocess.run([sys.executable, str(Path(__file__).with_name("build_models.py")), str(out)],
                   env=_env(), check=True, capture_output=True, timeout=300)
    data = json.loads((out / "expected.json").read_text())
    data["root"] = str(out)
    return data


def live_processes():
    """(pid, command line, working directory) of every process of this machine that is not a zombie."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            cwd = os.readlink(f"/proc/{entry}/cwd").encode()
            with open(f"/proc/{entry}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if not zombie:
            yield int(entry), cmdline, cwd


def _unclaimed_spare(cmdline: bytes) -> bool:
    """A warm spare's replica directory is named spare-*; a replica that took it leaves a 'claimed' file."""
    args = cmdline.split(b"\0")
    if b"--model_base_path" not in args:
        return False
    rdir = Path(os.fsdecode(args[args.index(b"--model_base_path") + 1])).parent
    return rdir.name.startswith("spare-") and not (rdir / "claimed").exists()


class PlatformProcess:
    """One ``modelyard platform`` process over a store that outlives it (restart, kill -9)."""

    def __init__(self, workdir: Path, env: dict, extra_args: list[str]) -> None:
        self.workdir = workdir
        self.env = env
        self.extra_args = extra_args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Its Cloud Storage (unless STORAGE_EMULATOR_HOST names another): a port of its own, known to the tests.
        self.storage_port = free_port()
        self.storage_url = f"http://127.0.0.1:{self.storage_port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        for attempt in range(3):
            self.starts += 1
            log = self.workdir / f"platform-{self.starts}.log"
            store = [] if "--store" in self.extra_args else ["--store", str(self.workdir / "platform.db")]
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "modelyard.platform", "--port", str(self.port), *store,
                 "--state-dir", str(self.workdir / "state"), "--storage-port", str(self.storage_port),
                 *self.extra_args],
                env=self.env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=self.workdir)
            try:
                wait_http(self.url + "/healthz", 60, self.proc, log)
                return
            except RuntimeError:
                # Its port or its storage's was taken between our pick and its bind (an outgoing connection
                # of any process on the machine can take it): it exits PORT_TAKEN_EXIT; pick again.
                if self.proc.poll() != PORT_TAKEN_EXIT or attempt == 2:
                    raise
                self.port, self.storage_port = free_port(), free_port()
                self.url = f"http://127.0.0.1:{self.port}"
                self.storage_url = f"http://127.0.0.1:{self.storage_port}"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)
        self.proc = None

    def api(self, path: str) -> str:
        return f"{self.url}/v1/{PARENT}/{path}"

    def replica_pids(self, spares: bool = False) -> list[int]:
        """Every live process started for this platform's replicas (found by their state dir); its warm
        spare (a `modelyard serve` no replica has claimed yet) only with ``spares``."""
        marker = str(self.workdir / "state").encode()
        return [pid for pid, cmdline, _cwd in live_processes()
                if marker in cmdline and b"serve" in cmdline.split(b"\0") and (spares or not _unclaimed_spare(cmdline))]

    def cleanup(self) -> None:
        self.stop()
        for pid in self.replica_pids(spares=True):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start_platform(tmp_path_factory, name: str, env: dict, args: list[str]) -> PlatformProcess:
    require("aiohttp", "pip install -e . (aiohttp is a runtime dependency)")
    require("sqlalchemy", "pip install -e . (SQLAlchemy is a runtime dependency)")
    p = PlatformProcess(tmp_path_factory.mktemp(name), env, args)
    p.start()
    return p


@pytest.fixture(scope="session")
def platform(tmp_path_factory, tiny_models, gcs_emulator):
    # It serves its own Cloud Storage over the session storage's root: what a test uploads through
    # gcs_emulator's client, the platform, its replicas and jobs read through the platform's own port.
    p = start_platform(tmp_path_factory, "platform", _env(),
                       ["--artifact-root", tiny_models["root"], "--artifact-root", f"gs://{STAGING_BUCKET}",
                        # the textbook notebook's bucket (test_textbook_vertex.py runs its cells as written)
                        "--artifact-root", "gs://my_bucket",
                        "--storage-root", str(gcs_emulator["root"]), *AUTOSCALE_FLAGS])
    try:
        yield p
    finally:
        p.cleanup()


# A second platform: --auth-token (with --auth-predict), one artifact root with an empty and a corrupt model directory.
@pytest.fixture(scope="session")
def guarded(tmp_path_factory, tiny_models):
    root = tmp_path_factory.mktemp("root")
    (root / "empty").mkdir()
    (root / "corrupt").mkdir()
    (root / "corrupt" / "saved_model.pb").write_bytes(b"not a SavedModel")
    p = start_platform(tmp_path_factory, "guarded", _env(), ["--artifact-root", str(root),
                                                              "--artifact-root", tiny_models["models"]["tiny1"]["path"],
                                                              "--auth-token", TOKEN, "--auth-predict"])
    try:
        yield p, root
    finally:
        p.cleanup()


# The session's one platform on the Ray cluster, for every module testing the Ray engine (test_ray_engine,
# test_ray_faults, test_ray_jobs): a platform start and its Ray driver's cost ~5-10 s each, once per module
# before. It serves its Cloud Storage over the session storage's root (a job's script package and models).
RAY_MODELS_BUCKET = "ray-models"  # test_ray_engine uploads a model here through the platform's storage


@pytest.fixture(scope="session")
def ray_platform(ray_cluster, tmp_path_factory, tiny_models, gcs_emulator):
    """``modelyard platform --engine ray`` whose replicas and job replicas are actors on the session's
    cluster. A module that kills or stops it starts it again (``PlatformProcess.start``) on the same state;
    each module ends the replica actors it left (``ray_platform.cleanup_actors``)."""
    from tests.platform.ray_platform import cleanup_actors  # it imports this conftest

    p = start_platform(tmp_path_factory, "rayplatform", _env(),
                       ["--engine", "ray", "--ray-address", ray_cluster, "--storage-root", str(gcs_emulator["root"]),
                        "--artifact-root", tiny_models["root"], "--artifact-root", f"gs://{STAGING_BUCKET}",
                        "--artifact-root", f"gs://{RAY_MODELS_BUCKET}"])
    try:
        yield p
    finally:
        p.cleanup()
        cleanup_actors(ray_cluster)
