"""Batch prediction benchmark: ``modelyard batch-predict`` against the in-process ceiling, a plain script
and a Ray Data script.

    python3 bench/batch_predict.py                 # 1,000,000 digits instances (the issue's size)
    python3 bench/batch_predict.py --rows 100000   # quicker; the table states the size used

All read the same generated JSONL file of demo-digits instances (28x28 uint8 as nested
JSON lists) with the same batch size, on the demo model (version 2):

* ceiling: the model alone on pre-parsed arrays through modelyard's runtime (what
  ``batch-predict`` loads: LiteRT where it matches TF), one process per core, rows/s summed;
* model + unavoidable I/O: the ceiling's model calls plus the bytes any job writing Vertex's
  output format moves (each input line read once, and copied with the keys and predictions'
  bytes into batch-predict's part writer, which writes them to disk), no parsing or formatting:
  what is left for parsing and formatting is the gap between this row and ``batch-predict``'s;
* plain script: what a user writes by hand: ``json.loads`` per line, ``np.array`` per batch,
  the SavedModel's ``serving_default`` through ``tf.saved_model.load``, ``json.dumps`` per row out;
* ``modelyard batch-predict --workers <cores>``: end to end (the whole command, imports and
  model loads included) and predicting (from the first loaded model to the last commit);
* ``modelyard batch-predict --engine ray``: the same on a local Ray it starts (one actor per core);
* Ray Data script: what a Ray user writes: ``read_text`` -> ``map_batches`` with a callable class
  (``json.loads`` per line, the SavedModel's ``serving_default``) in an actor pool of <cores>
  -> ``write_json``, on a new local Ray, end to end. Its actors ask for half a CPU each: with one
  CPU each, the pool takes every CPU of a small machine and the read tasks never get one
  (Ray Data waits forever, "backpressured:tasks(ResourceBudget)").

batch-predict (both engines) and the Ray Data script take turns, ``--rounds`` times (default 2),
so the machine's load (it is shared) weighs on each alike; the table gives each run's mean.

Peak RSS is the largest single process of each run: its descendants (Ray's workers too) sampled
every 0.5 s, or ``ru_maxrss`` of the reaped ones if larger.
Writes bench/results/batch_predict.md.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from harness import env, machine, take_turns, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parent
SRC = ROOT.parent / "src"
ENV = env(PYTHONPATH=str(SRC))
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
def loaded_model(version_dir: str, batch: int):
    """``(servable, signature, input alias, output aliases, digits arrays, one batch's outputs)``, loaded
    as batch-predict's workers load it, and warm."""
    import gc

    import numpy as np

    from modelyard.batch.predictor import load_servable
    from modelyard.datasets import load_digits_28

    servable = load_servable(Path(version_dir))
    # As batch-predict's workers do once the model is loaded (engine_local.settle_heap): the
    # collector stops walking TensorFlow's objects, so neither side pays for it.
    gc.collect()
    gc.freeze()
    sig = servable.signatures["serving_default"]
    images, _ = load_digits_28("test")
    arrays = np.resize(images.astype(np.uint8), (max(batch, 4096), 28, 28))
    outputs = tuple(sig.outputs)
    (alias,) = sig.inputs
    (first,) = servable.run(sig, {alias: arrays[:batch]}, outputs).values()
    return servable, sig, alias, outputs, arrays, first


def ceiling_worker(version_dir: str, rows: int, batch: int) -> None:
    servable, sig, alias, outputs, data, _first = loaded_model(version_dir, batch)
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


# ---------------------------------------------------------------- floor: model + unavoidable I/O
def floor_worker(version_dir: str, data_path: str, part: int, parts: int, batch: int, out_dir: str) -> None:
    """The ceiling's model calls plus the bytes any job writing Vertex's output format must move,
    moved as batch-predict moves them: each output line assembled from the input line's bytes (read
    from the page cache, mapped) and the batch's prediction bytes (encoded once, before the clock)
    by ``_denselines.assemble`` into batch-predict's ``PartWriter``, which writes them to disk. No
    parsing of the lines, no encoding of predictions: what is left of batch-predict's time is theirs."""
    import mmap

    import numpy as np
    import orjson

    from modelyard.batch import _denselines
    from modelyard.batch.part_writer import PartWriter

    servable, sig, alias, outputs, arrays, first = loaded_model(version_dir, batch)
    with open(data_path, "rb") as f:
        # mapped and populated before the clock starts, as batch-predict maps each chunk
        mapped = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                           prot=mmap.PROT_READ)
    everything = np.frombuffer(mapped, np.uint8)
    ends = np.flatnonzero(everything == 10)
    starts = np.concatenate([[0], ends[:-1] + 1])
    lo, hi = len(ends) * part // parts, len(ends) * (part + 1) // parts  # this process's half of the lines
    ends, starts = ends[lo:hi], starts[lo:hi]
    spans = np.empty(2 * len(ends), np.int64)
    spans[0::2], spans[1::2] = starts, ends
    del everything
    out = PartWriter(Path(out_dir) / f"floor-{part}")
    predictions = orjson.dumps(first, option=orjson.OPT_SERIALIZE_NUMPY)  # encoded once: no formatting
    done, t0 = 0, time.perf_counter()
    while done < len(ends):
        n = min(batch, len(ends) - done)
        i = done % (len(arrays) - batch + 1)
        servable.run(sig, {alias: arrays[i:i + n]}, outputs)
        if n < batch:  # the last, short batch
            predictions = orjson.dumps(first[:n], option=orjson.OPT_SERIALIZE_NUMPY)
        window = spans[2 * done:2 * (done + n)]
        written = _denselines.assemble(mapped, window, n, predictions, out.buffer, out.offset)
        if written < 0:
            out.room(-written)
            written = _denselines.assemble(mapped, window, n, predictions, out.buffer, out.offset)
        out.offset = written
        done += n
    out.close()
    print(json.dumps({"rows": done, "seconds": time.perf_counter() - t0}))


