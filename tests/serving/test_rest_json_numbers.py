"""All-numbers REST bodies are read by a C reader (``_numjson``): same arrays and errors as the general parser."""
from __future__ import annotations

import random

import numpy as np
import orjson
import pytest
import tensorflow as tf

from modelyard.errors import ServingError
from modelyard.serving.protocol import rest_json

# The extension is optional at install (no C compiler: the general parser reads every body);
# .ci/run checks that CI's install built it, so these tests never skip there.
_numjson = pytest.importorskip("modelyard.serving.protocol._numjson", reason="the C reader was not built (no C compiler)")
from modelyard.model.signatures import TensorSpec

# (body, whether the C reader takes it)
CASES = [
    (b'{"instances":[[1,2],[3,4]]}', True),
    (b'{ "instances" : [ [ 1 , 2 ] ,\n [ 3 , 4 ] ] } ', True),
    (b'{"instances":[1,2,3]}', True),
    (b'{"instances":[-0,0,-7]}', True),
    (b'{"instances":[[[0,255],[7,8]],[[9,10],[11,12]]]}', True),
    (b'{"signature_name":"serving_default","instances":[[1,2]]}', True),
    (b'{"instances":[[1,2]],"signature_name":""}', True),
    (b'{"inputs":[[1,2],[3,4]]}', True),
    (b'{"inputs":7}', False),
    (b'{"instances":7}', False),
    (b'{"instances":[[1,2],[3]]}', False),  # ragged
    (b'{"instances":[[1,2,3],[4,5,6,7],[8,9]]}', False),
    (b'{"instances":[[1,[2]],[3,4]]}', False),  # a list where a number belongs
    (b'{"instances":[[1,2],[[3],4]]}', False),
    (b'{"instances":[[1,2],3]}', False),
    (b'{"instances":[1,[2,3]]}', False),
    (b'{"instances":[[],[]]}', False),
    (b'{"instances":[]}', False),
    (b'{"instances":[-1,256]}', True),  # out of range for uint8
    (b'{"instances":[70000]}', True),  # out of range for int16
    (b'{"instances":[123456789012345678]}', True),  # 18 digits: still read in C
    (b'{"instances":[9223372036854775807]}', False),  # int64's limits, and beyond
    (b'{"instances":[9223372036854775808]}', False),
    (b'{"instances":[-9223372036854775809,1]}', False),
    (b'{"instances":[1],"inputs":[1]}', False),
    (b'{"instances":[1],"instances":[2]}', False),
    (b'{"instances":[true]}', False),
    (b'{"instances":[01]}', False),
    (b'{"instances":[1,]}', False),
    (b'{"instances":[1 2]}', False),
    (b'{"instances":[1]} x', False),
    (b'{"instances":[1]', False),
    # fractions and exponents: float64, the integers among them converted exactly
    (b'{"instances":[1.5]}', True),
    (b'{"instances":[1e3]}', True),
    (b'{"instances":[[0.5,-2.25],[1e-3,3E+2]]}', True),
    (b'{"instances":[1,2.5,-0]}', True),
    (b'{"instances":[-0.0,0.0,-0e0]}', True),
    (b'{"inputs":[[0.1,0.2],[0.3000000000000001,1e-7]],"signature_name":"serving_default"}', True),
    # past Clinger's fast path (17 digits, 10^23, 10^-23): the general path reads the body
    (b'{"inputs":[[0.1,0.2],[0.30000000000000004,1e-7]]}', False),
    (b'{"instances":[0.5,1e23]}', False),
    (b'{"instances":[0.5,1e-23]}', False),
    (b'{"instances":[1e22,1e-22,9007199254740992e0,-9007199254740992e-22]}', True),
    (b'{"instances":[9007199254740993e0]}', False),
    (b'{"instances":[[1.5],[2]]}', True),
    (b'{"instances":[255.0,-1.0]}', True),  # whole-valued fractions: still fractions for an integer input
    (b'{"instances":[3.4028235e22,65504.0,65520.5,1e5]}', True),  # float16's largest, and past it
    (b'{"instances":[3.4028235e38,3.5e38]}', False),  # float32's: past the fast path
    (b'{"instances":[9007199254740992,0.5]}', True),  # 2^53: exact as a double
    (b'{"instances":[9007199254740993,0.5]}', False),  # 2^53 + 1 is not
    (b'{"instances":[0.5,9007199254740993]}', False),
    (b'{"instances":[1e400]}', False),  # overflow and underflow: the general path decides
    (b'{"instances":[1e-400]}', False),
    (b'{"instances":[2.5e-320]}', False),
    (b'{"instances":[0.12345678901234567890123456789012345678901234567890123456789012345]}', False),  # 67 chars
    (b'{"instances":[1.]}', False),
    (b'{"instances":[.5]}', False),
    (b'{"instances":[1e]}', False),
    (b'{"instances":[1e+]}', False),
    (b'{"instances":[-]}', False),
    (b'{"instances":[+1]}', False),
    (b'{"instances":[0x10]}', False),
    (b'{"instances":[1.5,true]}', False),
    (b'{"instances":[NaN]}', False),
    (b'{"instances":[Infinity,1.5]}', False),
    (b'{"instances":[[1.5,2],[3]]}', False),
]
BODIES = [body for body, _ in CASES]
DTYPES = [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.uint64, tf.float16, tf.float32, tf.float64,
          tf.complex64, tf.bool, tf.string]


