"""Without tritonclient, `modelyard serve` says nothing of it until a client calls the V2 gRPC service (issue 44):
then the call answers UNIMPLEMENTED naming the package, and the log says so once."""
from __future__ import annotations

import logging

from modelyard.errors import Code
from modelyard.serving.protocol import v2_grpc


def test_no_notice_at_start_one_when_a_client_asks(monkeypatch, caplog):
    monkeypatch.setattr(v2_grpc, "_pb2", lambda: None)  # as where tritonclient is not installed
    with caplog.at_level(logging.INFO, logger="modelyard.serving"):
        methods = v2_grpc.methods(service=None, repository=object())
    assert "tritonclient" not in caplog.text  # every start of `modelyard serve` builds these
    name, request_class, call = methods[f"/{v2_grpc.SERVICE}/ModelInfer"]
    request = request_class.FromString(b"\x0a\x01m")
    assert v2_grpc.start_infer(None, request, None, None) is None  # not queued: the call itself answers
    for _ in range(2):
        assert call(request) == (None, Code.UNIMPLEMENTED, v2_grpc.OFF_MESSAGE)
    assert caplog.text.count("pip install tritonclient") == 1, caplog.text
    assert "pip install tritonclient" in v2_grpc.OFF_MESSAGE


def test_the_same_methods_are_answered_with_tritonclient_or_without(monkeypatch):
    real = set(v2_grpc.methods(service=None, repository=object()))
    monkeypatch.setattr(v2_grpc, "_pb2", lambda: None)
    assert set(v2_grpc.methods(service=None, repository=object())) == real
    assert set(v2_grpc.methods(service=None)) == {p for p in real if "/Repository" not in p}
