"""Where a batch-predict worker's time goes per row: CPU microseconds per stage, C path vs Python path.

    python3 bench/batch_breakdown.py                # 20,000 digits lines, 5 passes, batch 256
    python3 bench/batch_breakdown.py --rows 50000 --batch-size 1024

The machine is shared, so wall time mostly measures the neighbours: every figure here is
CPU time of the worker's thread (``time.thread_time``), per row, and apart from it the CPU of
the part writer's thread. Two pipelines over the same generated JSONL of demo-digits instances
(28x28 uint8 as compact nested lists, ~2.1 KB a line), the model on the runtime ``batch-predict`` loads (LiteRT where it matches TF):

* C path (``batch/dense_chunk``): map the file, parse a batch of lines in C (uint8 values
  straight into the model's input, 64 bytes at a time), the model, one orjson dump of the
  batch's predictions, C assembles the output lines into the part writer's buffer, whose
  thread writes them (``O_DIRECT``) while this one goes on;
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
from harness import machine, take_turns, write_results  # noqa: E402

clock = time.thread_time  # this thread's CPU; the part writer's thread is counted apart


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
    import mmap

    from modelyard.batch import _denselines, dense_chunk
    from modelyard.batch.part_writer import PartWriter

    dense = predictor.dense
    buffers = dense_chunk._Buffers()
    buffers.sized(batch * dense.size, batch)

    def read() -> memoryview:
        with open(path, "rb") as f:
            return memoryview(mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                                        prot=mmap.PROT_READ))

    data = stages.timed("read", read)
    out = PartWriter(out_path)
    threads_before = time.process_time() - clock()

    def assemble(n: int, encoded) -> None:
        written = _denselines.assemble(data, buffers.spans, n, encoded, out.buffer, out.offset)
        if written < 0:
            out.room(-written)
            written = _denselines.assemble(data, buffers.spans, n, encoded, out.buffer, out.offset)
        out.offset = written

    pos, size = 0, len(data)
    while pos < size:
        n, pos, x, _ = stages.timed("parse", dense_chunk._parse, data, pos, size, dense, buffers, batch, True)
        outputs = stages.timed("model", predictor.servable.run, predictor.signature, {dense.alias: x},
                               predictor.aliases)
        encoded = stages.timed("format", predictor.encode_batch, outputs, n)
        stages.timed("assemble", assemble, n, encoded)
    stages.timed("write (waits)", out.close)
    # the part writer's thread: its CPU is the process's less this (main) thread's
    stages.seconds["write (writer thread)"] = (stages.seconds.get("write (writer thread)", 0.0)
                                               + time.process_time() - clock() - threads_before)


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
    started_on = machine()
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
        paths = {"C": lambda: c_path(predictor, data, args.batch_size, tmp / "c.out", c_stages),
                 "Python": lambda: python_path(predictor, data, args.batch_size, tmp / "py.out", py_stages)}
        # Taking turns, so both see the same neighbours.
        take_turns(list(paths), args.passes, lambda side, _k: paths[side]() or {}, report=lambda *_: None)
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
        f"on {started_on}: demo digits model on {predictor.runtime}, "
        f"28x28 uint8 instances as JSON lines (~2.1 KB each), CPU microseconds per row of one worker's thread "
        f"(shared machine, load average at the end {os.getloadavg()[0]:.1f}; wall time would measure the "
        "neighbours). "
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
    write_results("batch_breakdown", text)


if __name__ == "__main__":
    main()
