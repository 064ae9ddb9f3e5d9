"""Batch prediction benchmark: ``modelyard batch-predict`` against the in-process ceiling and a plain script.

    python3 bench/batch_predict.py                 # 1,000,000 digits instances (the issue's size)
    python3 bench/batch_predict.py --rows 100000   # quicker; the table states the size used

All three read the same generated JSONL file of demo-digits instances (28x28 uint8 as nested
JSON lists) with the same batch size, on the demo model (version 2):

* ceiling: the model alone on pre-parsed arrays through modelyard's runtime (what
  ``batch-predict`` loads: LiteRT where it matches TF), one process per core, rows/s summed;
* plain script: what a user writes by hand: ``json.loads`` per line, ``np.array`` per batch,
  the SavedModel's ``serving_default`` through ``tf.saved_model.load``, ``json.dumps`` per row out;
* ``modelyard batch-predict --workers <cores>``: end to end (the whole command, imports and
  model loads included) and predicting (from the first loaded model to the last commit).

Peak RSS is the largest single process of each run (``ru_maxrss`` of a wrapper's children).
Writes bench/results/batch_predict.md.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parent
SRC = ROOT.parent / "src"
ENV = dict(os.environ, PYTHONPATH=str(SRC), PYTHONUNBUFFERED="1")
CORES = os.cpu_count() or 1


def generate(path: Path, rows: int) -> None:
    """``rows`` lines cycling over the digits test images (distinct lines, realistic size)."""
    import numpy as np

    from modelyard.datasets import load_digits_28

    images, _ = load_digits_28("test")
    lines = [json.dumps(img.tolist(), separators=(",", ":")).encode() + b"\n" for img in images.astype(np.uint8)]
    with open(path, "wb") as f:
        for i in range(rows):
            f.write(lines[i % len(lines)])


# ---------------------------------------------------------------- ceiling: model alone
def ceiling_worker(version_dir: str, rows: int, batch: int) -> None:
    import numpy as np

    from modelyard.batch.predictor import load_servable
    from modelyard.datasets import load_digits_28

    servable = load_servable(Path(version_dir))
    sig = servable.signatures["serving_default"]
    images, _ = load_digits_28("test")
    data = np.resize(images.astype(np.uint8), (max(batch, 4096), 28, 28))
    outputs = tuple(sig.outputs)
    (alias,) = sig.inputs
    servable.run(sig, {alias: data[:batch]}, outputs)  # warm
    done, start = 0, time.perf_counter()
    while done < rows:
        i = done % (len(data) - batch + 1)
        servable.run(sig, {alias: data[i:i + batch]}, outputs)
        done += batch
    print(json.dumps({"rows": done, "seconds": time.perf_counter() - start, "runtime": servable.runtime}))


def ceiling(version_dir: Path, rows: int, batch: int) -> dict:
    per = rows // CORES
    procs = [subprocess.Popen([sys.executable, __file__, "_ceiling", str(version_dir), str(per), str(batch)],
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for _ in range(CORES)]
    results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    return {"rows_s": sum(r["rows"] / r["seconds"] for r in results), "runtime": results[0]["runtime"]}


# ---------------------------------------------------------------- plain hand-written script
PLAIN = r'''
import json, sys, numpy as np, tensorflow as tf
model = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
batch_size = int(sys.argv[4])
with open(sys.argv[2]) as src, open(sys.argv[3], "w") as out:
    def flush(batch):
        result = model(tf.constant(np.array(batch, dtype=np.uint8)))
        for instance, prediction in zip(batch, next(iter(result.values())).numpy()):
            out.write(json.dumps({"instance": instance, "prediction": prediction.tolist()}) + "\n")
    batch = []
    for line in src:
        batch.append(json.loads(line))
        if len(batch) == batch_size:
            flush(batch)
            batch = []
    if batch:
        flush(batch)
'''


def measured(command: list[str]) -> dict:
    """Run ``command`` under a wrapper that reports wall time and the largest process's peak RSS."""
    out = subprocess.run([sys.executable, __file__, "_measure", *command], env=ENV, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{command[:4]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_main(command: list[str]) -> None:
    start = time.perf_counter()
    proc = subprocess.run(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(proc.returncode)
    rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "rss_mib": rss_mib}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="instances to generate (default 1,000,000)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--skip-plain", action="store_true", help="skip the (slow) plain script")
    args = parser.parse_args()
    sys.path.insert(0, str(SRC))
    import modelyard  # noqa: F401
    from modelyard.demo import ensure_demo_model

    base = ensure_demo_model(log=lambda _m: None)
    version_dir = base / "0002"
    rows, batch = args.rows, args.batch_size
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        tmp = Path(tmp)
        data = tmp / "digits.jsonl"
        generate(data, rows)
        size_mib = data.stat().st_size / 2**20
        print(f"{rows:,} instances, {size_mib:,.0f} MiB of JSONL, batch {batch}, {CORES} cores", flush=True)

        top = ceiling(version_dir, rows, batch)
        print(f"ceiling: {top['rows_s']:,.0f} rows/s on {top['runtime']}", flush=True)

        out = tmp / "out"
        run = measured([sys.executable, "-m", "modelyard", "batch-predict", "--no-progress", "--model", str(base),
                        "--input", str(data), "--output", str(out), "--batch-size", str(batch),
                        "--workers", str(CORES)])
        (job_dir,) = out.iterdir()
        job = json.loads((job_dir / "job.json").read_text())
        assert job["state"] == "JOB_STATE_SUCCEEDED" and job["completion_stats"]["successful_count"] == rows, job
        ours_e2e = rows / run["seconds"]
        ours_predict = rows / job["predict_seconds"]
        print(f"batch-predict: {ours_e2e:,.0f} rows/s end to end, {ours_predict:,.0f} predicting, "
              f"{run['rss_mib']:,.0f} MiB", flush=True)

        plain = None
        if not args.skip_plain:
            script = tmp / "plain.py"
            script.write_text(PLAIN)
            plain = measured([sys.executable, str(script), str(version_dir), str(data), str(tmp / "plain.jsonl"),
                              str(batch)])
            plain["rows_s"] = rows / plain["seconds"]
            print(f"plain script: {plain['rows_s']:,.0f} rows/s, {plain['rss_mib']:,.0f} MiB", flush=True)

    table = [
        "| run | rows/s | vs ceiling | vs plain script | peak RSS (largest process) |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| ceiling: model alone, pre-parsed arrays, {CORES} processes ({top['runtime']}) | {top['rows_s']:,.0f} | 1.00x | | |",
    ]
    vs_plain = (lambda v: f"{v / plain['rows_s']:.2f}x") if plain else (lambda v: "n/a")
    table += [
        f"| `modelyard batch-predict --workers {CORES}`, predicting | {ours_predict:,.0f} | "
        f"{ours_predict / top['rows_s']:.2f}x | {vs_plain(ours_predict)} | {run['rss_mib']:,.0f} MiB |",
        f"| `modelyard batch-predict --workers {CORES}`, end to end (imports, model loads) | {ours_e2e:,.0f} | "
        f"{ours_e2e / top['rows_s']:.2f}x | {vs_plain(ours_e2e)} | |",
    ]
    if plain:
        table.append(f"| plain script (json.loads per line, saved_model signature, json.dumps), end to end | "
                     f"{plain['rows_s']:,.0f} | {plain['rows_s'] / top['rows_s']:.2f}x | 1.00x | {plain['rss_mib']:,.0f} MiB |")
    text = "\n".join([
        "# Batch prediction benchmark",
        "",
        f"`python3 bench/batch_predict.py --rows {rows}` on {time.strftime('%Y-%m-%d', time.gmtime())}: "
        f"{rows:,} demo-digits instances ({size_mib:,.0f} MiB JSONL), batch size {batch}, {CORES} cores "
        f"(shared machine; load average {os.getloadavg()[0]:.1f} at the end).",
        "",
        *table,
        "",
        "Not measured: a Ray Data `map_batches` script (Ray is not installed; the Ray engine is not built).",
        "",
    ])
    print("\n" + text)
    results = ROOT / "results"
    results.mkdir(exist_ok=True)
    (results / "batch_predict.md").write_text(text)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_ceiling":
        sys.path.insert(0, str(SRC))
        import modelyard  # noqa: F401

        ceiling_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_measure":
        measure_main(sys.argv[2:])
    else:
        main()
