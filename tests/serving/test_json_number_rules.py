"""One rule for JSON numbers meeting integer inputs (``model.dtypes``), through a real ``modelyard serve``.

TF Serving's rule (the default): ``300`` for a uint8 input is INVALID_ARGUMENT ("JSON Value out of
range"), ``255`` passes, ``0.0`` is refused as not an integer. Vertex AI's rule (``--json_numbers
vertex``, which the platform gives its replicas): integral numbers (``0.0``, ``3.0``, ``1e2``) are
integers, ``0.5`` is still INVALID_ARGUMENT, and the range rule is the same.
"""
from __future__ import annotations

import numpy as np
import pytest
import requests
import tensorflow as tf

from modelyard.model import dtypes
from tests.serving.server_process import ServerProcess


class _Ints(tf.Module):
    """uint8 pixels, int32 and int64 ids in; their sum as float out (so every input's value shows)."""

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.uint8, name="pixels")])
    def pixels(self, pixels):
        return {"total": tf.reduce_sum(tf.cast(pixels, tf.float32), axis=1)}

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int32, name="ids")])
    def ids32(self, ids):
        return {"total": tf.reduce_sum(tf.cast(ids, tf.float64), axis=1)}

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int64, name="ids")])
    def ids64(self, ids):
        return {"total": tf.reduce_sum(tf.cast(ids, tf.float64), axis=1)}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    base = tmp_path_factory.mktemp("ints") / "ints"
    module = _Ints()
    tf.saved_model.save(module, str(base / "1"), signatures={"serving_default": module.pixels,
                                                              "ids32": module.ids32, "ids64": module.ids64})
    return base


@pytest.fixture(scope="module")
def servers(base):
    """(TF Serving's rule, Vertex AI's rule): two real servers of the same model."""
    strict = ServerProcess("--model_base_path", str(base), "--model_name", "ints", log_dir=base.parent)
    vertex = ServerProcess("--model_base_path", str(base), "--model_name", "ints", "--json_numbers", "vertex",
                           log_dir=base.parent)
    try:
        yield strict.wait_ready(), vertex.wait_ready()
    finally:
        strict.stop()
        vertex.stop()


def _predict(server, instances, signature: str | None = None) -> requests.Response:
    body = {"instances": instances, **({"signature_name": signature} if signature else {})}
    return requests.post(server.base + "/v1/models/ints:predict", json=body, timeout=30)


def test_an_out_of_range_integer_is_invalid_argument_under_both_rules(servers):
    for server in servers:
        r = _predict(server, [[300, 0, 0]])
        assert r.status_code == 400, r.text
        assert "INVALID_ARGUMENT: JSON Value out of range for uint8 in input pixels" in r.json()["error"], r.text
        assert _predict(server, [[-1, 0, 0]]).status_code == 400
        ok = _predict(server, [[255, 255, 1]])
        assert ok.status_code == 200 and ok.json() == {"predictions": [511.0]}, ok.text
        r = _predict(server, [[2**31, 0]], "ids32")
        assert r.status_code == 400 and "out of range for int32" in r.json()["error"], r.text


def test_tf_servings_rule_refuses_integral_doubles(servers):
    strict, _ = servers
    r = _predict(strict, [[0.0, 3.0, 255.0]])
    assert r.status_code == 400
    assert "JSON Value: 0.0 Type: Number is not of expected type: uint8" in r.json()["error"], r.text


@pytest.mark.parametrize("signature,instances,total", [
    (None, [[0.0, 3.0, 1e2]], [103.0]),
    (None, [[255.0, -0.0, 1]], [256.0]),
    ("ids32", [[1e9, 7.0]], [1000000007.0]),
    ("ids64", [[2.0**40, 1.0]], [2.0**40 + 1]),
])
def test_vertex_rule_takes_integral_doubles_as_integers(servers, signature, instances, total):
    _, vertex = servers
    r = _predict(vertex, instances, signature)
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": total}


def test_vertex_rule_still_refuses_fractions_and_the_range(servers):
    _, vertex = servers
    r = _predict(vertex, [[0.5, 1.0, 2.0]])
    assert r.status_code == 400
    assert "JSON Value: 0.5 Type: Number is not of expected type: uint8" in r.json()["error"], r.text
    r = _predict(vertex, [[256.0, 0.0, 0.0]])
    assert r.status_code == 400 and "JSON Value out of range for uint8" in r.json()["error"], r.text
    r = _predict(vertex, [[1.5, 2.0]], "ids64")
    assert r.status_code == 400 and "1.5" in r.json()["error"], r.text


# ---- the rule itself, one layer down ---------------------------------------------------------------
@pytest.mark.parametrize("enum_value", [dtypes.DT_UINT8, dtypes.DT_INT8, dtypes.DT_INT32, dtypes.DT_INT64,
                                        dtypes.DT_UINT64])
def test_the_range_rule_at_each_integer_dtypes_edges(enum_value):
    low, high = dtypes.integer_limits(dtypes.to_numpy(enum_value))
    for inside in (low, high):
        assert dtypes.json_array(np.asarray([inside]), enum_value, "x").tolist() == [inside]
    for outside in (low - 1, high + 1):
        if not -2**63 <= outside < 2**64:
            continue  # no JSON integer NumPy reads as a number (the kind rule refuses it)
        with pytest.raises(dtypes.ValueRangeError, match="JSON Value out of range for .* in input x"):
            dtypes.json_array(np.asarray([outside]), enum_value, "x")


def test_integral_doubles_at_the_edges():
    as_u8 = lambda *v: dtypes.json_array(np.asarray(v, np.float64), dtypes.DT_UINT8, "x", True)  # noqa: E731
    assert as_u8(0.0, 255.0, -0.0).tolist() == [0, 255, 0]
    for bad in ((0.5,), (float("nan"),), (float("inf"),), (1e-300,)):
        with pytest.raises(dtypes.ValueKindError):
            as_u8(*bad)
    with pytest.raises(dtypes.ValueRangeError):
        as_u8(256.0)
    with pytest.raises(dtypes.ValueKindError):  # the default rule is TF Serving's
        dtypes.json_array(np.asarray([1.0]), dtypes.DT_UINT8, "x")
    # int64's edge: 2^63 is the first double past it
    assert dtypes.json_array(np.asarray([-2.0**63]), dtypes.DT_INT64, "x", True).tolist() == [-2**63]
    with pytest.raises(dtypes.ValueRangeError):
        dtypes.json_array(np.asarray([2.0**63]), dtypes.DT_INT64, "x", True)
