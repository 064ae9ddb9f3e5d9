"""A tuner that is itself warm (forked by the platform or the test suite from an interpreter that imported
TensorFlow and ran no op) forks its command trials' server from itself instead of starting a Python that
imports TensorFlow again (tuning.warm.ForkServer.fork_here); a trial forked from that server runs."""
from __future__ import annotations

import os
import sys
import textwrap

from tests.warm_process import run_python

TRAIN = "import sys\nimport tensorflow as tf\nprint('trial op', int(tf.constant(3) * 2), sys.argv[1:])\n"

TUNER = textwrap.dedent('''
    import os, sys, time
    import tensorflow  # as in a process forked warm (and so also when the suite starts it cold)
    from pathlib import Path
    from types import SimpleNamespace
    from modelyard.tuning.warm import start_warm

    here = Path.cwd()
    study = SimpleNamespace(function=None, warm_start=True, command=[sys.executable, "train.py"], workdir=here,
                            env={}, job_dir=here / "runs")
    _, server = start_warm(study, [])
    print("server process", type(server.proc).__name__)
    child = server.spawn("1", [sys.executable, "train.py", "--lr=0.1"], dict(os.environ), here, here / "trial.log", None)
    deadline = time.time() + 60
    while child.poll() is None and time.time() < deadline:
        server.wait(0.2)
    print("trial exit", child.returncode)
    server.shutdown()
''')


def test_a_warm_tuner_forks_its_trials_server_from_itself(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "tuner.py").write_text(TUNER)
    result = run_python([sys.executable, "tuner.py"], dict(os.environ), 120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "server process _ForkedProcess" in result.stdout, result.stdout  # not a fresh Python
    assert "trial exit 0" in result.stdout, result.stdout
    log = (tmp_path / "trial.log").read_text()
    assert "trial op 6 ['--lr=0.1']" in log, log
