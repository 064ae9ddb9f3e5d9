"""Helpers for tuning tests: write a study file, run `modelyard tune` as a real process, read
the study back from its database."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from modelyard.ports import free_port

TRIALS = Path(__file__).parent / "trials"
ENV = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
MODELYARD = [sys.executable, "-m", "modelyard"]


def write_study(directory: Path, name: str, parameters: list, script: str | list, metric: str = "score",
                goal: str = "MAXIMIZE", **top) -> Path:
    """A study file in ``directory`` whose trial runs ``script`` (a file under tests/tuning/trials)."""
    command = [sys.executable, str(TRIALS / script)] if isinstance(script, str) else script
    spec = {"metrics": [{"metric_id": metric, "goal": goal}], "parameters": parameters}
    spec.update(top.pop("study_spec", {}))
    trial = {"command": command}
    trial.update(top.pop("trial", {}))
    body = {"display_name": name, "study_spec": spec, "trial": trial, **top}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def start(args: list[str], cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(MODELYARD + args, env=ENV, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def run(args: list[str], timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m modelyard ARGS`` (stderr in its stdout), warm when it can be (tests/warm_process.py);
    its process group is killed whatever happens."""
    from tests.warm_process import run_python

    return run_python(MODELYARD + args, ENV, timeout, cwd=cwd, stop=kill_group, merge_stderr=True)


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def trials(study_file: Path):
    """The study's trials, read from its database with Optuna."""
    from modelyard.tuning import spec
    from modelyard.tuning.study import load_study

    return load_study(spec.load(study_file), create=False).get_trials(deepcopy=False)


def best(study_file: Path):
    from modelyard.tuning import spec
    from modelyard.tuning.report import best_trials

    return best_trials(spec.load(study_file), trials(study_file))[0]


# --------------------------------------------------------------------------- a real PostgreSQL
def _postgres_bin() -> Path | None:
    import glob
    import shutil

    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(directory) / "postgres").is_file():
            return Path(directory)
    found = shutil.which("postgres")
    return Path(found).parent if found else None


@pytest.fixture(scope="session")
def postgres_url():
    """A PostgreSQL server of our own on a free loopback port, stopped after the session."""
    import shutil
    import tempfile
    import time

    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.fail("PostgreSQL server binaries not found; install them with `apt-get install postgresql` "
                    "(this test starts a real server)")
    try:
        import psycopg
    except ImportError:
        pytest.fail("psycopg is missing: pip install -e '.[test]' (psycopg[binary])")
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="modelyard-pg-"))
    if os.geteuid() == 0:  # postgres refuses to run as root
        import pwd

        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("running as root and there is no `postgres` user to run the server as; "
                        "`apt-get install postgresql` creates it")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data = root / "data"
    init = subprocess.run(as_user + [str(bin_dir / "initdb"), "-D", str(data), "-U", "tune", "--auth=trust",
                                     "-E", "UTF8", "--no-sync"], capture_output=True, text=True)
    if init.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"initdb failed: {init.stderr[-2000:]}")
    port = free_port()
    server = subprocess.Popen(as_user + [str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(root),
                                         "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
                              stdout=subprocess.DEVNULL, stderr=open(root / "server.log", "wb"), start_new_session=True)
    url = f"postgresql://tune@127.0.0.1:{port}/postgres"
    try:
        deadline = time.time() + 30
        while True:
            try:
                psycopg.connect(f"host=127.0.0.1 port={port} user=tune dbname=postgres", connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if server.poll() is not None or time.time() > deadline:
                    pytest.fail(f"PostgreSQL did not start: {(root / 'server.log').read_text()[-2000:]}")
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            kill_group(server)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _hypertune_installed():
    """Most trial scripts here report through cloudml-hypertune, as Vertex AI code does."""
    try:
        import hypertune  # noqa: F401
    except ImportError:
        pytest.fail("cloudml-hypertune is missing: pip install -e '.[test]'")
