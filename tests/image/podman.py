"""Podman for the image tests: the images built once (scripts/image --if-changed), containers started and
removed for sure, the host's ulimits (build/image/containers.conf) in every podman call's environment."""
from __future__ import annotations

import fcntl
import os
import subprocess
import time
import uuid
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
SERVING = "localhost/modelyard-serving:latest"
SERVING_FULL = "localhost/modelyard-serving:full"
PLATFORM = "localhost/modelyard-platform:latest"
CONF = REPO / "build" / "image" / "containers.conf"


def env() -> dict[str, str]:
    """This process's environment with CONTAINERS_CONF when scripts/image wrote one (low host ulimits)."""
    extra = {"CONTAINERS_CONF": str(CONF)} if CONF.is_file() else {}
    return {**os.environ, **extra}


def ensure_images() -> str:
    """Build the images unless they carry this source's key (CI builds them before the suite; a worker
    waits on the other's build through the lock). Returns the source key scripts/image saw."""
    lock_path = REPO / "build" / "image.lock"
    lock_path.parent.mkdir(exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run([str(REPO / "scripts" / "image"), "--if-changed"], cwd=REPO, capture_output=True,
                              text=True, timeout=1800)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # Its last line: "... (source KEY)"; the source may change meanwhile in a working tree others edit.
    return done.stdout.strip().splitlines()[-1].rsplit("(source ", 1)[1].rstrip(")")


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], env=env(), capture_output=True, text=True, timeout=timeout)
    assert not check or done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    return done


def name(prefix: str) -> str:
    """A container name no other test or run uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def remove(*containers: str) -> None:
    for container in containers:
        podman("rm", "--force", "--time", "0", container, check=False)


def logs(container: str) -> str:
    done = podman("logs", container, check=False)
    return done.stdout[-4000:] + done.stderr[-4000:]


def running(container: str) -> bool:
    done = podman("inspect", "--format", "{{.State.Running}}", container, check=False)
    return done.stdout.strip() == "true"


def wait_available(base: str, model: str, container: str, timeout: float = 300, version: str | None = None) -> dict:
    """Wait until ``model`` (``version`` if given) is AVAILABLE at the REST ``base``; the container's log on failure."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            answer = requests.get(f"{base}/v1/models/{model}", timeout=2)
            if answer.ok:
                states = {s["version"]: s["state"] for s in answer.json()["model_version_status"]}
                if (states.get(version) if version else next(iter(states.values()), None)) == "AVAILABLE":
                    return states
        except requests.RequestException:
            pass
        assert running(container), logs(container)
        time.sleep(0.2)
    raise AssertionError(f"{model} not AVAILABLE within {timeout}s:\n{logs(container)}")
