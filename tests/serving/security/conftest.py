"""Servers with the security options on, started together (they load in parallel) once per session.

- ``secure``: lean gRPC, TLS, bearer tokens (model status open), size and time limits, its model
  copied under a root that ``--model_roots`` confines base paths to.
- ``mtls``: lean gRPC, mutual TLS (client certificates from the test CA), 4 connections at most.
- ``grpcio_secure``: grpcio's server, mutual TLS and tokens.
- ``plain``: no security option (the default server), the target of the fuzzers and floods.
"""
from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest
import requests

from tests.serving.security.pki import Pki, make_pki
from tests.serving.server_process import ServerProcess

PREDICT_TOKEN = "predict-only-token-0123456789"
READ_TOKEN = "read-only-token-0123456789ab"
METRICS_TOKEN = "metrics-token-0123456789abcd"
ADMIN_TOKEN = "admin-only-token-0123456789a"
ALL_TOKEN = "all-scopes-token-0123456789"
METRICS_PATH = "/monitoring/prometheus/metrics"
GRPC_MAX_MESSAGE = 1_000_000
CLIENT_TIMEOUT_S = 2


class SecureServerProcess(ServerProcess):
    """A server whose REST port may speak TLS (and want a client certificate)."""

    def __init__(self, *flags: str, model: Path, log_dir, tls: Pki | None = None, mtls: bool = False):
        super().__init__("--model_name", "default", "--model_base_path", str(model), *flags, log_dir=log_dir)
        self.pki, self.mtls, self.model = tls, mtls, model

    @property
    def base(self) -> str:
        return f"{'https' if self.pki else 'http'}://127.0.0.1:{self.rest_port}"

    def request_kwargs(self) -> dict:
        if self.pki is None:
            return {}
        return {"verify": self.pki.ca_file, **({"cert": self.pki.client_cert} if self.mtls else {})}

    def probe(self) -> None:
        requests.get(self.base + "/v1/models/default", timeout=1, **self.request_kwargs())


def write_tokens(path, extra: str = "") -> None:
    path.write_text(
        "# token scopes\n"
        f"{PREDICT_TOKEN} predict\n{READ_TOKEN} read\n{METRICS_TOKEN} metrics\n{ADMIN_TOKEN} admin\n"
        f"{ALL_TOKEN} predict,read,admin,metrics\n" + extra
    )


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("auth") / "tokens.txt"
    write_tokens(path)
    return path


@pytest.fixture(scope="session")
def model(generated_tfserving) -> Path:
    """half_plus_two (y = x/2 + 2) as TF Serving's tests have it, generated (tests/tfserving_models.py)."""
    return generated_tfserving / "saved_model_half_plus_two_cpu"


@pytest.fixture(scope="session")
def model_root(model, tmp_path_factory) -> Path:
    """A root holding its own copy of the test model, for --model_roots."""
    root = tmp_path_factory.mktemp("model_root")
    shutil.copytree(model, root / "default")
    for path in [root / "default", *(root / "default").rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return root


@pytest.fixture(scope="session")
def servers(pki, token_file, model, model_root, monitoring_config, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    monitoring = ("--monitoring_config_file", str(monitoring_config))
    started = {
        "secure": SecureServerProcess(
            "--ssl_config_file", str(pki.ssl_config(False)), "--auth_token_file", str(token_file),
            "--auth_open_health", *monitoring, "--max_header_bytes", "8192", "--max_request_line_bytes", "2048",
            "--client_timeout_seconds", str(CLIENT_TIMEOUT_S), "--grpc_max_receive_message_bytes",
            str(GRPC_MAX_MESSAGE), "--model_roots", str(model_root), log_dir=logs, tls=pki,
            model=model_root / "default"),
        "mtls": SecureServerProcess("--ssl_config_file", str(pki.ssl_config(True)), "--max_connections", "4",
                                    model=model, log_dir=logs, tls=pki, mtls=True),
        "grpcio_secure": SecureServerProcess(
            "--grpc_implementation=grpcio", "--ssl_config_file", str(pki.ssl_config(True)),
            "--auth_token_file", str(token_file), model=model, log_dir=logs, tls=pki, mtls=True),
        "plain": SecureServerProcess(*monitoring, model=model, log_dir=logs),
    }
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="session")
def secure(servers) -> SecureServerProcess:
    return servers["secure"]


@pytest.fixture(scope="session")
def mtls(servers) -> SecureServerProcess:
    return servers["mtls"]


@pytest.fixture(scope="session")
def grpcio_secure(servers) -> SecureServerProcess:
    return servers["grpcio_secure"]


@pytest.fixture(scope="session")
def plain(servers) -> SecureServerProcess:
    return servers["plain"]
