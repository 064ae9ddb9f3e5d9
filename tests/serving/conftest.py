"""Shared servers for the serving tests: started once, always stopped."""
from __future__ import annotations

import pytest

from tests.serving.server_process import ServerProcess


@pytest.fixture(scope="session")
def testdata_config(tfserving_testdata, tmp_path_factory):
    """A ModelServerConfig serving every TF Serving test model under its own name (from either source)."""
    path = tmp_path_factory.mktemp("config") / "models.config"
    entries = {
        "default": "saved_model_half_plus_two_cpu",
        "tf2": "saved_model_half_plus_two_tf2_cpu",
        "tflite": "saved_model_half_plus_two_tflite",
        "bad": "bad_half_plus_two",
    }
    body = "".join(
        f'  config: {{ name: "{name}" base_path: "{tfserving_testdata / folder}" model_platform: "tensorflow" }}\n'
        for name, folder in entries.items()
    )
    path.write_text("model_config_list: {\n" + body + "}\n")
    return path


def _testdata_server(config, testdata, tmp_path_factory, *extra: str):
    return ServerProcess(
        "--model_config_file", str(config),
        "--monitoring_config_file", str(testdata / "monitoring_config.txt"),
        "--rest_api_enable_cors_support",
        "--rest_api_max_body_bytes", "100000",
        *extra,
        log_dir=tmp_path_factory.mktemp("logs"),
    )


@pytest.fixture(scope="session")
def testdata_server(testdata_config, tfserving_testdata, tmp_path_factory):
    with _testdata_server(testdata_config, tfserving_testdata, tmp_path_factory) as server:
        yield server


@pytest.fixture(scope="session")
def grpcio_testdata_server(testdata_config, tfserving_testdata, tmp_path_factory):
    """The same models behind grpcio's server (--grpc_implementation=grpcio), the fallback."""
    with _testdata_server(testdata_config, tfserving_testdata, tmp_path_factory,
                          "--grpc_implementation=grpcio") as server:
        yield server


@pytest.fixture(scope="module", params=["lean", "grpcio"])
def grpc_target(request, tfserving_testdata) -> str:
    """Each gRPC test runs against both gRPC implementations: answers and errors must not differ."""
    name = "testdata_server" if request.param == "lean" else "grpcio_testdata_server"
    return request.getfixturevalue(name).grpc_target
