"""TensorFlow's Python info lines stay out of a command's output unless asked for (issue 27, point 9):
the demo build printed `INFO tensorflow: Assets written to: ...` for every SavedModel it saved, because
`modelyard serve` logs at INFO and TensorFlow's logger let its info lines through."""
from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import logging
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")  # as serve does
import modelyard
import tf_keras as keras
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
modelyard.export(model, sys.argv[1], quiet=True)
"""


def _start(folder, **env) -> subprocess.Popen:
    run_env = {k: v for k, v in os.environ.items() if k not in ("MODELYARD_LOG_LEVEL", "TF_CPP_MIN_LOG_LEVEL")}
    run_env.update(env)
    return subprocess.Popen([sys.executable, "-c", "import sys\n" + SCRIPT, str(folder)], env=run_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _output(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    return out


def test_saving_a_model_prints_no_tensorflow_info_line_by_default(tmp_path):
    quiet, verbose = _start(tmp_path / "a"), _start(tmp_path / "b", MODELYARD_LOG_LEVEL="info")  # side by side
    out = _output(quiet)
    assert "Assets written to" not in out, out
    # -v (MODELYARD_LOG_LEVEL=info) still shows them.
    out = _output(verbose)
    assert "INFO tensorflow: Assets written to" in out, out