def _signature(*dtypes: tf.DType):
    inputs = {f"x{i}": TensorSpec(f"x{i}", f"x{i}:0", d.as_datatype_enum, None) for i, d in enumerate(dtypes)}
    return type("Sig", (), {"inputs": inputs})()


def _outcome(body: bytes, sig, integral: bool = False):
    try:
        _, key, payload = rest_json.parse_predict(body)
        arrays = rest_json.predict_inputs(key, payload, sig, integral)
    except ServingError as exc:
        return ("error", exc.code, exc.message)
    return [(k, a.dtype.str, a.shape, a.tobytes()) for k, a in sorted(arrays.items())]


# Whole-valued numbers written as doubles (what Vertex AI's SDK sends for a uint8 image), and their neighbours.
INTEGRAL_BODIES = [b'{"instances":[[0.0,255.0],[3.0,1e2]]}', b'{"instances":[-0.0,1E1,2.50e1]}',
                   b'{"instances":[256.0,0.0]}', b'{"instances":[-1.0]}', b'{"instances":[0.5,1.0]}',
                   b'{"instances":[1,2.0,3]}', b'{"instances":[9007199254740992.0]}', b'{"inputs":[[1e3,7.0]]}']


# Past float16's or float32's range a value casts to infinity, on either path, and NumPy warns.
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("integral", [False, True], ids=["tf_serving", "vertex"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_the_c_reader_answers_as_the_general_parser(dtype, integral, monkeypatch):
    sigs = [_signature(dtype), _signature(dtype, tf.float32)]
    bodies = BODIES + INTEGRAL_BODIES
    fast = [_outcome(body, sig, integral) for body in bodies for sig in sigs]
    monkeypatch.setattr(rest_json, "_numjson", None)  # as when installed without a C compiler
    general = [_outcome(body, sig, integral) for body in bodies for sig in sigs]
    for body, f, g in zip([b for b in bodies for _ in sigs], fast, general):
        assert f == g, body


def test_which_bodies_the_c_reader_takes():
    assert _numjson.read_number_body(b'{"instances":[[1,-2],[3,4]]}')[:2] == ("instances", None)
    key, name, values, shape, lo, hi, floating, integral = _numjson.read_number_body(
        b' {"signature_name" : "s", "inputs":[[5]] } ')
    assert (key, name, shape, lo, hi, floating, integral) == ("inputs", "s", (1, 1), 5, 5, False, True)
    assert np.frombuffer(values, np.int64).tolist() == [5]
    key, name, values, shape, _, _, floating, integral = _numjson.read_number_body(b'{"instances":[[7,-0.5],[1e2,0]]}')
    assert (shape, floating, integral) == ((2, 2), True, False)
    assert np.frombuffer(values, np.float64).tolist() == [7.0, -0.5, 100.0, 0.0]
    # whole doubles (the vertex rule's integers): their extremes, as for integers
    _, _, values, shape, lo, hi, floating, integral = _numjson.read_number_body(b'{"instances":[[7,-0.0],[1e2,-3.0]]}')
    assert (shape, lo, hi, floating, integral) == ((2, 2), -3, 100, True, True)
    assert [body for body, _ in CASES if _numjson.read_number_body(body) is not None] == \
        [body for body, taken in CASES if taken]
    for body in (b'{"signature_name":"a\\"b","instances":[1]}', b'{"instances":[1],"extra":1}', b"",
                 b'{"signature_name":5,"instances":[1]}', "{\"signature_name\":\"\xff\",\"instances\":[1]}".encode("latin-1"),
                 b'{"instances":' + b"[" * 40 + b"1" + b"]" * 40 + b"}"):
        assert _numjson.read_number_body(body) is None, body


HARD_NUMBERS = [
    "9007199254740992e22", "9007199254740993e0", "9007199254740993.0", "1e22", "1e23", "1e-22", "1e-23",
    "123456789012345678.9", "0.1", "0.3", "-0.0", "0e400", "-0e-400", "5e-324", "2.2250738585072011e-308",
    "2.2250738585072014e-308", "1.7976931348623157e308", "1.7976931348623159e308", "0.000000000000000000001",
    "4.35679e-7", "3.0000000000000004", "9.999999999999999e22", "8.98846567431158e307", "123.456e-2",
    "1E+2", "1e-0", "7.0e+00", "0.1e1", "1.00000000000000011102230246251565404236316680908203125",
    "1.00000000000000011102230246251565404236316680908203124", "2.0000000000000002220446049250313080847263336181640625",
]


def test_each_number_is_the_double_python_reads():
    taken = 0
    for text in HARD_NUMBERS:
        read = _numjson.read_number_body(b'{"instances":[%s]}' % text.encode())
        if read is None:  # past the fast path: the general path reads it (compared in the tests above and below)
            continue
        taken += 1
        value = np.frombuffer(read[2], np.float64)[0]
        assert value.tobytes() == np.float64(float(text)).tobytes(), text
    assert taken >= 15


def _float_texts(rng: random.Random, count: int, short: bool) -> list[str]:
    """Numbers as clients write them. ``short``: what the C reader computes itself (few digits,
    powers of ten within 22); else also 17-digit reprs, far exponents and more digits than a
    double holds (where only correct rounding gives Python's value)."""
    texts = []
    for _ in range(count):
        if short:
            x = rng.choice([rng.random(), rng.uniform(-1, 1), rng.uniform(-1e4, 1e4), rng.gauss(0, 1e-3)])
            style = rng.choice([2, 3, 5])
        else:
            x = rng.choice([rng.random(), rng.uniform(-1e6, 1e6), 10.0 ** rng.uniform(-300, 300) * rng.choice([-1, 1])])
            style = rng.randrange(6)
        if style == 0:
            texts.append(repr(x))
        elif style == 1:
            texts.append(f"{x:.17g}")
        elif style == 2:
            texts.append(f"{x:.{rng.randint(1, 9)}e}".replace("e", rng.choice("eE")))
        elif style == 3:
            texts.append(f"{x:.{rng.randint(0, 11)}f}" if abs(x) < 1e4 else repr(x))
        elif style == 4:  # halfway-ish: long decimal expansions
            digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(18, 40)))
            texts.append(f"{rng.choice(['', '-'])}0.{digits}e{rng.randint(-30, 30)}")
        else:
            texts.append(str(rng.randint(-10**6, 10**6)))
    return [t for t in texts if "inf" not in t and "nan" not in t]


