"""Must-show 1: size and accuracy cost of each post-training mode on the demo digits model."""
from __future__ import annotations

import json

import numpy as np

from modelyard.cli import main


def test_float_model_matches_original(demo_reports):
    none = demo_reports["none"]
    assert none.top1_agreement == 1.0
    assert none.max_abs_diff < 1e-4
    assert none.accuracy_drop_points == 0.0
    assert none.original_accuracy > 0.9


def test_dynamic_is_small_and_accurate(demo_reports):
    dynamic = demo_reports["dynamic"]
    assert dynamic.size_pct_of_float <= 30.0
    assert dynamic.accuracy_drop_points <= 0.5


def test_float16_halves_the_file(demo_reports):
    float16 = demo_reports["float16"]
    assert float16.size_pct_of_float <= 55.0
    assert float16.accuracy_drop_points <= 0.5


def test_int8_with_uint8_io_runs_in_litert(demo_reports, demo_prepared):
    from modelyard.edge.modes import ConvertOptions
    from modelyard.edge.runtime import LiteModel

    int8 = demo_reports["int8"]
    assert int8.io_dtype == "uint8"
    assert int8.accuracy_drop_points <= 1.0
    assert int8.latency_us > 0

    content = demo_prepared.convert(ConvertOptions("int8", "uint8"))
    lite = LiteModel(content)
    (image,) = lite.inputs.values()
    (probs,) = lite.outputs.values()
    assert image["dtype"] == np.uint8 and probs["dtype"] == np.uint8  # integer I/O end to end


def test_reports_are_json(demo_reports):
    from modelyard.edge.report import format_table, to_json

    rows = json.loads(to_json(list(demo_reports.values())))
    assert [r["mode"] for r in rows] == ["none", "dynamic", "float16", "int8"]
    table = format_table(list(demo_reports.values()))
    assert "dynamic" in table and "% float" in table


def test_cli_writes_dynamic_file(demo_base, tmp_path, capsys):
    out = tmp_path / "mnist.tflite"
    code = main(["convert", f"{demo_base}:1", "-o", str(out), "--quantize", "dynamic",
                 "--eval-data", "digits", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)[0]
    assert out.stat().st_size == report["size_bytes"]
    assert report["mode"] == "dynamic" and report["accuracy"] > 0.9
