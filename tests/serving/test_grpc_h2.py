"""The lean gRPC server (grpc_h2): what the client-level tests do not reach.

Large messages (past 64 KiB windows and 16 KiB frames), many streams on one channel,
limits, unknown methods, hostile bytes, and HTTP/2 details driven from a raw socket
(PADDED/PRIORITY/CONTINUATION, a tiny peer window that forces our WINDOW_UPDATE waits).
"""
from __future__ import annotations

import socket
import struct
import threading

import grpc
import hpack
import numpy as np
import pytest

import modelyard  # noqa: F401
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from modelyard.ports import free_port
from modelyard.serving.transport import h2_frames as h2
from modelyard.serving.transport.grpc_h2 import LeanGrpcServer


@pytest.fixture(scope="module")
def channel(testdata_server):
    with grpc.insecure_channel(testdata_server.grpc_target) as ch:
        yield ch


def _predict_request(values: np.ndarray, model: str = "default") -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(values))
    return request


def test_large_request_and_response(testdata_server):
    values = np.arange(2_000_000, dtype=np.float32).reshape(-1, 1) / 7  # 8 MB each way
    options = [("grpc.max_receive_message_length", -1)]  # the client's default limit is 4 MiB
    with grpc.insecure_channel(testdata_server.grpc_target, options=options) as ch:
        response = prediction_service_pb2_grpc.PredictionServiceStub(ch).Predict(_predict_request(values), timeout=60)
    got = tf.make_ndarray(response.outputs["y"])
    np.testing.assert_allclose(got, values / 2 + 2, rtol=1e-6)


def test_many_concurrent_streams_on_one_channel(channel):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

    def call(i: int) -> grpc.Future:
        future = stub.Predict.future(_predict_request(np.array([[float(i)]], np.float32)), timeout=60)
        return future

    futures = [call(i) for i in range(300)]  # all in flight at once: one HTTP/2 stream each
    for i, future in enumerate(futures):
        assert tf.make_ndarray(future.result().outputs["y"])[0, 0] == pytest.approx(i / 2 + 2)


def test_unknown_method_is_unimplemented(channel):
    call = channel.unary_unary("/tensorflow.serving.PredictionService/Explain")
    with pytest.raises(grpc.RpcError) as info:
        call(b"", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_malformed_message_is_internal(channel):
    call = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
    with pytest.raises(grpc.RpcError) as info:
        call(b"\xff\xff\xff", timeout=10)
    assert info.value.code() == grpc.StatusCode.INTERNAL


def test_non_identity_encoding_is_unimplemented(channel):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(_predict_request(np.zeros((1000, 1), np.float32)), timeout=10, compression=grpc.Compression.Gzip)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_error_message_is_percent_encoded(channel):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(_predict_request(np.zeros((1, 1), np.float32), model="nöpe%"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "Servable not found for request: Latest(nöpe%); served models: default, tf2, tflite"


def test_garbage_preface_does_not_kill_the_server(testdata_server, channel):
    for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", bytes(range(256)) * 4, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 64):
        with socket.create_connection(("127.0.0.1", testdata_server.grpc_port), timeout=10) as sock:
            sock.sendall(junk)
            received = b""
            while True:  # the server answers (SETTINGS, GOAWAY) and closes
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
            assert h2.GOAWAY in _frame_types(received)
    status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "default"}), timeout=10)
    assert status.model_version_status


# ---- a raw HTTP/2 client -------------------------------------------------------------------------
def _frame_types(data: bytes) -> list[int]:
    kinds, pos = [], 0
    while len(data) - pos >= 9:
        length = int.from_bytes(data[pos: pos + 3], "big")
        kinds.append(data[pos + 3])
        pos += 9 + length
    return kinds


class RawH2:
    def __init__(self, port: int, settings: dict[int, int]):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.sock.sendall(h2.PREFACE + h2.settings(settings))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> tuple[int, int, int, bytes]:
        while len(self.buf) < 9 or len(self.buf) < 9 + int.from_bytes(self.buf[:3], "big"):
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        length = int.from_bytes(self.buf[:3], "big")
        kind, flags, sid = self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
        payload, self.buf = self.buf[9: 9 + length], self.buf[9 + length:]
        return kind, flags, sid, payload

    def request_block(self, path: str) -> bytes:
        return self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                    (":authority", "localhost"), ("content-type", "application/grpc"),
                                    ("te", "trailers")])


