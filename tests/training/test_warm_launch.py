"""``modelyard launch`` forks TensorFlow tasks from one warm interpreter: seen from inside the tasks,
first start and restart alike. (The launcher's other behaviours: test_launcher, test_fault_tolerance.)"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

from .conftest import ENV, MODELYARD, run, stop_launcher

# The task says whether TensorFlow was imported before its own import, then runs an op (which a
# warm child may: its server never ran one). worker:1 fails its first attempt, so the job restarts.
TASK = textwrap.dedent('''
    import os, sys
    before = "tensorflow" in sys.modules
    import tensorflow as tf
    task, attempt = os.environ["MODELYARD_TASK"], os.environ["MODELYARD_ATTEMPT"]
    print(f"task {task} attempt {attempt} tensorflow_before {before} op {int(tf.constant(2) * 3)}", flush=True)
    sys.exit(3 if (task, attempt) == ("worker:1", "0") else 0)
''')


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_tasks_and_restarted_tasks_are_forked_warm_from_one_interpreter(tmp_path):
    (tmp_path / "task.py").write_text(TASK)
    result = run(["launch", "--workers", "2", "--max-restarts", "1", "--", sys.executable, "task.py"],
                 cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "restarting the job (restart 1 of 1)" in out
    for attempt in ("0", "1"):
        for task in ("worker:0", "worker:1"):
            assert f"{task} | task {task} attempt {attempt} tensorflow_before True op 6" in out, out
    announced = re.findall(r"(worker:\d) \| \[modelyard\] warm start: pid (\d+) forked from pid (\d+), "
                           r"TensorFlow already imported", out)
    assert len(announced) == 4, out  # two tasks, two attempts
    assert len({server for _, _, server in announced}) == 1, out  # one interpreter per launch
    assert len({pid for _, pid, _ in announced}) == 4, out  # each a process of its own
    # Nothing outlives the launch: not a task, not the warm interpreter.
    left = [pid for _, pid, _ in announced] + [announced[0][2]]
    assert [pid for pid in left if _running(int(pid))] == [], out
    # The failed task is named with its exit code and last lines, as for a cold task.
    assert "task worker:1 exited with code 3" in result.stderr
    assert "task worker:1 attempt 0 tensorflow_before True op 6" in result.stderr


def test_tasks_start_cold_saying_why_when_the_warm_interpreter_cannot_import_tensorflow(tmp_path):
    """A warm interpreter that dies importing TensorFlow (here a broken one first on PYTHONPATH): each
    task starts cold, says why, and the job runs as before. No real TensorFlow is imported."""
    broken = tmp_path / "broken"
    (broken / "tensorflow").mkdir(parents=True)
    (broken / "tensorflow" / "__init__.py").write_text("raise ImportError('this TensorFlow is broken')\n")
    (tmp_path / "task.py").write_text(textwrap.dedent('''
        try:
            import tensorflow
        except ImportError as exc:
            print("task ran without TensorFlow:", exc)
    '''))
    env = dict(ENV, PYTHONPATH=os.pathsep.join([str(broken), *filter(None, [ENV.get("PYTHONPATH")])]))
    # Started cold (not conftest.run): the launcher needs no TensorFlow, and its PYTHONPATH is the broken one.
    proc = subprocess.Popen(MODELYARD + ["launch", "--workers", "2", "--", sys.executable, "task.py"], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        stop_launcher(proc)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert result.returncode == 0, result.stdout + result.stderr
    for task in ("worker:0", "worker:1"):
        assert re.search(rf"{task} \| \[modelyard\] cold start \(not forked from the warm interpreter\): the warm "
                         r"interpreter died while importing TensorFlow \(its log: \S+forkserver.log\)", result.stdout)
        assert f"{task} | task ran without TensorFlow: this TensorFlow is broken" in result.stdout
    assert "warm start:" not in result.stdout


# A launcher that is itself warm (here: forked from the suite's warm interpreter, as the platform's
# jobs are) forks the server from itself, ready at once; once it has run an op, it may not.
SELF_FORK = textwrap.dedent('''
    import os, sys, threading, time
    import tensorflow as tf
    from modelyard.training import warm_tasks

    env = dict(os.environ)
    warm = warm_tasks.WarmTasks([sys.executable, "task.py"], env)
    print("server process", type(warm.server.proc).__name__)
    warm.wait_ready(threading.Event())
    task, why = warm.spawn(dict(env, MODELYARD_TASK="worker:0", MODELYARD_ATTEMPT="0"))
    assert why is None, why
    print("task says", task.stdout.readline().decode().strip(), "|", task.stdout.readline().decode().strip())
    print("task exit", task.wait(120))
    warm.close()
    tf.constant(1)  # an op: a fork of this process now would not have a working TensorFlow
    from modelyard.tuning import warm
    print("after an op:", warm._fork_blocker(env), warm.ForkServer.fork_here(env, warm_tasks.Path("x.log")))
''')


def test_a_warm_launcher_forks_its_warm_interpreter_from_itself(tmp_path):
    from tests.warm_process import run_python

    (tmp_path / "task.py").write_text(TASK)
    (tmp_path / "self_fork.py").write_text(SELF_FORK)
    result = run_python([sys.executable, "self_fork.py"], ENV, 120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "server process _ForkedProcess" in out, out  # not a fresh Python importing TensorFlow again
    assert re.search(r"task says \[modelyard\] warm start: pid \d+ forked from pid \d+, TensorFlow already imported"
                     r" \| task worker:0 attempt 0 tensorflow_before True op 6", out), out
    assert "task exit 0" in out
    assert "after an op: this process has run TensorFlow ops None" in out
