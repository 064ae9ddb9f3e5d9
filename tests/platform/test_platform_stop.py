"""Stopping the platform (issue 44): Ctrl-C says what keeps running (its replicas and jobs, on purpose: the next
start adopts them) and how to stop them; `modelyard platform stop` stops the platform with everything it
started. Its own platform: the session's must keep its replicas."""
from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import requests

from modelyard.cli import main
from tests.platform.client import Api
from tests.platform.conftest import PlatformProcess, _env
from tests.platform.jobs_helpers import alive, job_processes, wait_gone, wait_state

PROBE = str(Path(__file__).with_name("job_scripts") / "probe.py")


def _last_line(p: PlatformProcess) -> str:
    return (p.workdir / f"platform-{p.starts}.log").read_text().strip().splitlines()[-1]


def test_ctrl_c_says_what_keeps_running_and_platform_stop_stops_it_all(tmp_path, tiny_models, capsys):
    p = PlatformProcess(tmp_path, _env(), ["--artifact-root", tiny_models["root"], "--no-warm-spare"])
    p.start()
    try:
        client = Api(p.url)
        endpoint = client.create_endpoint()
        client.deploy(endpoint, client.upload(tiny_models["models"]["tiny1"]["path"]))
        job = requests.post(p.api("customJobs"), timeout=10, json={"displayName": "sleeper", "jobSpec": {
            "workerPoolSpecs": [{"replicaCount": "1", "containerSpec": {
                "imageUri": "x", "command": [sys.executable, PROBE], "args": ["--sleep=600"]}}],
            "baseOutputDirectory": {"outputUriPrefix": str(tmp_path / "out")}}}).json()["name"]
        wait_state(p, job, ("JOB_STATE_RUNNING",))
        deadline = time.monotonic() + 60
        while not job_processes(p) and time.monotonic() < deadline:
            time.sleep(0.1)
        replicas, jobs = p.replica_pids(), job_processes(p)
        assert len(replicas) == 1 and jobs

        p.stop(signal.SIGINT)  # Ctrl-C: they keep running, and the last line says so and how to stop them
        assert _last_line(p) == (
            "modelyard platform: stopped; 1 replica and 1 job keep running, adopted by the next "
            "`modelyard platform` on this store; to stop them too, run `modelyard platform stop` while it runs")
        assert all(alive(pid) for pid in replicas + jobs)

        p.start()  # adopts them
        # A cross-site page can POST a form or text/plain without a preflight: the stop refuses it.
        refused = requests.post(p.url + "/modelyard/v1/stop", data="x", timeout=10,
                                headers={"Content-Type": "text/plain"})
        assert refused.status_code == 400 and refused.json()["error"]["status"] == "INVALID_ARGUMENT"
        assert p.proc.poll() is None
        assert main(["platform", "stop", "--port", str(p.port)]) == 0
        assert capsys.readouterr().out.strip() == (
            f"modelyard platform stop: {p.url} stopped 1 replica(s) and cancelled 1 job(s); it exits now")
        assert p.proc.wait(60) == 0
        assert _last_line(p) == "modelyard platform: stopped, with what it started (1 replica, 1 job cancelled)"
        assert wait_gone(p) == [] and not p.replica_pids(spares=True)
        assert not any(alive(pid) for pid in replicas + jobs)
        # Nothing answers now: the command says so, and what it means for anything left.
        assert main(["platform", "stop", "--port", str(p.port)]) == 1
        assert f"no platform answers at {p.url}" in capsys.readouterr().err
    finally:
        p.cleanup()


def test_exit_lines():
    from modelyard.platform.shutdown import exit_line

    assert exit_line(0, 0, everything=False) == "modelyard platform: stopped; nothing it started keeps running"
    assert exit_line(2, 0, everything=False).startswith("modelyard platform: stopped; 2 replicas and 0 jobs keep running")
    assert "3 replicas and its running jobs keep running" in exit_line(3, None, everything=False)
    assert exit_line(2, 3, everything=True) == "modelyard platform: stopped, with what it started (2 replicas, 3 jobs cancelled)"
