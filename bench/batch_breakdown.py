"""Where a batch-predict worker's time goes per row: CPU microseconds per stage, C path vs Python path.

    python3 bench/batch_breakdown.py                # 20,000 digits lines, 5 passes, batch 256
    python3 bench/batch_breakdown.py --rows 50000 --batch-size 1024

The machine is shared, so wall time mostly measures the neighbours: every figure here is
CPU time of this process (``time.process_time``, all its threads), per row. Two pipelines
over the same generated JSONL of demo-digits instances (28x28 uint8 as nested lists,
~3.6 KB a line), the model on the runtime ``batch-predict`` loads (LiteRT where it matches TF):

* C path (``batch/dense_chunk``): read the chunk into a reused buffer, parse a batch of
  lines in C, cast to the input dtype, the model, one orjson dump of the batch's predictions,
  C writes the output lines, one write per batch;
* Python path (the general loop's NumPy fast path, as before ``_denselines``): split lines,
  NumPy's text parser (``fastjson``), the model, orjson per row, a result line per row,
  join and write.

The "model" stage alone is what ``bench/batch_predict.py`` calls the ceiling (pre-parsed
arrays); ``model / total`` is the fraction of the ceiling a worker can reach when every
core runs one worker. Then whole chunks through the real ``work.process_chunk``, both paths.
Writes bench/results/batch_breakdown.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "src"))
sys.path.insert(0, str(ROOT))

clock = time.process_time


class Stages:
    """Accumulated CPU seconds per stage name, in first-seen order."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def timed(self, name: str, fn, *args):
        start = clock()
        value = fn(*args)
        self.seconds[name] = self.seconds.get(name, 0.0) + clock() - start
        return value


def c_path(predictor, path: Path, batch: int, out_path: Path, stages: Stages) -> None:
    import numpy as np

    from modelyard.batch import _denselines

    dense = predictor.dense
    size = path.stat().st_size
    data = bytearray(size)
    values, spans = np.empty(batch * dense.size, np.int64), np.empty(2 * batch, np.int64)
    integer = dense.parse_dtype is np.int64
    typed = values if integer else values.view(np.float64)

    def read() -> None:
        with open(path, "rb") as f:
            f.readinto(data)

    stages.timed("read", read)
    with open(out_path, "wb") as out:
        pos = 0
        while pos < size:
            _ok, n, pos = stages.timed("parse", _denselines.parse, data, pos, size, batch, dense.shape, integer,
                                       values, spans)
            x = stages.timed("cast", lambda: typed[:n * dense.size].reshape((n,) + dense.shape).astype(dense.dtype))
            outputs = stages.timed("model", predictor.servable.run, predictor.signature, {dense.alias: x},
                                   predictor.aliases)
            encoded = stages.timed("format", predictor.encode_batch, outputs, n)
            lines = stages.timed("format", _denselines.assemble, data, spans, n, encoded)
            stages.timed("write", out.write, lines)
        stages.timed("write", out.flush)


def python_path(predictor, path: Path, batch: int, out_path: Path, stages: Stages) -> None:
    from modelyard.batch.readers.lines import split_lines
    from modelyard.batch.work import result_line

    dense = predictor.dense
    data = stages.timed("read", path.read_bytes)
    lines = stages.timed("split lines", lambda: [line for line in split_lines(data)])
    echoes = stages.timed("split lines", lambda: [line.strip() for line in lines])
    results = []
    for i in range(0, len(lines), batch):
        arrays = stages.timed("parse", dense.parse, lines[i:i + batch])
        outputs = stages.timed("model", predictor.servable.run, predictor.signature, arrays, predictor.aliases)
        encoded = stages.timed("format", predictor._encode, outputs, len(lines[i:i + batch]))
        results += stages.timed("format", lambda: [result_line(e, None, p) for e, p in zip(echoes[i:i + batch], encoded)])

    def write() -> None:
        with open(out_path, "wb") as out:
            out.write(b"\n".join(results) + b"\n")

    stages.timed("write", write)


