"""Fuzzing, bounded so it runs in CI (issue 19, point 3).

In process, with hypothesis: the REST JSON reader (both the C numeric reader and the general
path) and the TensorProto reader may only answer a ``ServingError``, never crash or raise
anything else (which the server would answer 500). On the wire: mutated and random HTTP/1.1
requests and HTTP/2 frame sequences at the plain (default) server: no 5xx, no error logged,
the server answers normal calls afterwards and its memory comes back near where it was.
Crash inputs found are kept below as regression cases (``FOUND``).
"""
from __future__ import annotations

import json
import random
import socket
import struct

import hpack
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorflow.core.framework import tensor_pb2

from modelyard.errors import ServingError
from modelyard.model import tensor_proto
from modelyard.model.signatures import Signature, TensorSpec
from modelyard.serving.protocol import rest_json
from tests.serving.security import raw_h2 as h2
from tests.serving.security.clients import channel, predict

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

DT_FLOAT, DT_INT32, DT_STRING, DT_INT64, DT_BOOL = 1, 3, 7, 9, 10


def _sig(*specs: tuple[str, int, tuple | None]) -> Signature:
    inputs = {alias: TensorSpec(alias, f"{alias}:0", dtype, shape) for alias, dtype, shape in specs}
    return Signature("serving_default", "tensorflow/serving/predict", inputs,
                     {"y": TensorSpec("y", "y:0", DT_FLOAT, (-1,))})


SIGNATURES = [
    _sig(("x", DT_FLOAT, (-1,))),
    _sig(("x", DT_INT32, (-1, 2))),
    _sig(("x", DT_STRING, None)),
    _sig(("a", DT_INT64, (-1,)), ("b", DT_BOOL, (-1,))),
]

# Inputs that once crashed a reader (kept as regression cases).
FOUND = [
    b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # RecursionError in json's fallback
    b'{"instances": ' + b"[" * 1000 + b"1" + b"]" * 1000 + b"}",  # RecursionError walking the lists
    b'{"instances": ' + b"[" * 64 + b'"a"' + b"]" * 64 + b"}",  # NumPy's 32-dimension iterator limit
]


def _read_rest(body: bytes) -> None:
    for sig in SIGNATURES:
        try:
            name, key, payload = rest_json.parse_predict(body)
            rest_json.predict_inputs(key, payload, sig)
        except ServingError:
            pass
    for method in ("classify", "regress"):
        try:
            rest_json.parse_examples(body, method)
        except ServingError:
            pass


@pytest.mark.parametrize("body", FOUND, ids=["deep-brackets", "deep-number", "rank-64-string"])
def test_found_crash_inputs_answer_serving_errors(body):
    _read_rest(body)


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                     st.text(max_size=8), st.fixed_dictionaries({"b64": st.text(max_size=8)}))
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.sampled_from(["x", "a", "b", "b64", "instances", "inputs", "signature_name", "examples", "context"]),
    inner, max_size=3), max_leaves=30)


@FUZZ
@given(st.one_of(
    st.binary(max_size=200),
    st.text(alphabet='[]{},:"0123456789.eE-+ tfnaulrsic\\', max_size=120).map(str.encode),
    st.builds(lambda key, value: json.dumps({key: value}).encode(),  # NaN and big ints included
              st.sampled_from(["instances", "inputs", "examples"]), _json),
    st.builds(lambda prefix, depth, leaf: prefix + b"[" * depth + leaf + b"]" * depth + b"}",
              st.sampled_from([b'{"instances": ', b'{"inputs": ', b'{"inputs": {"x": ']),
              st.one_of(st.integers(0, 40), st.sampled_from([63, 64, 65, 1023, 1025, 3000])), st.sampled_from([b"1", b"1.5", b'"s"', b"true", b'{"b64": "YQ=="}', b""])),
))
def test_rest_json_reader_fuzz(body):
    _read_rest(body)


_dims = st.lists(st.integers(-3, 2**40), max_size=5)


@FUZZ
@given(st.one_of(
    st.binary(max_size=200),
    st.builds(lambda dtype, dims, floats, strings, content: _tensor(dtype, dims, floats, strings, content),
              st.integers(-1, 30), _dims, st.lists(st.floats(), max_size=4), st.lists(st.binary(max_size=4), max_size=3),
              st.binary(max_size=64)),
))
def test_tensor_proto_reader_fuzz(data):
    previous = tensor_proto.max_decoded_bytes
    tensor_proto.set_max_decoded_bytes(1 << 20)  # in this process: fuzzing must not allocate gigabytes
    try:
        try:
            proto = tensor_pb2.TensorProto.FromString(data)
        except DecodeError:
            return
        try:
            tensor_proto.to_ndarray(proto, "x")
        except ServingError:
            pass
    finally:
        tensor_proto.set_max_decoded_bytes(previous)


def _tensor(dtype, dims, floats, strings, content) -> bytes:
    proto = tensor_pb2.TensorProto()
    proto.dtype = dtype
    for size in dims:
        proto.tensor_shape.dim.add(size=size)
    proto.float_val.extend(floats)
    proto.string_val.extend(strings)
    if content:
        proto.tensor_content = content
    return proto.SerializeToString()


