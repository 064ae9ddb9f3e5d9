"""TensorFlow's Python info lines stay out of a command's output unless asked for (issue 27, point 9):
the demo build printed `INFO tensorflow: Assets written to: ...` for every SavedModel it saved, because
`modelyard serve` logs at INFO and TensorFlow's logger let its info lines through. And LiteRT's one INFO line
(issue 44): a config file's versions load side by side, and a second thread's first allocation logged it."""
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


# Two interpreters' first allocations side by side, as a config file's versions load in parallel threads.
LITERT_SCRIPT = """
import sys, threading
sys.setswitchinterval(1e-6)  # threads take turns often: the race shows at once rather than now and then
import modelyard  # noqa: F401  (its import filter, as every command has it)
from ai_edge_litert.interpreter import Interpreter
content = open(sys.argv[1], "rb").read()
interpreters = [Interpreter(model_content=content, num_threads=1) for _ in range(4)]
barrier = threading.Barrier(len(interpreters))
def allocate(interpreter):
    barrier.wait()
    interpreter.allocate_tensors()
threads = [threading.Thread(target=allocate, args=(i,)) for i in interpreters]
for t in threads: t.start()
for t in threads: t.join()
print("allocated")
"""


def test_litert_says_nothing_when_first_allocations_race(generated_tfserving):
    model = generated_tfserving / "saved_model_half_plus_two_tflite" / "00000123" / "model.tflite"
    env = {k: v for k, v in os.environ.items() if k not in ("MODELYARD_LOG_LEVEL", "TF_CPP_MIN_LOG_LEVEL")}
    # A race: four processes side by side (the old filter let the line through in 3 runs of 4).
    runs = [subprocess.Popen([sys.executable, "-c", LITERT_SCRIPT, str(model)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0 and out.strip() == "allocated", out + err
        assert "XNNPACK" not in err, err  # "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."