def whole_chunks(predictor, path: Path, batch: int, tmp: Path, passes: int) -> dict[str, tuple[float, float]]:
    """CPU and wall microseconds per row through ``work.process_chunk``, C path and Python path."""
    from modelyard.batch import dense_chunk
    from modelyard.batch.instances import Shaping
    from modelyard.batch.readers import plan
    from modelyard.batch.work import process_chunk

    chunks, _ = plan([str(path)], "jsonl", 10_000)
    rows = sum(c.rows for c in chunks)
    found = {}
    saved = dense_chunk._denselines
    for label, module in (("C path", saved), ("Python path", None)):
        dense_chunk._denselines = module
        try:
            cpu = wall = 0.0
            for k in range(passes):
                job = tmp / f"job-{label[0]}-{k}"
                job.mkdir()
                c0, w0 = clock(), time.perf_counter()
                for chunk in chunks:
                    process_chunk(job, chunk, "jsonl", None, Shaping(), predictor, batch)
                cpu += clock() - c0
                wall += time.perf_counter() - w0
        finally:
            dense_chunk._denselines = saved
        found[label] = (cpu / (rows * passes) * 1e6, wall / (rows * passes) * 1e6)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    import modelyard  # noqa: F401
    from batch_predict import generate
    from modelyard.batch.predictor import Predictor, load_servable
    from modelyard.demo import ensure_demo_model

    predictor = Predictor(load_servable(ensure_demo_model(log=lambda _m: None) / "0002"))
    with tempfile.TemporaryDirectory(prefix="bench-breakdown-") as tmp:
        tmp = Path(tmp)
        data = tmp / "digits.jsonl"
        generate(data, args.rows)
        c_stages, py_stages = Stages(), Stages()
        for k in range(args.passes):  # taking turns, so both see the same neighbours
            c_path(predictor, data, args.batch_size, tmp / "c.out", c_stages)
            python_path(predictor, data, args.batch_size, tmp / "py.out", py_stages)
        assert (tmp / "c.out").read_bytes() == (tmp / "py.out").read_bytes(), "the two paths must write the same bytes"
        chunks = whole_chunks(predictor, data, args.batch_size, tmp, max(1, args.passes // 2))
    rows = args.rows * args.passes

    def table(stages: Stages) -> tuple[list[str], float, float]:
        per = {k: v / rows * 1e6 for k, v in stages.seconds.items()}
        total = sum(per.values())
        return [f"| {k} | {v:.2f} | {v / total:.0%} |" for k, v in per.items()], total, per["model"]

    c_rows, c_total, c_model = table(c_stages)
    py_rows, py_total, py_model = table(py_stages)
    text = "\n".join([
        "# Batch prediction: CPU per row, by stage",
        "",
        f"`python3 bench/batch_breakdown.py --rows {args.rows} --passes {args.passes} --batch-size {args.batch_size}` "
        f"on {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC: demo digits model on {predictor.runtime}, "
        f"28x28 uint8 instances as JSON lines (~3.6 KB each), CPU microseconds per row of one process "
        f"(shared machine, load average {os.getloadavg()[0]:.1f}; wall time would measure the neighbours). "
        "Both paths wrote the same bytes.",
        "",
        "C path (`batch/dense_chunk.py`, `_denselines.c`):",
        "",
        "| stage | us/row (CPU) | share |",
        "| --- | ---: | ---: |",
        *c_rows,
        f"| **total** | **{c_total:.2f}** | |",
        "",
        "Python path (the general loop's NumPy fast path, used without the C helper):",
        "",
        "| stage | us/row (CPU) | share |",
        "| --- | ---: | ---: |",
        *py_rows,
        f"| **total** | **{py_total:.2f}** | |",
        "",
        f"Model alone (the ceiling's work): {c_model:.2f} us/row. With one worker per core the most a worker "
        f"can reach is model / total: **{c_model / c_total:.2f}x** of the ceiling on the C path, "
        f"{py_model / py_total:.2f}x on the Python path.",
        "",
        "Whole chunks (10,000 rows) through `work.process_chunk`, parts committed:",
        "",
        "| path | us/row (CPU) | us/row (wall, shared machine) |",
        "| --- | ---: | ---: |",
        *[f"| {k} | {cpu:.2f} | {wall:.2f} |" for k, (cpu, wall) in chunks.items()],
        "",
    ])
    print(text)
    results = ROOT / "results"
    results.mkdir(exist_ok=True)
    (results / "batch_breakdown.md").write_text(text)


if __name__ == "__main__":
    main()