# ---- on the wire -------------------------------------------------------------------------------------------
def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _exchange(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Send ``data``, half-close, and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
        return received


_VALID_HTTP = [
    b'POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
    b'Content-Length: 26\r\n\r\n{"instances": [1.0, 2.0]}\n',
    b"GET /v1/models/default HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/models/default/metadata HTTP/1.1\r\nHost: x\r\n\r\n",
    b'POST /v1/models/default:classify HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n'
    b'10\r\n{"examples": [{}\r\n2\r\n]}\r\n0\r\n\r\n',
    b"GET /monitoring/prometheus/metrics HTTP/1.1\r\nHost: x\r\n\r\n",
]
_TOKENS = [b"\r\n", b"\r\n\r\n", b":", b" ", b"\x00", b"%", b"%00", b"..", b"/", b"[", b"{", b"\"", b"-1",
           b"Content-Length: 99999999999999999999\r\n", b"Transfer-Encoding: chunked\r\n", b"Expect: 100-continue\r\n",
           b"Connection: upgrade\r\nUpgrade: h2c\r\n", b"\xff\xfe", b"HTTP/1.0", b"9" * 30]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(5)
        at = rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif op == 1:
            data[at:at] = rng.choice(_TOKENS)
        elif op == 2:
            del data[at: at + rng.randint(1, 20)]
        elif op == 3:
            data[at:at] = rng.randbytes(rng.randint(1, 30))
        else:
            data = data[:at]
    return bytes(data)


def _statuses(answer: bytes) -> list[int]:
    return [int(answer[i + 9: i + 12]) for i in range(len(answer)) if answer.startswith(b"HTTP/1.1 ", i)
            and answer[i + 9: i + 12].isdigit()]


def test_http1_garbage_at_the_rest_server(plain):
    rng = random.Random(19)
    log_before, rss_before = _baseline(plain)
    seen: dict[int, int] = {}
    for case in range(400):
        if case % 4 == 0:
            data = rng.randbytes(rng.randint(1, 300))
        else:
            data = _mutate(rng, b"".join(rng.choice(_VALID_HTTP) for _ in range(rng.randint(1, 3))))
        statuses = _statuses(_exchange(plain.rest_port, data))
        assert all(s < 500 for s in statuses), (data, statuses)
        for status in statuses:
            seen[status] = seen.get(status, 0) + 1
    # The mutations must reach past the parser: answers of several kinds, successes among them.
    assert seen.get(200, 0) >= 10 and seen.get(400, 0) > 20 and len(seen) >= 3, seen
    _assert_healthy(plain, log_before, rss_before)


def _h2_case(rng: random.Random) -> bytes:
    encoder = hpack.Encoder()
    out = [h2.PREFACE if rng.random() < 0.95 else rng.randbytes(24)]
    if rng.random() < 0.6:  # a call whose message (maybe mutated) reaches the services, then noise
        out.append(h2.frame(h2.SETTINGS, 0, 0))
        out.append(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, h2.request_headers(encoder)))
        message = _predict_message(rng)
        out.append(h2.frame(h2.DATA, h2.END_STREAM, 1, struct.pack(">BL", 0, len(message)) + message))
    for _ in range(rng.randint(0 if len(out) > 1 else 1, 8)):
        sid = rng.choice([0, 1, 1, 3, 5, 2, 2**31 - 1])
        pick = rng.randrange(6)
        if pick == 0:
            path = rng.choice([h2.PREDICT_PATH, "/tensorflow.serving.ModelService/GetModelStatus",
                               "/tensorflow.serving.PredictionService/GetModelMetadata", "/nope", ""])
            extra = rng.sample([("grpc-timeout", rng.choice(["1S", "99999999H", "x", "0n"])),
                                ("grpc-encoding", rng.choice(["gzip", "identity"])),
                                ("authorization", "Bearer x")], rng.randint(0, 3))
            flags = rng.choice([h2.END_HEADERS, h2.END_HEADERS | h2.END_STREAM, 0, 0x8 | h2.END_HEADERS, 0x20])
            out.append(h2.frame(h2.HEADERS, flags, sid, h2.request_headers(encoder, path, extra)))
        elif pick == 1:
            message = rng.choice([rng.randbytes(rng.randint(0, 40)), _predict_message(rng)])
            prefix = struct.pack(">BL", rng.choice([0, 0, 1]), rng.choice([len(message), 0, 2**32 - 1, 7]))
            out.append(h2.frame(h2.DATA, rng.choice([0, h2.END_STREAM, 0x8]), sid, prefix + message))
        elif pick == 2:
            out.append(h2.frame(rng.randrange(12), rng.randrange(256), sid, rng.randbytes(rng.randint(0, 30))))
        elif pick == 3:
            raw = bytearray(h2.frame(rng.randrange(10), rng.randrange(256), sid, rng.randbytes(rng.randint(0, 20))))
            raw[rng.randrange(len(raw))] = rng.randrange(256)  # a corrupt frame header or payload
            out.append(bytes(raw))
        elif pick == 4:
            out.append(h2.frame(h2.CONTINUATION, rng.choice([0, h2.END_HEADERS]), sid, rng.randbytes(rng.randint(0, 10))))
        else:
            out.append(rng.randbytes(rng.randint(1, 50)))
    return b"".join(out)