def floor(version_dir: Path, data: Path, batch: int, out_dir: Path) -> dict:
    procs = [subprocess.Popen([sys.executable, __file__, "_floor", str(version_dir), str(data), str(k), str(CORES),
                               str(batch), str(out_dir)],
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for k in range(CORES)]
    results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    for k in range(CORES):
        (out_dir / f"floor-{k}").unlink(missing_ok=True)
    return {"rows_s": sum(r["rows"] / r["seconds"] for r in results)}


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


# ---------------------------------------------------------------- Ray Data script
RAYDATA = r'''
import json, sys, numpy as np, ray
model_dir, src, out_dir, batch_size, actors, temp_dir = sys.argv[1:7]
ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level="ERROR",
         _temp_dir=temp_dir)

class Predict:
    def __init__(self, model_dir):
        import tensorflow as tf
        self.tf = tf
        self.model = tf.saved_model.load(model_dir).signatures["serving_default"]

    def __call__(self, batch):
        x = np.array([json.loads(line) for line in batch["text"]], dtype=np.uint8)
        prediction = next(iter(self.model(self.tf.constant(x)).values())).numpy()
        return {"instance": x, "prediction": prediction}

ds = ray.data.read_text(src)
ds = ds.map_batches(Predict, fn_constructor_args=(model_dir,), batch_size=int(batch_size),
                    compute=ray.data.ActorPoolStrategy(size=int(actors)), num_cpus=0.5, batch_format="numpy")
ds.write_json(out_dir)
'''


def count_lines(folder: Path) -> int:
    total = 0
    for path in folder.iterdir():
        with open(path, "rb") as f:
            total += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 22), b""))
    return total


