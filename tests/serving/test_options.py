"""`modelyard serve` flags: TF Serving's names, environment variables, and clear errors."""
from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from modelyard.serving.options import OptionsError, add_flags, resolve


def parse(*argv: str, environ=None):
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return resolve(parser.parse_args(list(argv)), environ or {})


def test_defaults_match_tf_serving(tmp_path):
    options = parse("--model_base_path", str(tmp_path))
    assert (options.port, options.rest_api_port) == (8500, 8501)
    assert options.model_name == "default"
    assert options.file_system_poll_wait_seconds == 1
    assert options.rest_api_timeout_in_ms == 30000
    assert not options.use_demo


def test_no_model_means_demo():
    options = parse()
    assert options.use_demo and options.model_name == "my_mnist_model"


def test_docker_style_environment(tmp_path):
    (tmp_path / "resnet").mkdir()
    options = parse(environ={"MODEL_NAME": "resnet", "MODEL_BASE_PATH": str(tmp_path)})
    assert options.model_name == "resnet"
    assert options.model_base_path == (tmp_path / "resnet").resolve()


def test_a_gs_base_path_is_kept_as_a_uri_and_needs_the_storage(tmp_path):
    """TF Serving serves gs:// base paths; so does modelyard serve, from the storage STORAGE_EMULATOR_HOST
    names (it read gs://b/m as the local directory gs:/b/m, then refused every URI)."""
    options = parse("--model_base_path", "gs://b/m/", environ={"STORAGE_EMULATOR_HOST": "http://127.0.0.1:1"})
    assert options.model_base_path == "gs://b/m"
    options = parse(environ={"MODEL_NAME": "resnet", "MODEL_BASE_PATH": "gs://b/models",
                             "STORAGE_EMULATOR_HOST": "http://127.0.0.1:1"})
    assert options.model_base_path == "gs://b/models/resnet"
    with pytest.raises(OptionsError) as err:
        parse("--model_base_path", "gs://b/m")
    assert str(err.value).startswith("base path gs://b/m is in Cloud Storage, and STORAGE_EMULATOR_HOST is not "
                                     "set"), err.value
    assert str(err.value).endswith("(fix --model_base_path)")
    with pytest.raises(OptionsError, match="gs://b/models/resnet is in Cloud Storage.*STORAGE_EMULATOR_HOST.*"
                                           "MODEL_BASE_PATH"):
        parse(environ={"MODEL_NAME": "resnet", "MODEL_BASE_PATH": "gs://b/models"})
    with pytest.raises(OptionsError, match="s3://b/m is not a gs://bucket/path URI"):
        parse("--model_base_path", "s3://b/m", environ={"STORAGE_EMULATOR_HOST": "http://127.0.0.1:1"})


def test_boolean_flags_take_tf_serving_spelling(tmp_path):
    options = parse("--model_base_path", str(tmp_path), "--rest_api_enable_cors_support=true",
                    "--enable_model_warmup=false")
    assert options.rest_api_enable_cors_support and not options.enable_model_warmup


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--model_config_file", "x.cfg", "--model_name", "m"], "--model_config_file names the models itself"),
        (["--model_name", "m"], "needs --model_base_path"),
        (["--model_base_path", "/nonexistent/models/m"], "is not a directory"),
        (["--port", "9000", "--rest_api_port", "9000", "--model_base_path", "."], "both 9000"),
        (["--rest_api_timeout_in_ms", "-5", "--model_base_path", "."], "cannot be negative"),
        (["--model_config_file", "/nonexistent.cfg"], "does not exist"),
    ],
)
def test_contradictory_or_impossible_flags(argv, message):
    with pytest.raises(OptionsError, match=message.replace("(", r"\(")):
        parse(*argv)


def test_cli_reports_unknown_and_bad_flags(tmp_path):
    out = subprocess.run([sys.executable, "-m", "modelyard", "serve", "--bogus_flag"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "unrecognized arguments: --bogus_flag" in out.stderr
    out = subprocess.run([sys.executable, "-m", "modelyard", "serve", "--model_name", "m"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "modelyard serve: error: --model_name m needs --model_base_path" in out.stderr
