"""Names from requests never reach the file system; --model_roots confines base paths (issue 19, point 5)."""
from __future__ import annotations

import http.client
import os
import re
import subprocess
from urllib.parse import quote

import grpc
import pytest
import requests

from modelyard.ports import free_port
from tests.serving.security.clients import channel, code_of, predict, predict_request, reload_call, status_call
from tests.serving.security.conftest import ALL_TOKEN

TRAVERSALS = ["..", "../..", "../../../../etc/passwd", "/etc/passwd", "..%2F..%2Fetc", "%2e%2e", "%252e%252e",
              "default/../default", "default%00", "..\\..\\windows", "~root", "default/../../"]


def _send(server, method: str, path: str, body: bytes = b"") -> tuple[int, str]:
    """http.client sends the path as given (requests/urllib3 would remove its dot segments first)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=10)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        answer = connection.getresponse()
        return answer.status, answer.read().decode(errors="replace")
    finally:
        connection.close()


@pytest.mark.parametrize("name", TRAVERSALS)
def test_rest_names_and_labels_are_not_paths(plain, name):
    for encoded in {quote(name, safe="%"), quote(name, safe="%/")}:  # escaped, and raw slashes too
        for path in (f"/v1/models/{encoded}", f"/v1/models/{encoded}/metadata",
                     f"/v1/models/default/labels/{encoded}/metadata"):
            status, text = _send(plain, "GET", path)
            assert 400 <= status < 500 and '"error"' in text, (path, status)
            assert "root:" not in text
        # A status GET ignores the label (the model's status, as TF Serving): never a file's content.
        status, text = _send(plain, "GET", f"/v1/models/default/labels/{encoded}")
        assert status < 500 and "root:" not in text
        status, _ = _send(plain, "POST", f"/v1/models/{encoded}:predict", b'{"instances": [1.0]}')
        assert 400 <= status < 500


def test_grpc_names_and_labels_are_not_paths(plain):
    with channel(plain) as chan:
        for name in TRAVERSALS:
            request = predict_request()
            request.model_spec.name = name
            assert code_of(lambda: predict(chan, None, request)) in (grpc.StatusCode.NOT_FOUND,
                                                                      grpc.StatusCode.INVALID_ARGUMENT)
            request = predict_request()
            request.model_spec.version_label = name
            assert code_of(lambda: predict(chan, None, request)) in (grpc.StatusCode.NOT_FOUND,
                                                                      grpc.StatusCode.INVALID_ARGUMENT,
                                                                      grpc.StatusCode.FAILED_PRECONDITION)
        assert predict(chan) == [2.5, 3.0]


def test_strace_shows_no_file_opened_for_request_names(plain):
    """The proof for point 5: while traversal requests run, the server opens no file at all."""
    if subprocess.run(["which", "strace"], capture_output=True).returncode != 0:
        pytest.fail("strace is needed for this test: apt-get install strace")
    trace = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=open,openat,openat2,stat,newfstatat,statx",
                              "-p", str(plain.proc.pid)], stderr=subprocess.PIPE, text=True)
    try:
        import time

        time.sleep(1.0)  # strace attaches to every thread
        for name in TRAVERSALS:
            requests.get(f"{plain.base}/v1/models/{quote(name, safe='%')}", timeout=10)
            requests.post(f"{plain.base}/v1/models/default/labels/{quote(name, safe='%')}:predict",
                          json={"instances": [1.0]}, timeout=10)
        time.sleep(0.5)
    finally:
        trace.terminate()
        _, err = trace.communicate(timeout=10)
    if "Operation not permitted" in err:
        pytest.fail(f"strace cannot attach here (ptrace not permitted): {err[:300]}")
    assert "newfstatat" in err or "openat" in err or "statx" in err  # traced: the poller stats the model
    paths = re.findall(r'"([^"]*)"', err)
    touched = [path for path in paths if any(s in path for s in ("passwd", "../", "..\\", "windows", "~root", "%"))]
    assert touched == []


def test_model_roots_refuse_escapes_on_reload(secure, model, model_root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (model_root / "escape").symlink_to(model)  # a link inside the root, to a model outside it
    mixed = model_root / "mixed"
    mixed.mkdir()
    (mixed / "123").symlink_to(model / "00000123")  # one version directory escapes
    try:
        with channel(secure) as chan:
            for base in (outside, model, model_root / "escape", mixed, model_root / ".." / outside.name,
                         f"{model_root}/default/../../{outside.name}"):
                with pytest.raises(grpc.RpcError) as refused:
                    reload_call(chan, ALL_TOKEN, base)
                assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "--model_roots" in refused.value.details()
            assert predict(chan, ALL_TOKEN) == [2.5, 3.0]  # still the model inside the root
            assert status_call(chan, ALL_TOKEN).model_version_status[0].version == 123
            reload_call(chan, ALL_TOKEN, secure.model)  # inside: allowed
    finally:
        os.unlink(model_root / "escape")
        os.unlink(mixed / "123")


def test_model_roots_stop_a_server_whose_model_is_outside(model, model_root, capsys):
    # The real command line, in this process (TensorFlow is loaded already): it stops before any port opens.
    from modelyard.cli import main

    status = main(["serve", "--model_name", "m", "--model_base_path", str(model), "--model_roots", str(model_root),
                   "--host", "127.0.0.1", "--port", str(free_port()), "--rest_api_port", "0"])
    assert status == 1
    assert "outside --model_roots" in capsys.readouterr().err