def test_raw_h2_padding_continuation_and_flow_control(testdata_server):
    """Tiny peer window and frame limits: the response must wait for our WINDOW_UPDATEs."""
    client = RawH2(testdata_server.grpc_port, {h2.SETTINGS_INITIAL_WINDOW_SIZE: 50})
    request = get_model_metadata_pb2.GetModelMetadataRequest(
        model_spec={"name": "default"}, metadata_field=["signature_def"]).SerializeToString()
    block = client.request_block("/tensorflow.serving.PredictionService/GetModelMetadata")
    # HEADERS (padded, with priority) carrying half the block, the rest in a CONTINUATION.
    half = len(block) // 2
    first = bytes([3]) + struct.pack(">LB", 0, 15) + block[:half] + b"\0\0\0"
    client.send(h2.frame(h2.HEADERS, h2.PADDED | h2.PRIORITY_FLAG, 1, first))
    client.send(h2.frame(h2.CONTINUATION, h2.END_HEADERS, 1, block[half:]))
    message = b"\0" + len(request).to_bytes(4, "big") + request
    client.send(h2.frame(h2.DATA, h2.PADDED | h2.END_STREAM, 1, bytes([4]) + message + b"\0" * 4))
    client.send(h2.frame(h2.PING, 0, 0, b"12345678"))
    data, trailers, pinged, headers = b"", None, False, None
    while trailers is None:
        kind, flags, sid, payload = client.read_frame()
        if kind == h2.PING:
            assert flags & h2.ACK and payload == b"12345678"
            pinged = True
        elif kind == h2.HEADERS and headers is None:
            headers = dict(client.decoder.decode(payload))
        elif kind == h2.HEADERS:
            trailers = dict(client.decoder.decode(payload))
            assert flags & h2.END_STREAM
        elif kind == h2.DATA:
            assert sid == 1 and len(payload) <= 50
            data += payload
            client.send(h2.window_update(1, len(payload)))  # the stream window: 50 bytes at a time
    assert pinged and headers[":status"] == "200" and trailers["grpc-status"] == "0"
    response = get_model_metadata_pb2.GetModelMetadataResponse.FromString(data[5:])
    assert len(data) > 200 and int.from_bytes(data[1:5], "big") == len(data) - 5
    assert response.model_spec.name == "default"
    client.send(h2.goaway(0, h2.NO_ERROR))
    client.sock.close()


class _NoCore:
    """A core for limit tests that never reach a model."""

    class manager:
        @staticmethod
        def runs_inline(name: str) -> bool:
            return False


def test_over_limit_message_is_resource_exhausted():
    server = LeanGrpcServer(_NoCore(), lambda proto: None, "127.0.0.1", free_port(), max_threads=2,
                            max_receive_bytes=1000)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
            with pytest.raises(grpc.RpcError) as info:
                stub.Predict(_predict_request(np.zeros((100_000, 1), np.float32)), timeout=10)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "larger than max" in info.value.details()
            # The connection survives: a small call on it still gets through to the handler.
            with pytest.raises(grpc.RpcError) as info:
                ch.unary_unary("/tensorflow.serving.PredictionService/Nope")(b"", timeout=10)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop(grace=1)
    assert server.wait_for_termination(5)


def test_stop_sends_goaway_and_finishes():
    server = LeanGrpcServer(_NoCore(), lambda proto: None, "127.0.0.1", free_port(), max_threads=2,
                            max_receive_bytes=1000)
    server.start()
    client = RawH2(server.port, {})
    client.read_frame()  # server SETTINGS
    stopper = threading.Thread(target=server.stop, kwargs={"grace": 2})
    stopper.start()
    kinds = []
    try:
        while True:
            kinds.append(client.read_frame()[0])
    except (EOFError, OSError):
        pass
    stopper.join(10)
    assert h2.GOAWAY in kinds and server.wait_for_termination(5)
