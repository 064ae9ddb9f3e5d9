"""The platform's API and gateway over TLS, and mutual TLS (issue 19): stock clients, the
control API answering over HTTPS, plaintext and certificate-less clients refused cleanly."""
from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from modelyard.ports import free_port
from tests.platform.conftest import PARENT, _env
from tests.serving.security.pki import make_pki


def _start(tmp_path, pki, *flags: str):
    port = free_port()
    log = tmp_path / f"platform-{port}.log"
    proc = subprocess.Popen([sys.executable, "-m", "modelyard.platform", "--port", str(port),
                             "--store", str(tmp_path / f"p{port}.db"), "--state-dir", str(tmp_path / "state"),
                             "--tls-cert", str(tmp_path / "server.pem"), "--tls-key", str(tmp_path / "server.key"),
                             *flags], env=_env(), stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    return proc, port, log


def _write_server_files(tmp_path, pki) -> None:
    (tmp_path / "server.pem").write_text(pki.server_cert_pem)
    (tmp_path / "server.key").write_text(pki.server_key_pem)


def _wait_tls(port: int, proc, log, **kwargs) -> None:
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            requests.get(f"https://127.0.0.1:{port}/healthz", timeout=2, **kwargs)
            return
        except requests.exceptions.SSLError:
            return  # the TLS port is up (this client is the one refused)
        except requests.RequestException:
            time.sleep(0.2)
    raise AssertionError(log.read_text()[-3000:])


@pytest.fixture()
def pki(tmp_path):
    made = make_pki(tmp_path)
    _write_server_files(tmp_path, made)
    return made


def test_api_over_https_with_a_ca_bundle_and_plaintext_refused(tmp_path, pki):
    proc, port, log = _start(tmp_path, pki)
    try:
        _wait_tls(port, proc, log, verify=pki.ca_file)
        r = requests.get(f"https://127.0.0.1:{port}/v1/{PARENT}/models", verify=pki.ca_file, timeout=10)
        assert r.status_code == 200, r.text  # the control API's answer, over HTTPS
        with pytest.raises(requests.exceptions.SSLError):  # a client that does not trust the server's CA
            requests.get(f"https://127.0.0.1:{port}/v1/{PARENT}/models", timeout=10)
        with pytest.raises(requests.exceptions.ConnectionError):  # plaintext HTTP to the TLS port
            requests.get(f"http://127.0.0.1:{port}/v1/{PARENT}/models", timeout=10)
        # ...and the platform goes on serving.
        assert requests.get(f"https://127.0.0.1:{port}/healthz", verify=pki.ca_file, timeout=10).status_code == 200
        assert "API on https://" in log.read_text()
    finally:
        proc.terminate()
        proc.wait(30)


def test_mutual_tls_needs_a_client_certificate_from_the_ca(tmp_path, pki):
    proc, port, log = _start(tmp_path, pki, "--tls-client-ca", pki.ca_file)
    try:
        _wait_tls(port, proc, log, verify=pki.ca_file, cert=pki.client_cert)
        url = f"https://127.0.0.1:{port}/v1/{PARENT}/endpoints"
        assert requests.get(url, verify=pki.ca_file, cert=pki.client_cert, timeout=10).status_code == 200
        for cert in (None, pki.stranger_cert):
            with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
                requests.get(url, verify=pki.ca_file, cert=cert, timeout=10)
        assert requests.get(url, verify=pki.ca_file, cert=pki.client_cert, timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_key_that_does_not_match_stops_the_start(tmp_path, pki):
    (tmp_path / "other").mkdir()
    other = make_pki(tmp_path / "other")
    (tmp_path / "server.key").write_text(other.server_key_pem)
    proc, port, log = _start(tmp_path, pki)
    assert proc.wait(60) == 2
    assert "cannot use the TLS files" in log.read_text()
