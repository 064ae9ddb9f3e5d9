"""Issue 43, finding 15: cancel always works, and jobs are bounded.

One platform for the module whose store and state directory are on a small tmpfs of their own: it runs
under ``unshare -m`` (a mount namespace: the tmpfs is seen by the platform and the processes it starts,
nowhere else), so a job really fills the disk the store writes to. Its jobs run under small limits
(``--job-max-processes``, ``--job-max-memory-bytes``, ``--job-max-file-bytes``).

- A job that fills the disk and keeps writing is cancelled (it was a 500 "database or disk is full"),
  ends CANCELLED, and is deleted (it was "cancel it first").
- A job that exhausts the disk and exits ends FAILED saying the disk was full.
- A job forking past its process limit, one allocating past its memory limit and one writing a file
  past its size limit each end FAILED, naming the limit (all three ran to success before).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import requests

from modelyard.ports import free_port
from tests.platform.conftest import PARENT, _env, live_processes, wait_http

DISK_BYTES = 64 << 20
MAX_PROCESSES, MAX_MEMORY, MAX_FILE = 64, 256 << 20, 4 << 20

# The job's one replica: MODE fill-and-hold | fill-and-exit | fork N | allocate BYTES | write BYTES.
# It writes in its working directory (the job's work dir, on the tmpfs) and touches MARKER (outside it).
SCRIPT = textwrap.dedent("""
    import errno, os, sys, time
    mode, arg, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode.startswith("fill"):
        block, i = b"x" * (1 << 20), 0
        while True:
            try:
                with open(f"fill-{i}", "wb") as f:
                    f.write(block)
                i += 1
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
        open(marker, "w").close()
        if mode == "fill-and-exit":
            sys.exit("the disk is full")
        while True:  # a job that keeps trying to write
            try:
                open(f"fill-{i}", "ab").write(block)
            except OSError:
                pass
            time.sleep(0.05)
    elif mode == "fork":
        children = []
        for _ in range(arg):
            pid = os.fork()
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            children.append(pid)
    elif mode == "allocate":
        data = bytearray(arg)
        for i in range(0, arg, 4096):
            data[i] = 1  # touched: resident
    elif mode == "write":
        with open("big", "wb") as f:
            f.write(b"x" * arg)
""")


def _unshare_ok() -> None:
    r = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True)
    if r.returncode != 0:
        pytest.fail("these tests need a mount namespace with a tmpfs (unshare -m, as root or with user "
                    f"namespaces): {r.stderr.decode()[-300:]}", pytrace=False)


class SmallDiskPlatform:
    """``modelyard platform`` in its own mount namespace, its store and state on a tmpfs of DISK_BYTES."""

    def __init__(self, workdir: Path) -> None:
        self.disk = workdir / "disk"
        self.disk.mkdir()
        self.workdir = workdir
        self.port, self.storage_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "modelyard.platform", "--port", str(self.port), "--store",
                str(self.disk / "platform.db"), "--state-dir", str(self.disk / "state"),
                "--storage-port", str(self.storage_port), "--no-warm-spare",
                "--job-max-processes", str(MAX_PROCESSES), "--job-max-memory-bytes", str(MAX_MEMORY),
                "--job-max-file-bytes", str(MAX_FILE)]
        self.log = workdir / "platform.log"
        mount = f'mount -t tmpfs -o size={DISK_BYTES} tmpfs "$0" && exec "$@"'
        self.proc = subprocess.Popen(["unshare", "-m", "sh", "-c", mount, str(self.disk), *argv], env=_env(),
                                     stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, cwd=workdir)
        wait_http(self.url + "/healthz", 60, self.proc, self.log)

    def api(self, path: str) -> str:
        return f"{self.url}/v1/{PARENT}/{path}"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        marker = str(self.disk).encode()
        for pid, cmdline, cwd in live_processes():
            if marker in cmdline or cwd.startswith(marker):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    _unshare_ok()
    p = SmallDiskPlatform(tmp_path_factory.mktemp("small-disk"))
    try:
        yield p
    finally:
        p.stop()


def _job(p: SmallDiskPlatform, mode: str, arg: int = 0, marker: Path | None = None) -> str:
    pool = {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": 1,
            "containerSpec": {"imageUri": "us-docker.pkg.dev/p/trainer:latest", "command": [sys.executable, "-c", SCRIPT],
                              "args": [mode, str(arg), str(marker or "/dev/null")]}}
    r = requests.post(p.api("customJobs"), json={"displayName": mode, "jobSpec": {"workerPoolSpecs": [pool]}},
                      timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["name"]


def _wait(p: SmallDiskPlatform, name: str, states: tuple[str, ...], timeout: float = 120) -> dict:
    deadline, job = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        job = requests.get(f"{p.url}/v1/{name}", timeout=30).json()
        if job.get("state") in states:
            return job
        time.sleep(0.2)
    raise AssertionError(f"{name} did not reach {states}: {job}\n{p.log.read_text()[-3000:]}")


def _wait_for(path: Path, p: SmallDiskPlatform, name: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared: {requests.get(f'{p.url}/v1/{name}').text}"
        time.sleep(0.1)


def _delete(p: SmallDiskPlatform, name: str) -> None:
    r = requests.delete(f"{p.url}/v1/{name}", timeout=30)
    assert r.status_code == 200, r.text
    assert requests.get(f"{p.url}/v1/{name}", timeout=30).status_code == 404


def test_a_job_that_filled_the_disk_is_cancelled_and_deleted(small, tmp_path):
    marker = tmp_path / "full"
    name = _job(small, "fill-and-hold", marker=marker)
    _wait_for(marker, small, name)  # the tmpfs is full and the job goes on writing
    r = requests.post(f"{small.url}/v1/{name}:cancel", timeout=30)
    assert r.status_code == 200, r.text
    job = _wait(small, name, ("JOB_STATE_CANCELLED", "JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED"))
    assert job["state"] == "JOB_STATE_CANCELLED", job
    _delete(small, name)  # its work dir (the files that filled the disk) goes with it
    assert requests.get(small.api("customJobs"), timeout=30).status_code == 200


def test_a_job_that_exhausts_the_disk_fails_saying_so(small, tmp_path):
    name = _job(small, "fill-and-exit", marker=tmp_path / "full")
    job = _wait(small, name, ("JOB_STATE_CANCELLED", "JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED"))
    assert job["state"] == "JOB_STATE_FAILED" and "the disk was full" in job["error"]["message"], job
    _delete(small, name)


def test_jobs_meet_their_process_memory_and_file_limits(small):
    names = {"processes": _job(small, "fork", 3 * MAX_PROCESSES), "memory": _job(small, "allocate", 2 * MAX_MEMORY),
             "file": _job(small, "write", 2 * MAX_FILE)}
    said = {"processes": f"more than {MAX_PROCESSES} tasks", "memory": f"out of its {MAX_MEMORY} bytes of memory",
            "file": f"limit of {MAX_FILE} bytes"}
    for what, name in names.items():
        job = _wait(small, name, ("JOB_STATE_CANCELLED", "JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED"))
        assert job["state"] == "JOB_STATE_FAILED" and said[what] in job["error"]["message"], (what, job)
        _delete(small, name)
