"""What reading a REST predict body costs: the C reader (``_numjson``) against the general parser.

    python3 bench/rest_json_parse.py     # prints the table, writes bench/results/rest_json_parse.md

One 28×28 image per body, written the ways clients write it: uint8 pixels as integers, and
pixels scaled to [0, 1] as floats with few digits, as float32 reprs, and as full double reprs
(16-17 digits: a 17-digit significand exceeds 2^53, so the C reader stops at the first one
and the general parser reads the body). Each row times body bytes -> the float32 input array the model gets
(``parse_predict`` + ``predict_inputs``, as the REST server calls them), best of ``--repeats``.
The last row is the uint8 image as Vertex AI's SDK sends it (every pixel a double, ``0.0``), read
under ``--json_numbers vertex`` (the platform's replicas): integral doubles become uint8.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import timeit

import numpy as np
from harness import RESULTS, log, machine, markdown_table, write_results

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def bodies() -> list[tuple[str, str, bytes, bool]]:
    """(label, input dtype, body, under the vertex number rule) for each way of writing one image."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (1, 28, 28))
    scaled = pixels / 255.0

    def body(values) -> bytes:
        return json.dumps({"instances": values}).encode()

    return [
        ("uint8 pixels as integers", "uint8", body(pixels.tolist()), False),
        ("pixels/255, 4 decimals", "float32", body(np.round(scaled, 4).tolist()), False),
        ("pixels/255 as float32 reprs (≤ 9 digits)", "float32",
         body([[[float(str(np.float32(v))) for v in row] for row in scaled[0]]]), False),
        ("pixels/255 as double reprs (16-17 digits)", "float32", body(scaled.tolist()), False),
        ("uint8 pixels as doubles (0.0), vertex rule", "uint8", body(pixels.astype(np.float64).tolist()), True),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--number", type=int, default=2000, help="parses per timing (default 2000)")
    p.add_argument("--repeats", type=int, default=5, help="timings per cell; the best is reported (default 5)")
    p.add_argument("--out", default=str(RESULTS), help="directory for rest_json_parse.md")
    args = p.parse_args(argv)

    started_on = machine()
    import tensorflow as tf

    from modelyard.serving.protocol import rest_json
    from modelyard.model.signatures import TensorSpec

    reader = rest_json._numjson
    if reader is None:
        print("the C reader (_numjson) was not built: reinstall modelyard with a C compiler", file=sys.stderr)
        return 1
    rows = []
    for label, dtype, body, integral in bodies():
        spec = TensorSpec("x", "x:0", tf.as_dtype(dtype).as_datatype_enum, None)
        sig = type("Signature", (), {"inputs": {"x": spec}})()

        def read() -> None:
            _, key, payload = rest_json.parse_predict(body)
            rest_json.predict_inputs(key, payload, sig, integral)

        cells = {}
        for name, module in (("C reader", reader), ("general parser", None)):
            rest_json._numjson = module
            try:
                read()  # warm, and fail loudly on a bad body
                cells[name] = min(timeit.repeat(read, number=args.number, repeat=args.repeats)) / args.number * 1e6
            finally:
                rest_json._numjson = reader
        taken = reader.read_number_body(body) is not None
        rows.append((label, len(body), dtype, taken, cells["C reader"], cells["general parser"]))
        log(f"{label}: C {cells['C reader']:.1f} µs, general {cells['general parser']:.1f} µs")

    table = markdown_table(
        ["body", "bytes", "input dtype", "C reader takes it", "C reader µs", "general parser µs", "speed-up"],
        [[label, f"{size:,}", dtype, "yes" if taken else "no", f"{fast:.1f}", f"{general:.1f}", f"{general / fast:.2f}×"]
         for label, size, dtype, taken, fast, general in rows], align="lrllrrr")
    lines = [
        "# REST body reading: the C reader against the general parser",
        "",
        f"`python3 bench/rest_json_parse.py` on {started_on}: "
        f"body bytes to the model's input array (`parse_predict` + `predict_inputs`) for one 28×28 image, "
        f"µs per body, best of {args.repeats} timings of {args.number:,}.",
        "",
        table,
    ]
    write_results("rest_json_parse", "\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
