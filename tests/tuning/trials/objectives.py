"""Function-trial objectives for tests/tuning/test_function_trials.py.

Each appends one JSON line per trial to $OBJECTIVE_LOG (the trial id, the worker's pid, and
whether it finished), so a test counts worker processes and runs from inside the trials.
"""
import json
import os
import time

from modelyard.tuning import TrialPruned

LOADED = time.time()  # module state a warm worker keeps from one trial to the next
# The worker's share of the machine as this module's import saw it: what TensorFlow, imported
# at this point, would size its thread pools and choose its devices by.
AT_IMPORT = {"affinity": sorted(os.sched_getaffinity(0)), "intra": os.environ.get("TF_NUM_INTRAOP_THREADS"),
             "inter": os.environ.get("TF_NUM_INTEROP_THREADS"), "omp": os.environ.get("OMP_NUM_THREADS"),
             "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}


def _log(**fields):
    with open(os.environ["OBJECTIVE_LOG"], "a") as f:
        f.write(json.dumps({"trial": os.environ["MODELYARD_TRIAL_ID"], "pid": os.getpid(), **fields}) + "\n")


def quadratic(params, report):
    """score = 1 - (x - 0.3)^2 - (y + 0.2)^2, reached over 5 steps; the optimum is (0.3, -0.2)."""
    _log(event="start", loaded=LOADED)
    best = 1 - (params["x"] - 0.3) ** 2 - (params["y"] + 0.2) ** 2
    delay = float(os.environ.get("STEP_SECONDS", "0"))
    for step in range(1, 6):
        time.sleep(delay)
        report(step, best * (1 - 0.5 ** step))
    _log(event="end")
    return best


def misbehave(params, report):
    """What the trial does depends on `mode`: fine, raise, exit, hang, ignore (TrialPruned), memory."""
    mode = params["mode"]
    _log(event="start", mode=mode)
    value = {"fine": 0.9, "again": 0.9, "raise": 0.8, "exit": 0.8, "hang": 0.8, "ignore": 0.1, "memory": 0.8}[mode]
    if mode == "raise":
        raise ValueError("bad batch shape")
    if mode == "exit":
        os._exit(7)
    if mode == "hang":
        time.sleep(3600)
    if mode == "memory":
        hog = bytearray(400 * 2**20)  # written, so it is resident
        for i in range(0, len(hog), 4096):
            hog[i] = 1
        time.sleep(3600)
    for step in range(1, 6):
        try:
            report(step, value)
        except TrialPruned:
            if mode != "ignore":
                raise
            time.sleep(3600)  # goes on "training" after it was told to stop
    _log(event="end")
    return value


def placement(params, report):
    """Logs the share the module's import saw, the trial's cores and the frozen object count."""
    import gc

    _log(event="placement", at_import=AT_IMPORT, affinity=sorted(os.sched_getaffinity(0)),
         intra=os.environ.get("TF_NUM_INTRAOP_THREADS"), trial_cpus=os.environ.get("MODELYARD_TRIAL_CPUS"),
         frozen=gc.get_freeze_count())
    report(1, params["x"])
    return params["x"]