@pytest.mark.parametrize("dtype", [tf.float16, tf.float32, tf.float64, tf.complex64], ids=lambda d: d.name)
def test_fractions_read_in_c_equal_the_general_parser_bit_for_bit(dtype, monkeypatch):
    rng = random.Random(dtype.as_datatype_enum)
    sig = _signature(dtype)
    bodies = []
    for _ in range(60):
        rows, cols = rng.randint(1, 4), rng.randint(1, 30)
        texts = _float_texts(rng, rows * cols, short=len(bodies) % 2 == 0)
        cols = max(1, len(texts) // rows)
        grid = [texts[r * cols:(r + 1) * cols] for r in range(rows)]
        bodies.append(('{"instances":[' + ",".join("[" + ",".join(row) + "]" for row in grid) + "]}").encode())
    assert sum(_numjson.read_number_body(b) is not None for b in bodies) >= 25  # the C reader took the short ones
    with np.errstate(over="ignore"):
        fast = [_outcome(body, sig) for body in bodies]
        monkeypatch.setattr(rest_json, "_numjson", None)
        general = [_outcome(body, sig) for body in bodies]
    for body, f, g in zip(bodies, fast, general):
        assert f == g, body


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
             b'{"instances":[0, 10, -200]}', b'{"instances":[[0.5,-1e3,2],[1.25E-2,0,-0.0]]}',
             b'{"instances":[[3.0,-1e3,2],[1.25E2,0,-0.0]]}']
    taken = floating_taken = integral_taken = 0
    for seed in seeds:
        for body in _mutations(rng, seed, 3000):
            read = _numjson.read_number_body(body)
            if read is None:
                continue
            taken += 1
            doc = orjson.loads(body)  # raises if the C reader took something that is not JSON
            key, name, values, shape, lo, hi, floating, integral = read
            assert set(doc) <= {key, "signature_name"} and doc.get("signature_name") == name
            expected = np.asarray(doc[key])
            assert expected.shape == shape, body
            if floating:
                floating_taken += 1
                assert expected.dtype == np.float64, body
                assert np.frombuffer(values, np.float64).tobytes() == expected.tobytes(), body
                whole = bool((np.trunc(expected) == expected).all() and np.abs(expected).max() <= 2**53)
                assert integral == whole, body
                if integral:
                    integral_taken += 1
                    assert (lo, hi) == (expected.min(), expected.max()), body
            else:
                assert expected.dtype == np.int64, body
                assert np.frombuffer(values, np.int64).tolist() == expected.ravel().tolist(), body
                assert (lo, hi) == (expected.min(), expected.max())
    assert taken > 100 and floating_taken > 50 and integral_taken > 20  # the mutations reached every success path
