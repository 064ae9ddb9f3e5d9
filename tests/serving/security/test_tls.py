"""TLS from --ssl_config_file on REST and gRPC, with the stock clients (issue 19, point 1)."""
from __future__ import annotations

import socket
import ssl

import grpc
import pytest
import requests

from tests.serving.security.clients import channel, code_of, predict
from tests.serving.security.conftest import ALL_TOKEN

BODY = {"instances": [1.0, 2.0]}
AUTH = {"Authorization": f"Bearer {ALL_TOKEN}"}


def test_rest_over_tls_with_a_ca_bundle(secure):
    answer = requests.post(secure.base + "/v1/models/default:predict", json=BODY, headers=AUTH,
                           verify=secure.pki.ca_file, timeout=10)
    assert answer.status_code == 200 and answer.json() == {"predictions": [2.5, 3.0]}


def test_rest_refuses_a_client_that_does_not_trust_the_server(secure):
    # Without the test CA the stock client's own verification fails: the port really speaks TLS.
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(secure.base + "/v1/models/default", timeout=10)


@pytest.mark.parametrize("name", ["secure", "grpcio_secure"])
def test_grpc_over_tls_with_secure_channel(servers, pki, name):
    server = servers[name]
    with channel(server, client_pems=pki.client_pems) as chan:
        assert predict(chan, ALL_TOKEN) == [2.5, 3.0]


def test_mutual_tls_rest(mtls):
    url = mtls.base + "/v1/models/default:predict"
    ok = requests.post(url, json=BODY, verify=mtls.pki.ca_file, cert=mtls.pki.client_cert, timeout=10)
    assert ok.json() == {"predictions": [2.5, 3.0]}
    for cert in (None, mtls.pki.stranger_cert):  # no certificate; one from a CA the server does not trust
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            requests.post(url, json=BODY, verify=mtls.pki.ca_file, cert=cert, timeout=10)
    again = requests.post(url, json=BODY, verify=mtls.pki.ca_file, cert=mtls.pki.client_cert, timeout=10)
    assert again.status_code == 200


@pytest.mark.parametrize("name", ["mtls", "grpcio_secure"])
def test_mutual_tls_grpc(servers, pki, name):
    server = servers[name]
    token = ALL_TOKEN if name == "grpcio_secure" else None
    for pems in (None, pki.stranger_pems):
        with channel(server, client_pems=pems) as chan:
            assert code_of(lambda: predict(chan, token)) == grpc.StatusCode.UNAVAILABLE
    with channel(server, client_pems=pki.client_pems) as chan:
        assert predict(chan, token) == [2.5, 3.0]


def _raw_plaintext(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return received
            received += chunk


@pytest.mark.parametrize("name", ["secure", "grpcio_secure"])
def test_plaintext_to_a_tls_port_fails_cleanly_and_serving_goes_on(servers, pki, name):
    server = servers[name]
    # An HTTP/1.1 request and an HTTP/2 preface in clear: the server closes the connection (it
    # may send a TLS alert first), never answers in clear, and keeps serving TLS clients.
    for port, data in ((server.rest_port, b"GET /v1/models/default HTTP/1.1\r\nHost: x\r\n\r\n"),
                       (server.grpc_port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 64)):
        answer = _raw_plaintext(port, data)
        assert b"HTTP/1.1" not in answer and b"model_version_status" not in answer
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{server.rest_port}/v1/models/default", timeout=10)
    with grpc.insecure_channel(server.grpc_target) as chan:
        assert code_of(lambda: predict(chan, ALL_TOKEN)) == grpc.StatusCode.UNAVAILABLE
    with channel(server, client_pems=pki.client_pems) as chan:
        assert predict(chan, ALL_TOKEN) == [2.5, 3.0]
    answer = requests.get(server.base + "/v1/models/default", headers=AUTH, timeout=10, **server.request_kwargs())
    assert answer.status_code == 200


def test_grpc_negotiates_h2_and_rest_http11(secure):
    context = ssl.create_default_context(cafile=secure.pki.ca_file)
    context.set_alpn_protocols(["h2", "http/1.1"])
    for port, expected in ((secure.grpc_port, "h2"), (secure.rest_port, "http/1.1")):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname="localhost") as sock:
                assert sock.selected_alpn_protocol() == expected
                assert sock.version() in ("TLSv1.2", "TLSv1.3")
