"""Must-show 4: TF Serving's TF1 test model (reference variables; generated and its own) converts via the session path."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelyard.cli import main


@pytest.fixture(scope="module")
def half_plus_two(tfserving_testdata) -> Path:
    """TF1 half_plus_two's base path: generated, and TF Serving's own (read in place) where present."""
    return tfserving_testdata / "saved_model_half_plus_two_cpu"


@pytest.fixture(scope="module")
def converted(tmp_path_factory, half_plus_two):
    out = tmp_path_factory.mktemp("hp2") / "half_plus_two.tflite"
    # BASE:VERSION form, reading the test data in place.
    assert main(["convert", f"{half_plus_two}:123", "-o", str(out)]) == 0
    return out.read_bytes()


def test_session_fallback_is_used(half_plus_two):
    from modelyard.model.savedmodel import is_tf1_export
    from modelyard.model.signatures import read_signature
    from modelyard.edge.source import resolve_version_dir

    version_dir = resolve_version_dir(str(half_plus_two))
    signature = read_signature(version_dir)
    assert is_tf1_export(version_dir)
    assert list(signature.inputs) == ["x"] and list(signature.outputs) == ["y"]


def test_computes_half_plus_two(converted):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=converted)
    (inp,) = interpreter.get_input_details()
    (out,) = interpreter.get_output_details()
    x = np.array([[2.0], [3.0], [4.0], [-10.0]], dtype=np.float32)
    interpreter.resize_tensor_input(inp["index"], list(x.shape))
    interpreter.allocate_tensors()
    interpreter.set_tensor(inp["index"], x)
    interpreter.invoke()
    np.testing.assert_allclose(interpreter.get_tensor(out["index"]), 0.5 * x + 2.0, rtol=1e-6)


def test_report_agrees_with_original(capsys, half_plus_two):
    import json

    assert main(["convert", str(half_plus_two), "--compare", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in rows] == ["none", "dynamic", "float16"]  # int8 needs data
    assert all(r["max_abs_diff"] < 1e-2 for r in rows)
