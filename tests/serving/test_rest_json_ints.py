"""Integer-only REST bodies are read by a C reader (``_intjson``): same arrays and errors as the general parser."""
from __future__ import annotations

import random

import numpy as np
import orjson
import pytest
import tensorflow as tf

from modelyard.errors import ServingError
from modelyard.serving import rest_json

# The extension is optional at install (no C compiler: the general parser reads every body);
# .ci/run checks that CI's install built it, so these tests never skip there.
_intjson = pytest.importorskip("modelyard.serving._intjson", reason="the C reader was not built (no C compiler)")
from modelyard.serving.signatures import TensorSpec

BODIES = [
    b'{"instances":[[1,2],[3,4]]}',
    b'{ "instances" : [ [ 1 , 2 ] ,\n [ 3 , 4 ] ] } ',
    b'{"instances":[1,2,3]}',
    b'{"instances":[-0,0,-7]}',
    b'{"instances":[[[0,255],[7,8]],[[9,10],[11,12]]]}',
    b'{"signature_name":"serving_default","instances":[[1,2]]}',
    b'{"instances":[[1,2]],"signature_name":""}',
    b'{"inputs":[[1,2],[3,4]]}',
    b'{"inputs":7}',
    b'{"instances":7}',
    b'{"instances":[[1,2],[3]]}',  # ragged
    b'{"instances":[[1,2,3],[4,5,6,7],[8,9]]}',
    b'{"instances":[[1,[2]],[3,4]]}',  # a list where a number belongs
    b'{"instances":[[1,2],[[3],4]]}',
    b'{"instances":[[1,2],3]}',
    b'{"instances":[1,[2,3]]}',
    b'{"instances":[[],[]]}',
    b'{"instances":[]}',
    b'{"instances":[-1,256]}',  # out of range for uint8
    b'{"instances":[70000]}',  # out of range for int16
    b'{"instances":[123456789012345678]}',  # 18 digits: still read in C
    b'{"instances":[9223372036854775807]}',  # int64's limits, and beyond
    b'{"instances":[9223372036854775808]}',
    b'{"instances":[-9223372036854775809,1]}',
    b'{"instances":[1],"inputs":[1]}',
    b'{"instances":[1],"instances":[2]}',
    b'{"instances":[1.5]}',
    b'{"instances":[1e3]}',
    b'{"instances":[true]}',
    b'{"instances":[01]}',
    b'{"instances":[1,]}',
    b'{"instances":[1 2]}',
    b'{"instances":[1]} x',
    b'{"instances":[1]',
]
DTYPES = [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.uint64, tf.float16, tf.float32, tf.float64,
          tf.bool, tf.string]


def _signature(*dtypes: tf.DType):
    inputs = {f"x{i}": TensorSpec(f"x{i}", f"x{i}:0", d.as_datatype_enum, None) for i, d in enumerate(dtypes)}
    return type("Sig", (), {"inputs": inputs})()


def _outcome(body: bytes, sig):
    try:
        _, key, payload = rest_json.parse_predict(body)
        arrays = rest_json.predict_inputs(key, payload, sig)
    except ServingError as exc:
        return ("error", exc.code, exc.message)
    return [(k, a.dtype.str, a.shape, a.tobytes()) for k, a in sorted(arrays.items())]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_the_c_reader_answers_as_the_general_parser(dtype, monkeypatch):
    sigs = [_signature(dtype), _signature(dtype, tf.float32)]
    fast = [_outcome(body, sig) for body in BODIES for sig in sigs]
    monkeypatch.setattr(rest_json, "_intjson", None)  # as when installed without a C compiler
    general = [_outcome(body, sig) for body in BODIES for sig in sigs]
    for body, f, g in zip([b for b in BODIES for _ in sigs], fast, general):
        assert f == g, body


def test_which_bodies_the_c_reader_takes():
    assert _intjson.read_int_body(b'{"instances":[[1,-2],[3,4]]}')[:2] == ("instances", None)
    key, name, values, shape, lo, hi = _intjson.read_int_body(b' {"signature_name" : "s", "inputs":[[5]] } ')
    assert (key, name, shape, lo, hi) == ("inputs", "s", (1, 1), 5, 5)
    assert np.frombuffer(values, np.int64).tolist() == [5]
    taken = [b for b in BODIES if _intjson.read_int_body(b) is not None]
    assert taken == BODIES[:8] + [b'{"instances":[-1,256]}', b'{"instances":[70000]}',
                                  b'{"instances":[123456789012345678]}']
    for body in (b'{"signature_name":"a\\"b","instances":[1]}', b'{"instances":[1],"extra":1}', b"",
                 b'{"signature_name":5,"instances":[1]}', "{\"signature_name\":\"\xff\",\"instances\":[1]}".encode("latin-1"),
                 b'{"instances":' + b"[" * 40 + b"1" + b"]" * 40 + b"}"):
        assert _intjson.read_int_body(body) is None, body


def _mutations(rng: random.Random, body: bytes, count: int):
    alphabet = b'0123456789-[],. e"{}:\n'
    for _ in range(count):
        data = bytearray(body)
        for _ in range(rng.randint(1, 3)):
            op = rng.randrange(3)
            at = rng.randrange(len(data) + (op == 0))
            if op == 0:
                data.insert(at, rng.choice(alphabet))
            elif op == 1 and len(data) > 1:
                del data[at]
            elif data:
                data[at] = rng.choice(alphabet)
        yield bytes(data)


def test_whatever_the_c_reader_takes_is_valid_json_with_the_same_numbers():
    rng = random.Random(7)
    seeds = [b'{"instances":[[1,2,3],[40,-5,60]]}', b'{"signature_name":"s","inputs":[[[0],[7]],[[8],[9]]]}',
             b'{"instances":[0, 10, -200]}']
    taken = 0
    for seed in seeds:
        for body in _mutations(rng, seed, 3000):
            read = _intjson.read_int_body(body)
            if read is None:
                continue
            taken += 1
            doc = orjson.loads(body)  # raises if the C reader took something that is not JSON
            key, name, values, shape, lo, hi = read
            assert set(doc) <= {key, "signature_name"} and doc.get("signature_name") == name
            expected = np.asarray(doc[key])
            assert expected.dtype == np.int64 and expected.shape == shape, body
            assert np.frombuffer(values, np.int64).tolist() == expected.ravel().tolist(), body
            assert (lo, hi) == (expected.min(), expected.max())
    assert taken > 100  # the mutations did reach the success path
