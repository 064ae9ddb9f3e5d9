"""Small pieces: option checks, atomic writes, data loading, per-channel dynamic weights."""
from __future__ import annotations

import json

import numpy as np
import pytest

from modelyard.cli import main
from modelyard.model.tflite import ConvertError
from modelyard.edge.modes import ConvertOptions
from modelyard.model import dtypes
from modelyard.model.signatures import PREDICT_METHOD, Signature, TensorSpec


def _signature(dtype=np.float32, shape=(-1, 4)) -> Signature:
    spec = TensorSpec("x", "x:0", dtypes.from_numpy(dtype), shape)
    y = TensorSpec("y", "y:0", dtypes.from_numpy(np.float32), (-1, 2))
    return Signature("serving_default", PREDICT_METHOD, {"x": spec}, {"y": y})


@pytest.mark.parametrize(
    "options, has_data, message",
    [
        (ConvertOptions("int8"), False, "--representative-data"),
        (ConvertOptions("dynamic", io_dtype="int8"), True, "--quantize int8"),
        (ConvertOptions("int4"), True, "unknown --quantize"),
    ],
)
def test_option_checks(options, has_data, message):
    with pytest.raises(ConvertError, match=message):
        options.check(has_data)


def test_valid_options_pass():
    ConvertOptions("int8", "uint8").check(True)
    ConvertOptions("float16").check(False)


def test_npz_with_labels_and_single_unnamed_array(tmp_path):
    from modelyard.edge.data import load_dataset

    path = tmp_path / "d.npz"
    np.savez(path, inputs=np.ones((5, 4), np.float32), labels=np.arange(5))
    data = load_dataset(str(path), _signature())
    assert len(data) == 5 and list(data.inputs) == ["x"] and data.labels.tolist() == [0, 1, 2, 3, 4]


def test_label_count_must_match(tmp_path):
    from modelyard.edge.data import load_dataset

    path = tmp_path / "d.npz"
    np.savez(path, x=np.ones((5, 4), np.float32), labels=np.arange(3))
    with pytest.raises(ConvertError, match="3 labels for 5 samples"):
        load_dataset(str(path), _signature())


def test_missing_data_file():
    from modelyard.edge.data import load_dataset

    with pytest.raises(ConvertError, match="does not exist"):
        load_dataset("/nonexistent/d.npz", _signature())


def test_digits_need_matching_signature():
    from modelyard.edge.data import load_dataset

    with pytest.raises(ConvertError, match="dtype mismatch"):
        load_dataset("digits", _signature())  # float [-1, 4] vs uint8 images


def test_write_version_is_atomic_and_numbered(tmp_path):
    from modelyard.edge.source import write_tflite_version

    base = tmp_path / "m"
    (base / "0007").mkdir(parents=True)  # an existing version: the next one is 8
    written = write_tflite_version(b"abc", base)
    assert written.name == "0008" and (written / "model.tflite").read_bytes() == b"abc"
    assert sorted(p.name for p in base.iterdir()) == ["0007", "0008"]  # no temporary left behind


def test_dynamic_weights_are_symmetric_per_channel_int8(demo_prepared):
    from ai_edge_litert.interpreter import Interpreter

    content = demo_prepared.convert(ConvertOptions("dynamic"))
    weights = [t for t in Interpreter(model_content=content).get_tensor_details() if t["dtype"] == np.int8]
    assert weights, "dynamic mode should store int8 weights"
    for tensor in weights:
        params = tensor["quantization_parameters"]
        assert len(params["scales"]) == tensor["shape"][0]  # one scale per output channel
        assert not params["zero_points"].any()  # symmetric


def test_compare_cli_writes_json_file(demo_base, tmp_path, capsys):
    target = tmp_path / "report.json"
    assert main(["convert", f"{demo_base}:1", "--compare", "--representative-data", "digits",
                 "--json", str(target)]) == 0
    table = capsys.readouterr().out
    assert "float16" in table and "int8" in table
    rows = json.loads(target.read_text())
    assert [r["mode"] for r in rows] == ["none", "dynamic", "float16", "int8"]
    # Version 1 is the single 100-unit hidden layer model: the must-show bounds hold there too.
    by_mode = {r["mode"]: r for r in rows}
    assert by_mode["dynamic"]["size_pct_of_float"] <= 30 and by_mode["dynamic"]["accuracy_drop_points"] <= 0.5
    assert by_mode["float16"]["size_pct_of_float"] <= 55
    assert by_mode["int8"]["io_dtype"] == "uint8" and by_mode["int8"]["accuracy_drop_points"] <= 1.0
    assert not any(p.suffix == ".tflite" for p in tmp_path.iterdir())  # --compare writes no model


@pytest.mark.parametrize(
    "argv",
    [
        ["convert", "m"],  # nowhere to write
        ["convert", "m", "--compare", "-o", "x.tflite"],
        ["convert", "m.keras", "--qat", "--quantize", "float16", "-o", "x.tflite"],
    ],
)
def test_contradictory_flags_are_usage_errors(argv, capsys):
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err