def _predict_message(rng: random.Random) -> bytes:
    from tests.serving.security.clients import predict_request

    request = predict_request()
    tensor = request.inputs["x"]
    tensor.tensor_shape.dim[0].size = rng.choice([2, 0, -1, 10**12, 3])
    tensor.dtype = rng.choice([1, 7, 0, 99, 2])
    data = bytearray(request.SerializeToString())
    if rng.random() < 0.5 and data:
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


def _grpc_statuses(answer: bytes) -> list[str]:
    decoder, statuses, pos = hpack.Decoder(), [], 0
    while len(answer) - pos >= 9:
        hi, lo, kind, _flags, _sid = struct.unpack_from(">HBBBL", answer, pos)
        length = hi << 8 | lo
        payload = answer[pos + 9: pos + 9 + length]
        pos += 9 + length
        if kind == h2.HEADERS:
            statuses += [v for k, v in decoder.decode(payload) if k == "grpc-status"]
    return statuses


def test_http2_garbage_at_the_lean_grpc_server(plain):
    rng = random.Random(1919)
    log_before, rss_before = _baseline(plain)
    seen: dict[str, int] = {}
    for _ in range(300):
        statuses = _grpc_statuses(_exchange(plain.grpc_port, _h2_case(rng)))
        # UNKNOWN (2) would be a handler's unexpected exception; INTERNAL (13) is also gRPC's answer
        # to an undecodable message (as grpcio), so the log check below is what catches bugs.
        assert "2" not in statuses, statuses
        for status in statuses:
            seen[status] = seen.get(status, 0) + 1
    assert sum(seen.values()) > 30 and len(seen) >= 3, seen  # calls got through to the services
    _assert_healthy(plain, log_before, rss_before)


def _baseline(server) -> tuple[int, int]:
    """The log's length and the resident memory to compare with after fuzzing, once every runtime the
    model has is loaded: a server whose LiteRT conversion is cached starts without TensorFlow and
    loads it (several hundred MiB) for the first request it sends there, which is no leak."""
    import requests

    answer = requests.post(server.base + "/v1/models/default:regress", timeout=120,
                           json={"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]})
    assert answer.status_code == 200, answer.text
    return len(server.log()), _rss_kib(server.proc.pid)


def _assert_healthy(server, log_before: int, rss_before_kib: int) -> None:
    assert server.proc.poll() is None, "the server died"
    import requests

    answer = requests.post(server.base + "/v1/models/default:predict", json={"instances": [1.0, 2.0]}, timeout=10)
    assert answer.json() == {"predictions": [2.5, 3.0]}
    with channel(server) as chan:
        assert predict(chan) == [2.5, 3.0]
    new_log = server.log()[log_before:]
    assert "Traceback" not in new_log and " ERROR " not in new_log, new_log[-3000:]
    grown_mib = (_rss_kib(server.proc.pid) - rss_before_kib) / 1024
    assert grown_mib < 64, f"resident memory grew {grown_mib:.0f} MiB during fuzzing"


def test_body_reader_under_coverage_guided_fuzzing(tmp_path):
    """atheris (libFuzzer) on the C numeric reader and the JSON path for a bounded time: no crash,
    no exception but ServingError, the C reader agreeing with the JSON parser (atheris_body_reader.py)."""
    import subprocess
    import sys
    from pathlib import Path

    try:
        import atheris  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"atheris is needed for this test ({exc}): pip install -e '.[test]'", pytrace=False)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    seeds = [b'{"instances": [[1, 2.5], [3, -4e2]]}', b'{"signature_name": "s", "inputs": [1, 2, 3]}',
             b'{"instances": [[[0, 255], [7, 8]]]}', b'{"inputs": {"a": [1], "b": [true]}}', *FOUND[1:]]
    for i, seed in enumerate(seeds):
        (corpus / f"seed-{i}").write_bytes(seed)
    repo = Path(__file__).resolve().parents[3]
    env = {**__import__("os").environ, "PYTHONPATH": f"{repo / 'src'}:{repo}", "TF_CPP_MIN_LOG_LEVEL": "2"}
    # cwd: libFuzzer writes its crash files there, never into the checkout.
    result = subprocess.run([sys.executable, str(Path(__file__).with_name("atheris_body_reader.py")),
                             "-max_total_time=20", "-seed=1", "-rss_limit_mb=4096", "-timeout=10", str(corpus)],
                            capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    tail = (result.stdout + result.stderr)[-3000:]
    assert result.returncode == 0, tail
    runs = int(__import__("re").search(r"Done (\d+) runs", tail).group(1))
    assert runs > 1000, tail
