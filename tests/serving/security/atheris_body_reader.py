"""Coverage-guided fuzzing (atheris / libFuzzer) of the REST body readers: the C numeric reader
(``_numjson.read_number_body``) and the general path behind it. Run by test_fuzz.py in its own
process (libFuzzer ends the process when done), with libFuzzer's flags on the command line.

A crash is a segfault or any exception but ``ServingError``. The C reader's answers are also
checked against the general parser: an all-numbers body it takes must give the same numbers.
atheris instruments the Python side; the C reader is fed the mutated bodies without coverage
of its own code (it is not built with -fsanitize=fuzzer), so it is fuzzed by mutation only.
"""
import sys

import atheris

import numpy as np

from modelyard.errors import ServingError
from modelyard.model import dtypes, signatures  # noqa: F401  (loaded uninstrumented: TensorFlow's protos behind them)
from modelyard.serving.protocol import _numjson  # C: nothing to instrument

with atheris.instrument_imports(include=["modelyard.serving.protocol.rest_json"]):
    from modelyard.serving.protocol import rest_json


def one_input(body: bytes) -> None:
    read = _numjson.read_number_body(body)
    if read is not None:
        key, name, values, shape, lo, hi, floating, integral = read
        count = int(np.prod(shape)) if shape else 1
        assert len(values) == 8 * count, (shape, len(values))
        fast = np.frombuffer(values, np.float64 if floating else np.int64).reshape(shape)
        try:
            doc = rest_json.loads(body)
        except ServingError:
            raise AssertionError(f"the C reader took a body the JSON parser refuses: {body[:200]!r}") from None
        general = np.asarray(doc[key], dtype=fast.dtype)
        assert general.shape == fast.shape and np.array_equal(general, fast, equal_nan=True), body[:200]
        # C's 'every value is whole' is what the vertex rule trusts for integer inputs: it must be true.
        if integral and floating and fast.size:
            assert np.all(np.isfinite(fast)) and np.array_equal(np.floor(fast), fast), body[:200]
    try:
        rest_json.parse_predict(body)
    except ServingError:
        pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
