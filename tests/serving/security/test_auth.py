"""Bearer tokens and scopes on REST, the lean gRPC server and grpcio's (issue 19, point 2)."""
from __future__ import annotations

import socket
import ssl
import time

import grpc
import pytest
import requests

from tests.serving.security.clients import channel, code_of, metadata_call, predict, reload_call, status_call
from tests.serving.security.conftest import (
    ADMIN_TOKEN, ALL_TOKEN, METRICS_PATH, METRICS_TOKEN, PREDICT_TOKEN, READ_TOKEN, write_tokens,
)

OK, DENIED, UNAUTH = grpc.StatusCode.OK, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED

# call -> {token: expected}; None is no token at all.
REST_CASES = {
    ("POST", "/v1/models/default:predict"): {PREDICT_TOKEN: 200, READ_TOKEN: 403, METRICS_TOKEN: 403,
                                             ADMIN_TOKEN: 403, ALL_TOKEN: 200, None: 401, "not-a-token-at-all": 401},
    ("POST", "/v1/models/default:regress"): {PREDICT_TOKEN: 400, READ_TOKEN: 403, None: 401},
    ("GET", "/v1/models/default/metadata"): {READ_TOKEN: 200, PREDICT_TOKEN: 403, ALL_TOKEN: 200, None: 401},
    # --auth_open_health: model status needs no token
    ("GET", "/v1/models/default"): {None: 200, PREDICT_TOKEN: 200, "not-a-token-at-all": 200},
    ("GET", METRICS_PATH): {METRICS_TOKEN: 200, READ_TOKEN: 403, PREDICT_TOKEN: 403, None: 401},
    ("GET", "/nothing/here"): {None: 401, READ_TOKEN: 404},
    # the console: its pages are read, its actions admin (then the console's own token decides:
    # this server has none, so an admin token reaches the console's read-only refusal)
    ("GET", "/console"): {READ_TOKEN: 200, ALL_TOKEN: 200, PREDICT_TOKEN: 403, None: 401},
    ("GET", "/console/api/state"): {READ_TOKEN: 200, METRICS_TOKEN: 403, None: 401},
    ("POST", "/console/api/reload"): {ADMIN_TOKEN: 403, READ_TOKEN: 403, PREDICT_TOKEN: 403, None: 401},
    # the Open Inference Protocol (V2): infer is predict (400: past the check, this body is not V2's),
    # metadata read, readiness a health check, the repository's load/unload admin
    ("POST", "/v2/models/default/infer"): {PREDICT_TOKEN: 400, READ_TOKEN: 403, METRICS_TOKEN: 403, None: 401},
    ("GET", "/v2/models/default"): {READ_TOKEN: 200, PREDICT_TOKEN: 403, None: 401},
    ("GET", "/v2/health/ready"): {None: 200, PREDICT_TOKEN: 200},
    ("POST", "/v2/repository/models/default/unload"): {READ_TOKEN: 403, PREDICT_TOKEN: 403, None: 401},
}
CONSOLE_READ_ONLY = "the console is read-only"


@pytest.mark.parametrize("call", list(REST_CASES), ids=lambda c: f"{c[0]} {c[1]}")
def test_rest_scopes(secure, call):
    method, path = call
    for token, expected in REST_CASES[call].items():
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        body = {"instances": [1.0]} if method == "POST" else None
        answer = requests.request(method, secure.base + path, json=body, headers=headers, timeout=10,
                                  **secure.request_kwargs())
        assert answer.status_code == expected, (token, answer.text)
        if expected in (401, 403):
            assert "error" in answer.json()  # TF Serving's REST error format
        if expected == 401:
            assert answer.headers["www-authenticate"].startswith("Bearer")
        if call == ("POST", "/console/api/reload") and token is not None:
            # only the admin token gets past the scope check to the console itself
            assert (CONSOLE_READ_ONLY in answer.json()["error"]) == (token == ADMIN_TOKEN), (token, answer.text)


