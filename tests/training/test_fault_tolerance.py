"""Must-show 4: a worker killed mid-training; with restarts the job resumes, without it fails fast.
And no hang when a peer on another host hangs: the collective timeout ends the wait."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from .conftest import ENV, MODELYARD, Launched, stop_launcher, write_config

COLLECTIVE_TIMEOUT = 600  # far longer than the test may run: only the supervisor can end it in time


def _launch(config):
    """``modelyard launch --workers 2`` forked warm (conftest.Launched), its output read as it comes."""
    return Launched(["launch", "--workers", "2", "--", sys.executable, "-m", "modelyard", "train",
                     str(config)], config.with_suffix(".log"))


def _launch_piped(config, *extra) -> subprocess.Popen:
    """The same launch as a fresh process whose output comes through a pipe (``proc.stdout``)."""
    cmd = MODELYARD + ["launch", "--workers", "2", *extra, "--", sys.executable, "-m", "modelyard", "train", str(config)]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _kill_after(job, task, epoch_line, lines, sig=signal.SIGKILL):
    """Read output (``job``: lines) until ``task`` prints ``epoch_line``, then send ``sig`` to that task's process."""
    pids = {}
    for line in job:
        lines.append(line)
        found = re.match(r"(\S+) \| \[modelyard\] started pid (\d+)", line)
        if found:
            pids[found.group(1)] = int(found.group(2))
        if line.startswith(f"{task} | {epoch_line}"):
            os.kill(pids[task], sig)
            return time.monotonic()
    raise AssertionError("job ended before the kill point:\n" + "".join(lines[-40:]))


def _config(tmp, name, epochs, steps_per_epoch):
    return write_config(tmp, name, strategy={"name": "multi_worker_mirrored", "collective_timeout": COLLECTIVE_TIMEOUT},
                        global_batch_size=64, epochs=epochs, steps_per_epoch=steps_per_epoch, seed=1)


@pytest.mark.timeout(300)
def test_killed_worker_resumes_from_checkpoint_with_max_restarts(tmp):
    # Killed once epoch 2 is checkpointed, with two epochs of 40 steps left (the kill is sent as the line is
    # read; how many steps an epoch has changes nothing the test asserts). The launch's output comes
    # through a pipe here: read from a warm launch's log file, the kill point was once read only after
    # the job had ended (not explained yet), and this is the test the restart path rests on.
    config = _config(tmp, "restart", epochs=4, steps_per_epoch=40)
    proc = _launch_piped(config, "--max-restarts", "1")
    lines: list[str] = []
    try:
        _kill_after(proc.stdout, "worker:1", "epoch 2/4", lines)
        lines += proc.stdout.readlines()
        assert proc.wait(timeout=240) == 0, "".join(lines[-40:])
    finally:
        stop_launcher(proc)
    out = "".join(lines)
    assert "task worker:1 exited with code -9 (killed by SIGKILL)" in out
    assert "restarting the job (restart 1 of 1)" in out
    assert "resuming from checkpoint" in out
    after_restart = out.split("restarting the job")[1]
    assert "worker:0 | epoch 3/4" in after_restart and "worker:0 | epoch 4/4" in after_restart
    assert "epoch 1/4" not in after_restart  # epochs 1-2 were not trained again
    metrics = json.loads((tmp / "job-restart" / "metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2, 3, 4]
    assert metrics["resumed"] is True and metrics["completed"] is True


@pytest.mark.timeout(240)
def test_killed_worker_without_restarts_fails_fast_naming_it(tmp):
    # Short epochs, many of them: killed mid-training wherever the kill lands after epoch 1.
    config = _config(tmp, "nofail", epochs=50, steps_per_epoch=20)
    job = _launch(config)
    lines: list[str] = []
    try:
        killed_at = _kill_after(job, "worker:1", "epoch 1/50", lines)
        lines += list(job)
        code = job.proc.wait(timeout=200)
        stopped_after = time.monotonic() - killed_at
    finally:
        job.stop()
    out = "".join(lines)
    assert code == 1
    assert "task worker:1 exited with code -9 (killed by SIGKILL)" in out
    assert "rerun with --max-restarts" in out
    assert stopped_after < 30  # the supervisor ended it, long before the 600 s collective timeout could


STUCK_INPUT_MODEL = textwrap.dedent('''
    """Digits MLP whose input pipeline hangs on worker:1 after 60 batches: the process stays
    alive and keeps TensorFlow's heartbeats going, it just never reaches the next collective."""
    import os
    import time

    import tensorflow as tf

    from modelyard.datasets import load_digits_28
    from modelyard.training.demo import build_model  # noqa: F401

    def make_dataset(input_context, split):
        x, y = load_digits_28("train" if split == "train" else "test")
        batch = input_context.get_per_replica_batch_size(64)
        stuck = os.environ.get("MODELYARD_TASK") == "worker:1" and split == "train"

        def maybe_hang(index):
            if stuck and index >= 60:
                time.sleep(3600)
            return index

        ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(input_context.num_input_pipelines,
                                                               input_context.input_pipeline_id)
        ds = ds.repeat().batch(batch, drop_remainder=True).enumerate()
        return ds.map(lambda i, xy: (tf.numpy_function(maybe_hang, [i], tf.int64), xy)).map(lambda i, xy: xy)
''')


@pytest.mark.timeout(180)
def test_stuck_peer_on_another_host_times_out_with_a_clear_message(tmp):
    """Two hosts simulated by two launchers (--cluster-spec, --task each). worker:1 is alive but
    stuck, so neither its launcher nor TensorFlow's health checks end worker:0's wait: only the
    collective timeout can, and it must say why."""
    from modelyard.ports import free_ports

    timeout = 8
    spec = tmp / "cluster.json"
    spec.write_text(json.dumps({"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}))
    model = tmp / "stuck.py"
    model.write_text(STUCK_INPUT_MODEL)
    config = write_config(tmp, "hosts", model=str(model), global_batch_size=64, epochs=50, steps_per_epoch=20,
                          validation_steps=2, strategy={"name": "multi_worker_mirrored", "collective_timeout": timeout})
    train = ["--", sys.executable, "-m", "modelyard", "train", str(config)]
    hosts = [Launched(["launch", "--cluster-spec", str(spec), "--task", f"worker:{i}", *train], tmp / f"host{i}.log")
             for i in range(2)]
    try:
        lines: list[str] = []
        for line in hosts[0]:
            lines.append(line)
            if line.startswith("worker:0 | epoch 3/50"):
                break  # 60 batches done: worker:1 is stuck from here on
        stuck_at = time.monotonic()
        out = "".join(lines) + "".join(hosts[0])  # to its end (the collective timeout's, or pytest's)
        waited = time.monotonic() - stuck_at
    finally:
        for host in hosts:
            host.stop()  # worker:1 is still stuck: its launcher must stop it
    assert hosts[0].proc.returncode == 1, out[-3000:]
    assert "worker:0 | epoch 3/50" in out and "epoch 4/50" not in out
    assert "worker:1 |" not in out  # this host ran only its own task
    assert re.search(rf"no training step completed for \d+ s \(strategy.collective_timeout {timeout} s\): "
                     "a collective could not complete", out), out[-3000:]
    assert "task worker:0 exited with code 2" in out  # modelyard train: error -> exit 2
    assert waited < timeout + 40
