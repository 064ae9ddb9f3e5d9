"""Time from submitting a training config to its first training step on ``modelyard platform``:
started from the platform's warm interpreter (what ``modelyard jobs submit`` of a training config
gets) against a cold start of the same config, taking turns (issue 29).

    python3 bench/warm_jobs.py              # 4 rounds
    python3 bench/warm_jobs.py --rounds 2

Both sides are the same one-replica CustomJob of ``modelyard train CONFIG`` (the demo model, one
step per epoch, two epochs); the cold side's pool sets ``PYTHONHASHSEED`` (read when Python starts),
so the platform starts it cold and says so in its log, as for any job it cannot fork. Times are wall
clock from the create request to the job log's first ``epoch 1/`` line (the end of the first step,
its trace included) and to the job's end. Before the rounds, one untimed warm job starts the
platform's fork server (the first such job waits for its import); its time is reported apart.
Writes bench/results/warm_jobs.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from harness import env, log, machine, markdown_table, median, modelyard_platform, take_turns, write_results

ENV = env(TF_USE_LEGACY_KERAS="1")
PARENT = "projects/local/locations/us-central1"
CONFIG = {"model": "demo", "strategy": "one_device", "global_batch_size": 32, "epochs": 2, "steps_per_epoch": 1,
          "seed": 7, "tensorboard": False, "input_report": False}


def http(method: str, url: str, body: dict | None = None, raw: bool = False):
    req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        data = resp.read()
    return data.decode(errors="replace") if raw else json.loads(data or b"{}")


def run_job(url: str, tmp: Path, label: str, cold: bool) -> dict:
    cfg = tmp / f"{label}.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "job_dir": str(tmp / label)}))
    pool = {"replicaCount": "1", "machineSpec": {"machineType": "local"}, "containerSpec": {
        "imageUri": "modelyard/train", "command": [sys.executable, "-m", "modelyard", "train", str(cfg)]}}
    if cold:
        pool["containerSpec"]["env"] = [{"name": "PYTHONHASHSEED", "value": "0"}]
    load = os.getloadavg()[0]
    started = time.monotonic()
    name = http("POST", f"{url}/v1/{PARENT}/customJobs", {"displayName": label, "jobSpec": {"workerPoolSpecs": [pool]}})["name"]
    logs_url = f"{url}/modelyard/v1/jobs/{name.rsplit('/', 1)[-1]}/logs"
    first_step = replica = None
    while True:
        if first_step is None:
            text = http("GET", logs_url, raw=True)
            if replica is None and "[modelyard] started pid" in text:
                replica = time.monotonic() - started
            if "epoch 1/" in text:
                first_step = time.monotonic() - started
        job = http("GET", f"{url}/v1/{name}")
        if job["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
            break
        time.sleep(0.05)
    ended = time.monotonic() - started
    text = http("GET", logs_url, raw=True)
    if job["state"] != "JOB_STATE_SUCCEEDED" or first_step is None:
        raise RuntimeError(f"{label} did not succeed: {job.get('error')}\n{text[-2000:]}")
    warm = "[modelyard] warm start" in text
    if warm == cold:
        raise RuntimeError(f"{label}: expected a {'cold' if cold else 'warm'} start:\n{text[-2000:]}")
    return {"replica": replica if replica is not None else first_step, "first_step": first_step, "end": ended,
            "load": load}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", help="results file or folder (default bench/results/warm_jobs.md)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        started_on = machine()
        with modelyard_platform(tmp, child_env=ENV) as platform:
            url = platform.base
            first = run_job(url, tmp, "first-warm", cold=False)
            log(f"first warm job (starts the fork server): {first}")
            runs = take_turns(["cold start", "warm start"], args.rounds,
                              lambda side, k: run_job(url, tmp, f"{side.split()[0]}-{k}", cold=side == "cold start"))
    rows = []
    cold_first = median(r["first_step"] for r in runs["cold start"])
    for side, results in runs.items():
        firsts = [r["first_step"] for r in results]
        rows.append([side, f"{median(r['replica'] for r in results):.2f}", f"{median(firsts):.2f}",
                     ", ".join(f"{v:.2f}" for v in firsts),
                     f"{median(r['end'] for r in results):.2f}", f"{median(firsts) / cold_first:.2f}x",
                     ", ".join(f"{r['load']:.1f}" for r in results)])
    rows.append(["first warm job (fork server starting)", f"{first['replica']:.2f}", f"{first['first_step']:.2f}", "",
                 f"{first['end']:.2f}",
                 f"{first['first_step'] / cold_first:.2f}x", f"{first['load']:.1f}"])
    lines = [f"# Submit to first training step: warm vs cold training jobs ({args.rounds} rounds)", "",
             f"On {started_on}.", "",
             markdown_table(["start", "median s to replica start", "median s to first step", "runs (s)",
                             "median s to job end", "vs cold (first step)", "load (1 min) at submit"], rows,
                            align="lllllll"),
             "", "Wall clock from the CustomJob create request to the launcher's `[modelyard] started pid` line (the "
             "replica started: forked, or a fresh Python), to the job log's first `epoch 1/` line (one step per "
             "epoch: the end of the first step, its trace included) and to the job's end (two epochs); the log is "
             "polled every 0.05 s. The platform, the jobs and the polling share the machine's 2 cores with "
             "whatever else runs (the load column). Command: "
             "`python3 bench/warm_jobs.py" + (f" --rounds {args.rounds}" if args.rounds != 4 else "") + "`."]
    write_results("warm_jobs", "\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
