"""What running batch prediction as a platform job costs: a BatchPredictionJob on ``modelyard platform``
against the same work run directly with ``modelyard batch-predict``, taking turns.

    python3 bench/platform_jobs.py                 # 200,000 rows of a 4-float model, 3 rounds
    python3 bench/platform_jobs.py --rows 50000 --rounds 2

Both read one generated JSONL file with the same model (a small Dense softmax SavedModel built here)
and default workers; times are wall clock from the request (or the command) to the job's end,
imports and model loads included. The platform adds: the REST call, the job's child process, the
runner's polling (0.25 s) and publishing the shards to the output prefix.
Writes bench/results/platform_jobs.md.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from harness import env, machine, markdown_table, median, modelyard_platform, take_turns, write_results

ENV = env(TF_USE_LEGACY_KERAS="1")
PARENT = "projects/local/locations/us-central1"


def http(method: str, url: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read() or b"{}")


def build_model(out: Path) -> Path:
    code = ("import tf_keras as keras, modelyard, sys\n"
            "keras.utils.set_random_seed(1)\n"
            "m = keras.Sequential([keras.Input((4,), name='x'), keras.layers.Dense(3, activation='softmax')])\n"
            "print(modelyard.export(m, sys.argv[1]))\n")
    done = subprocess.run([sys.executable, "-c", code, str(out)], env=ENV, capture_output=True, text=True, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


def via_platform(url: str, model: str, data: Path, out: Path) -> float:
    body = {"displayName": out.name, "model": model,
            "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [str(data)]}},
            "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": str(out)}}}
    started = time.monotonic()
    name = http("POST", f"{url}/v1/{PARENT}/batchPredictionJobs", body)["name"]
    while True:
        job = http("GET", f"{url}/v1/{name}")
        if job["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"):
            break
        time.sleep(0.05)
    if job["state"] != "JOB_STATE_SUCCEEDED":
        raise RuntimeError(f"platform job failed: {job.get('error')}")
    return time.monotonic() - started


def via_cli(model_dir: Path, data: Path, out: Path) -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "modelyard", "batch-predict", "--model", str(model_dir), "--input", str(data),
                    "--output", str(out), "--no-progress"], env=ENV, check=True, capture_output=True)
    return time.monotonic() - started


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="results file or folder (default bench/results/platform_jobs.md)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = build_model(tmp / "models" / "tiny")
        data = tmp / "instances.jsonl"
        with open(data, "w") as f:
            for i in range(args.rows):
                f.write(f"[1.0, 2.0, 3.0, {i % 11}.0]\n")
        started_on = machine()
        with modelyard_platform(tmp, child_env=ENV) as platform:
            url = platform.base
            op = http("POST", f"{url}/v1/{PARENT}/models:upload",
                      {"model": {"displayName": "tiny", "artifactUri": str(model_dir)}})
            model = op["response"]["model"]
            sides = {"modelyard batch-predict": lambda k: via_cli(model_dir, data, tmp / f"cli-{k}"),
                     "BatchPredictionJob on the platform": lambda k: via_platform(url, model, data, tmp / f"job-{k}")}
            # Taking turns, so load on the shared machine hits both alike.
            runs = take_turns(list(sides), args.rounds, lambda side, k: {"s": sides[side](k)})
    times = {side: [r["s"] for r in rs] for side, rs in runs.items()}
    cli = median(times["modelyard batch-predict"])
    rows = []
    for name, values in times.items():
        med = median(values)
        rows.append([name, f"{med:.1f}", ", ".join(f"{v:.1f}" for v in values), f"{args.rows / med:,.0f}",
                     f"{med / cli:.2f}x"])
    lines = [f"# Batch prediction as a platform job vs the CLI ({args.rows:,} JSONL rows, {args.rounds} rounds)", "",
             f"On {started_on}.", "",
             markdown_table(["run", "median s", "runs (s)", "rows/s (median)", "vs CLI"], rows, align="lllll")]
    lines += ["", "Wall clock from the command (or the create request) to the job's end, imports and model loads "
              "included; the platform's job adds its REST call, child process, runner polling and the copy of the "
              "shards to the output prefix. Command: `python3 bench/platform_jobs.py"
              + (f" --rows {args.rows}" if args.rows != 200_000 else "")
              + (f" --rounds {args.rounds}" if args.rounds != 3 else "") + "`."]
    write_results("platform_jobs", "\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