def test_rest_malformed_authorization_headers(secure):
    for value in ("Basic dXNlcjpwYXNz", "Bearer", "Bearer  ", PREDICT_TOKEN, f"Token {PREDICT_TOKEN}"):
        answer = requests.post(secure.base + "/v1/models/default:predict", json={"instances": [1.0]},
                               headers={"Authorization": value}, timeout=10, **secure.request_kwargs())
        assert answer.status_code == 401 and "error" in answer.json()
    ok = requests.post(secure.base + "/v1/models/default:predict", json={"instances": [1.0]},
                       headers={"authorization": f"bearer {PREDICT_TOKEN}"}, timeout=10, **secure.request_kwargs())
    assert ok.status_code == 200  # the scheme is case-insensitive (RFC 7235)


def test_rest_token_checked_before_the_body_is_read(secure):
    # Headers announcing 500 MB that never come: the 401 arrives at once, the body is never awaited.
    context = ssl.create_default_context(cafile=secure.pki.ca_file)
    with socket.create_connection(("127.0.0.1", secure.rest_port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as sock:
            sock.sendall(b"POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 500000000\r\n\r\n{")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 401 ")
    assert b'"error"' in answer


GRPC_CALLS = {
    "Predict": (lambda chan, token: predict(chan, token), {PREDICT_TOKEN: OK, READ_TOKEN: DENIED,
                                                           ADMIN_TOKEN: DENIED, None: UNAUTH, "wrong-token-xxxxxxxxxx": UNAUTH}),
    "GetModelMetadata": (metadata_call, {READ_TOKEN: OK, PREDICT_TOKEN: DENIED, None: UNAUTH}),
    "HandleReloadConfigRequest": (lambda chan, token, server: reload_call(chan, token, server.model), {ADMIN_TOKEN: OK, PREDICT_TOKEN: DENIED, READ_TOKEN: DENIED,
                                                None: UNAUTH}),
}


@pytest.mark.parametrize("name", ["secure", "grpcio_secure"])
@pytest.mark.parametrize("method", list(GRPC_CALLS))
def test_grpc_scopes(servers, pki, name, method):
    server = servers[name]
    call, cases = GRPC_CALLS[method]
    with channel(server, client_pems=pki.client_pems) as chan:
        for token, expected in cases.items():
            if method == "HandleReloadConfigRequest":
                assert code_of(lambda: call(chan, token, server)) == expected, token
            else:
                assert code_of(lambda: call(chan, token)) == expected, token


@pytest.mark.parametrize("name", ["secure", "grpcio_secure"])
def test_grpc_model_status_open_or_not_as_configured(servers, pki, name):
    # secure runs with --auth_open_health; grpcio_secure does not.
    server = servers[name]
    with channel(server, client_pems=pki.client_pems) as chan:
        expected = OK if name == "secure" else UNAUTH
        assert code_of(lambda: status_call(chan, None)) == expected
        assert code_of(lambda: status_call(chan, READ_TOKEN)) == OK
        assert code_of(lambda: status_call(chan, PREDICT_TOKEN)) == (OK if name == "secure" else DENIED)


def test_grpc_refusal_messages(secure):
    with channel(secure) as chan:
        with pytest.raises(grpc.RpcError) as missing:
            predict(chan, None)
        with pytest.raises(grpc.RpcError) as lacking:
            predict(chan, READ_TOKEN)
    assert "Bearer" in missing.value.details()
    assert "'predict' scope" in lacking.value.details()


def _until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_token_file_is_reloaded_when_it_changes(secure, token_file):
    new_token = "freshly-added-token-0123456789"
    url = secure.base + "/v1/models/default:predict"

    def status(token):
        return requests.post(url, json={"instances": [1.0]}, headers={"Authorization": f"Bearer {token}"},
                             timeout=10, **secure.request_kwargs()).status_code

    with channel(secure) as chan:
        assert status(new_token) == 401
        try:
            write_tokens(token_file, f"{new_token} predict\n")
            assert _until(lambda: status(new_token) == 200)
            assert code_of(lambda: predict(chan, new_token)) == OK
            token_file.write_text("this line is broken\n")  # a bad edit keeps the tokens in force
            time.sleep(1.5)
            assert status(new_token) == 200
        finally:
            write_tokens(token_file)  # revoked
        assert _until(lambda: status(new_token) == 401)
        assert code_of(lambda: predict(chan, new_token)) == UNAUTH
        assert "Kept the previous tokens" in secure.log()
