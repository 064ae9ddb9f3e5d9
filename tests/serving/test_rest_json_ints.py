"""Integer-only REST bodies take a fast path (numbers read from the text): same arrays and errors as the general one."""
from __future__ import annotations

import numpy as np
import orjson
import pytest
import tensorflow as tf

from modelyard.errors import ServingError
from modelyard.serving import rest_json
from modelyard.serving.signatures import Signature, TensorSpec

BODIES = [
    b'{"instances":[[1,2],[3,4]]}',
    b'{ "instances" : [ [ 1 , 2 ] ,\n [ 3 , 4 ] ] } ',
    b'{"instances":[1,2,3]}',
    b'{"instances":[[[0,255],[7,8]],[[9,10],[11,12]]]}',
    b'{"instances":[[1,2],[3]]}',  # ragged
    b'{"instances":[[1,2,3],[4,5,6,7],[8,9]]}',  # ragged with the right count of brackets
    b'{"instances":[[1,[2]],[3,4]]}',  # a list where a number belongs
    b'{"instances":[[1,2],[[3],4]]}',
    b'{"instances":[[1,2],3]}',
    b'{"instances":[1,[2,3]]}',
    b'{"instances":[[],[]]}',
    b'{"instances":[-1,256]}',  # out of range for uint8
    b'{"instances":[9223372036854775807]}',  # int64's limits, and beyond
    b'{"instances":[9223372036854775808]}',
    b'{"instances":[-9223372036854775809,1]}',
]
DTYPES = [tf.uint8, tf.int32, tf.int64, tf.float32]


def _signature(dtype: tf.DType) -> Signature:
    spec = TensorSpec("x", "x:0", dtype.as_datatype_enum, None)
    return type("Sig", (), {"inputs": {"x": spec}})()


def _outcome(body: bytes, dtype: tf.DType, fast: bool):
    instances = orjson.loads(body)["instances"]
    text = rest_json.int_instances_text(body) if fast else None
    try:
        array = rest_json.inputs_from_instances(instances, _signature(dtype), text)["x"]
    except ServingError as exc:
        return ("error", exc.code, exc.message)
    return ("array", array.dtype.str, array.shape, array.tobytes())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_fast_path_gives_the_general_paths_answer(body, dtype, monkeypatch):
    assert rest_json.int_instances_text(body) is not None
    expected = _outcome(body, dtype, fast=False)
    assert _outcome(body, dtype, fast=True) == expected
    monkeypatch.setattr(rest_json, "_FROM_TEXT", None)  # a NumPy without text-mode fromstring
    assert _outcome(body, dtype, fast=True) == expected


def test_only_integer_bodies_take_it():
    for body in (b'{"instances":[1.5]}', b'{"instances":[true]}', b'{"instances":5}',
                 b'{"signature_name":"x","instances":[1]}', b'{"inputs":[1]}'):
        assert rest_json.int_instances_text(body) is None, body
    assert rest_json.int_instances_text(b'{"instances":[[1, 2]]}') == b"[[1, 2]]"
    out = rest_json.inputs_from_instances([[1, 2]], _signature(tf.uint8), b"[[1, 2]]")["x"]
    assert out.dtype == np.uint8 and out.tolist() == [[1, 2]]
