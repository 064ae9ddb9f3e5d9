"""The launcher with plain Python commands (no TensorFlow): prefixes, fail-fast, restarts, signals."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from modelyard.training.cluster import Task
from modelyard.training.launcher import Supervisor

from .conftest import ENV, MODELYARD, run, stop_launcher

pytestmark = pytest.mark.timeout(120)

PY = sys.executable


def test_output_is_prefixed_and_tf_config_is_set():
    code = "import json,os; c=json.loads(os.environ['TF_CONFIG']); print('hello', c['task']['type'], c['task']['index'], len(c['cluster']['worker']))"
    result = run(["launch", "--workers", "2", "--", PY, "-c", code])
    assert result.returncode == 0, result.stderr
    assert "worker:0 | hello worker 0 2" in result.stdout
    assert "worker:1 | hello worker 1 2" in result.stdout
    assert "job finished" in result.stdout


def test_a_dead_task_stops_the_job_and_is_named():
    code = ("import os,sys,time\n"
            "if os.environ['MODELYARD_TASK']=='worker:1':\n"
            "    print('about to fail'); sys.exit(3)\n"
            "time.sleep(300)")
    start = time.monotonic()
    result = run(["launch", "--workers", "3", "--", PY, "-c", code], timeout=100)
    assert result.returncode == 1
    assert "task worker:1 exited with code 3" in result.stderr
    assert "about to fail" in result.stderr  # its last lines are quoted
    assert "--max-restarts" in result.stderr
    assert time.monotonic() - start < 100  # the sleeping peers were stopped, not waited for


@pytest.mark.e2e
def test_a_killed_task_is_named_over_the_peers_that_failed_after_it():
    """Both ended before the supervisor looked (as a warm job's do: their exits come in one message of
    the fork server): the one killed by a signal is the cause, the one that exited 1 its peer."""
    code = ("import os,signal\n"
            "if os.environ['MODELYARD_TASK']=='worker:1':\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "raise SystemExit(1)")
    supervisor = Supervisor({"worker": ["localhost:1", "localhost:2"]}, [Task("worker", 0), Task("worker", 1)],
                            [PY, "-c", code], out=io.StringIO())
    supervisor.start()
    for running in supervisor.running:
        running.process.wait(timeout=60)
    ok, why = supervisor.wait()
    assert not ok
    assert why.startswith("task worker:1 exited with code -9 (killed by SIGKILL) "
                          "(worker:0 also exited, with code 1); its last lines:"), why


def test_max_restarts_restarts_the_cluster(tmp_path):
    marker = tmp_path / "failed-once"
    code = ("import os,sys,pathlib\n"
            f"m=pathlib.Path({str(marker)!r})\n"
            "if os.environ['MODELYARD_TASK']=='worker:0' and not m.exists():\n"
            "    m.touch(); sys.exit(5)\n"
            "print('attempt', os.environ['MODELYARD_ATTEMPT'])")
    result = run(["launch", "--workers", "2", "--max-restarts", "1", "--", PY, "-c", code])
    assert result.returncode == 0, result.stderr
    assert "restarting the job (restart 1 of 1)" in result.stdout
    assert "worker:1 | attempt 1" in result.stdout


def test_a_port_taken_before_tf_listens_starts_the_job_again_on_fresh_ports(tmp_path):
    """TensorFlow's gRPC server could not listen (the port picked free was taken meanwhile): the job starts
    again on other ports without using one of --max-restarts; any other failure still ends it."""
    marker = tmp_path / "taken-once"
    code = ("import json,os,sys,pathlib\n"
            f"m=pathlib.Path({str(marker)!r})\n"
            "print('port', json.loads(os.environ['TF_CONFIG'])['cluster']['worker'][0])\n"
            "if os.environ['MODELYARD_TASK']=='worker:0' and not m.exists():\n"
            "    m.touch(); print('UnknownError: Could not start gRPC server'); sys.exit(1)\n"
            "print('attempt', os.environ['MODELYARD_ATTEMPT'])")
    result = run(["launch", "--workers", "2", "--", PY, "-c", code])
    assert result.returncode == 0, result.stderr
    assert "starting the job again on fresh ports" in result.stdout
    assert "worker:1 | attempt 0" in result.stdout  # not counted as a restart
    ports = [line.split()[-1] for line in result.stdout.splitlines() if line.startswith("worker:0 | port ")]
    assert len(ports) == 2 and ports[0] != ports[1], result.stdout


def test_ps_and_workers_stop_when_the_chief_is_done():
    code = ("import os,time\n"
            "t=os.environ['MODELYARD_TASK']\n"
            "print('up', t)\n"
            "if t=='chief:0': time.sleep(1)\n"
            "else: time.sleep(300)")
    result = run(["launch", "--workers", "2", "--ps", "1", "--", PY, "-c", code], timeout=100)
    assert result.returncode == 0, result.stderr
    assert "chief:0 | up chief:0" in result.stdout and "ps:0 | up ps:0" in result.stdout


def test_interrupt_stops_every_process(tmp_path):
    pids = tmp_path / "pids"
    code = f"import os,time; open({str(pids)!r},'a').write(str(os.getpid())+'\\n'); print('ready', flush=True); time.sleep(300)"
    proc = subprocess.Popen(MODELYARD + ["launch", "--workers", "2", "--", PY, "-c", code], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        ready = 0
        while ready < 2:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            ready += "| ready" in line
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        for pid in map(int, pids.read_text().split()):
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        stop_launcher(proc)


def test_cluster_spec_runs_only_this_hosts_task(tmp_path):
    spec = tmp_path / "cluster.json"
    spec.write_text(json.dumps({"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}))
    code = "import os; print(os.environ['TF_CONFIG'])"
    result = run(["launch", "--cluster-spec", str(spec), "--task", "worker:1", "--", PY, "-c", code])
    assert result.returncode == 0, result.stderr
    assert "worker:1 |" in result.stdout and "worker:0 |" not in result.stdout
    printed = run(["launch", "--cluster-spec", str(spec), "--print-tf-config"])
    assert printed.returncode == 0
    assert printed.stdout.count("export TF_CONFIG=") == 2 and '"index": 1' in printed.stdout


def test_a_parameter_server_hosts_task_serves_until_stopped(tmp_path):
    """On a host running only a ps task (or a parameter-server worker), nothing ends the job but
    the chief elsewhere: the launcher keeps the task running instead of calling the job finished."""
    spec = tmp_path / "cluster.json"
    spec.write_text(json.dumps({"chief": ["127.0.0.1:12340"], "worker": ["127.0.0.1:12341"],
                                "ps": ["127.0.0.1:12342"]}))
    code = "import time; print('serving', flush=True); time.sleep(60)"
    proc = subprocess.Popen(MODELYARD + ["launch", "--cluster-spec", str(spec), "--task", "ps:0", "--", PY, "-c", code],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        time.sleep(4)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert "ps:0 | serving" in out and "job finished" not in out
    finally:
        stop_launcher(proc)


def test_bad_cluster_spec_fails_before_anything_starts(tmp_path):
    spec = tmp_path / "cluster.json"
    spec.write_text(json.dumps({"worker": ["127.0.0.1:1", "127.0.0.1:1"]}))
    result = run(["launch", "--cluster-spec", str(spec), "--task", "worker:0", "--", PY, "-c", "print('ran')"])
    assert result.returncode == 2
    assert "used twice" in result.stderr and "started pid" not in result.stdout and "ran" not in result.stdout
    result = run(["launch", "--cluster-spec", str(spec) + ".missing", "--task", "worker:0", "--", PY, "-c", "1"])
    assert result.returncode == 2 and "not found" in result.stderr
    spec.write_text("{not json")
    result = run(["launch", "--cluster-spec", str(spec), "--task", "worker:0", "--", PY, "-c", "1"])
    assert result.returncode == 2 and "not valid JSON" in result.stderr