def measured(command: list[str]) -> dict:
    """Run ``command`` under a wrapper that reports wall time and the largest process's peak RSS."""
    out = subprocess.run([sys.executable, __file__, "_measure", *command], env=ENV, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{command[:4]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _largest_rss_mib(root: int) -> float:
    """RSS of the largest process among ``root``'s descendants now (Ray's workers included: they are
    the raylet's children, and the raylet is the driver's)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    largest, stack = 0, list(children.get(root, []))
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/status") as f:
                rss = next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        except (OSError, ValueError):
            continue
        largest = max(largest, rss)
    return largest / 1024


def measure_main(command: list[str]) -> None:
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampled = 0.0
    # stderr is drained by a thread so a chatty command never blocks on a full pipe.
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)
    reader.start()
    while proc.poll() is None:
        sampled = max(sampled, _largest_rss_mib(os.getpid()))
        time.sleep(0.5)
    seconds = time.perf_counter() - start
    reader.join()
    if proc.returncode != 0:
        sys.stderr.write("".join(errors))
        raise SystemExit(proc.returncode)
    # Sampled every 0.5 s (catches processes nobody here reaps, like Ray's workers) or, if larger,
    # the kernel's exact peak of the reaped descendants.
    rss_mib = max(sampled, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    print(json.dumps({"seconds": seconds, "rss_mib": rss_mib}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="instances to generate (default 1,000,000)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--skip-plain", action="store_true", help="skip the (slow) plain script")
    parser.add_argument("--rounds", type=int, default=2,
                        help="turns of batch-predict (both engines) and the Ray Data script (default 2)")
    args = parser.parse_args()
    started_on = machine()
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
        io_floor = floor(version_dir, data, batch, tmp)
        print(f"model + the job's unavoidable I/O: {io_floor['rows_s']:,.0f} rows/s", flush=True)

        script = tmp / "raydata.py"
        script.write_text(RAYDATA)
        def batch_predict(engine: str, out: Path) -> dict:
            run = measured([sys.executable, "-m", "modelyard", "batch-predict", "--no-progress", "--model",
                            str(base), "--input", str(data), "--output", str(out), "--batch-size", str(batch),
                            "--workers", str(CORES), "--engine", engine])
            (job_dir,) = out.iterdir()
            job = json.loads((job_dir / "job.json").read_text())
            assert job["state"] == "JOB_STATE_SUCCEEDED" and job["completion_stats"]["successful_count"] == rows
            run.update(rows_s=rows / run["seconds"], predict_rows_s=rows / job["predict_seconds"])
            shutil.rmtree(out)
            return run

        # A model's first job converts it to LiteRT and checks it against TensorFlow (in each worker);
        # later jobs load the verified conversion from the cache (litert_cache). The rounds below
        # are later jobs (the ceiling's load filled the cache); this one is a first.
        from modelyard.model.runtime import litert_cache

        shutil.rmtree(litert_cache.cache_root() / litert_cache.model_key(version_dir), ignore_errors=True)
        cold = batch_predict("local", tmp / "out-cold")
        print(f"batch-predict, the model's first job: {cold['rows_s']:,.0f} rows/s end to end", flush=True)

        def raydata_run(k: int) -> dict:
            out = tmp / f"out-raydata-{k}"
            ray_tmp = tempfile.mkdtemp(prefix="rdb-", dir="/tmp")  # short: Ray's socket paths live under it
            try:
                run = measured([sys.executable, str(script), str(version_dir), str(data), str(out), str(batch),
                                str(CORES), ray_tmp])
            finally:
                shutil.rmtree(ray_tmp, ignore_errors=True)
            written = count_lines(out)
            assert written == rows, f"the Ray Data script wrote {written} of {rows} rows"
            run["rows_s"] = rows / run["seconds"]
            shutil.rmtree(out)
            return run

        def one_run(side: str, k: int) -> dict:
            return raydata_run(k) if side == "raydata" else batch_predict(side, tmp / f"out-{side}-{k}")

        def show(side: str, k: int, run: dict) -> None:
            if side == "raydata":
                print(f"round {k + 1}: Ray Data script: {run['rows_s']:,.0f} rows/s, {run['rss_mib']:,.0f} MiB",
                      flush=True)
            else:
                print(f"round {k + 1}: batch-predict --engine {side}: {run['rows_s']:,.0f} rows/s end to end, "
                      f"{run['predict_rows_s']:,.0f} predicting, {run['rss_mib']:,.0f} MiB", flush=True)

        turns = take_turns(["local", "ray", "raydata"], args.rounds, one_run, show)
        mean = {name: {key: sum(r[key] for r in runs) / len(runs) for key in runs[0]} for name, runs in turns.items()}
        ours_e2e, ours_predict = mean["local"]["rows_s"], mean["local"]["predict_rows_s"]
        run = {"rss_mib": max(r["rss_mib"] for r in turns["local"])}
        ray_rss = max(r["rss_mib"] for r in turns["ray"])
        raydata = mean["raydata"]

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
        f"| the ceiling's model calls + reading the lines and writing the output's bytes (no parsing or "
        f"formatting), {CORES} processes | {io_floor['rows_s']:,.0f} | {io_floor['rows_s'] / top['rows_s']:.2f}x | | |",
    ]
    vs_plain = (lambda v: f"{v / plain['rows_s']:.2f}x") if plain else (lambda v: "n/a")
    table += [
        f"| `modelyard batch-predict --workers {CORES}`, predicting | {ours_predict:,.0f} | "
        f"{ours_predict / top['rows_s']:.2f}x | {vs_plain(ours_predict)} | {run['rss_mib']:,.0f} MiB |",
        f"| `modelyard batch-predict --workers {CORES}`, end to end (imports, model loads) | {ours_e2e:,.0f} | "
        f"{ours_e2e / top['rows_s']:.2f}x | {vs_plain(ours_e2e)} | |",
        f"| the same, the model's first job (each worker converts to LiteRT and checks it against TensorFlow; "
        f"later jobs load the cached conversion), end to end | {cold['rows_s']:,.0f} | "
        f"{cold['rows_s'] / top['rows_s']:.2f}x | {vs_plain(cold['rows_s'])} | |",
        f"| `modelyard batch-predict --engine ray` ({CORES} actors, local Ray), predicting | "
        f"{mean['ray']['predict_rows_s']:,.0f} | {mean['ray']['predict_rows_s'] / top['rows_s']:.2f}x | "
        f"{vs_plain(mean['ray']['predict_rows_s'])} | {ray_rss:,.0f} MiB |",
        f"| `modelyard batch-predict --engine ray`, end to end (Ray start, imports, model loads) | "
        f"{mean['ray']['rows_s']:,.0f} | {mean['ray']['rows_s'] / top['rows_s']:.2f}x | "
        f"{vs_plain(mean['ray']['rows_s'])} | |",
        f"| Ray Data script (read_text, map_batches on {CORES} actors, write_json), end to end (Ray start, "
        f"imports, model loads) | {raydata['rows_s']:,.0f} | {raydata['rows_s'] / top['rows_s']:.2f}x | "
        f"{vs_plain(raydata['rows_s'])} | {raydata['rss_mib']:,.0f} MiB |",
    ]
    if plain:
        table.append(f"| plain script (json.loads per line, saved_model signature, json.dumps), end to end | "
                     f"{plain['rows_s']:,.0f} | {plain['rows_s'] / top['rows_s']:.2f}x | 1.00x | {plain['rss_mib']:,.0f} MiB |")
    text = "\n".join([
        "# Batch prediction benchmark",
        "",
        f"`python3 bench/batch_predict.py --rows {rows}` on {started_on}: "
        f"{rows:,} demo-digits instances ({size_mib:,.0f} MiB JSONL), batch size {batch} "
        f"(load average {os.getloadavg()[0]:.1f} at the end).",
        "",
        *table,
        "",
        f"Against the Ray Data `map_batches` script, end to end: `batch-predict` {ours_e2e / raydata['rows_s']:.2f}x, "
        f"`batch-predict --engine ray` {mean['ray']['rows_s'] / raydata['rows_s']:.2f}x (target: at least 1.0x). "
        f"Mean of {args.rounds} rounds taking turns; per round (rows/s end to end): "
        + "; ".join(f"{name} " + ", ".join(f"{r['rows_s']:,.0f}" for r in runs) for name, runs in turns.items())
        + ". Peak RSS: the largest single process among the command's descendants (Ray's workers included).",
        "",
    ])
    write_results("batch_predict", text)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_floor":
        sys.path.insert(0, str(SRC))
        import modelyard  # noqa: F401

        floor_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7])
    elif len(sys.argv) > 1 and sys.argv[1] == "_ceiling":
        sys.path.insert(0, str(SRC))
        import modelyard  # noqa: F401

        ceiling_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_measure":
        measure_main(sys.argv[2:])
    else:
        main()
