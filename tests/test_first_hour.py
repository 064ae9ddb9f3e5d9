"""What a newcomer meets in the first hour (issue 13), through the real ``modelyard`` command.

Quiet TensorFlow start-up by default and its lines back with -v / MODELYARD_LOG_LEVEL; a
suggestion for a mistyped flag in every command; ``train`` refusing a multi-worker strategy
without a cluster; serve's errors naming the MODEL_* variables the user set.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_process import NOISE, REPO, modelyard
from tests.training.conftest import write_config


# -- log noise ---------------------------------------------------------------------------------

def _convert_missing(tmp_path: Path, *flags: str, env_extra=None) -> subprocess.CompletedProcess:
    # `convert` loads TensorFlow before it finds that SRC is missing, so its start-up lines would show.
    result = modelyard(*flags, "convert", str(tmp_path / "missing"), "-o", str(tmp_path / "m.tflite"),
                       env_extra=env_extra)
    assert result.returncode == 1 and "missing does not exist" in result.stderr, result.stderr
    return result


def test_tensorflow_start_up_lines_are_hidden_by_default(tmp_path):
    result = _convert_missing(tmp_path)
    assert not NOISE.search(result.stderr), result.stderr
    assert result.stderr.strip().splitlines() == [
        f"modelyard convert: error: {tmp_path / 'missing'} does not exist "
        "(expected a SavedModel dir, a base path or BASE:VERSION)"
    ]


@pytest.mark.parametrize("how", ["MODELYARD_LOG_LEVEL=debug", "--verbose"])
def test_tensorflow_start_up_lines_come_back_when_asked(tmp_path, how):
    if how == "--verbose":
        result = _convert_missing(tmp_path, "--verbose")
    else:
        result = _convert_missing(tmp_path, env_extra={"MODELYARD_LOG_LEVEL": "debug"})
    assert NOISE.search(result.stderr), result.stderr
    assert "oneDNN" in result.stderr or "cuda" in result.stderr.lower()


def test_quiet_filter_keeps_errors_and_other_lines():
    from modelyard._quiet import filter_import_noise

    captured = (b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
                b"I0000 00:00:1795517796.746867    5533 port.cc:153] oneDNN custom operations are on.\n"
                b"W0000 00:00:1795517796.747210    5533 some.cc:1] a warning\n"
                b"E0000 00:00:1795518133.847973   18522 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA "
                b"error: Failed call to cuInit: UNKNOWN ERROR (303)\n"
                b"E0000 00:00:1795517796.747210    5533 other.cc:2] a real error\n"
                b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n"
                b"plain text from Python\n")
    assert filter_import_noise(captured, 2) == (b"E0000 00:00:1795517796.747210    5533 other.cc:2] a real error\n"
                                                b"plain text from Python\n")
    assert filter_import_noise(captured, 0) == captured


# -- flag typos --------------------------------------------------------------------------------

@pytest.mark.parametrize("args, typo, hint", [
    (["convert", "x", "--quantise", "dynamic"], "--quantise", "--quantize"),
    (["serve", "--rest_api_prot", "8501"], "--rest_api_prot", "--rest_api_port"),
    (["train", "job.yaml", "--job_dir", "j"], "--job_dir", "--job-dir"),
    (["launch", "--wokers", "2", "--", "true"], "--wokers", "--workers"),
])
def test_a_mistyped_flag_gets_the_closest_one(args, typo, hint):
    result = modelyard(*args)
    assert result.returncode == 2
    assert f"{typo}: did you mean {hint}?" in result.stderr, result.stderr
    assert f"usage: modelyard {args[0]}" in result.stderr  # the subcommand's usage, not the top level's


@pytest.mark.parametrize("args, hint", [
    (["serv"], "did you mean serve?"),
    (["convert", "x", "-o", "y.tflite", "--quantize", "dynamik"], "did you mean dynamic?"),
])
def test_a_mistyped_choice_or_command_gets_the_closest_one(args, hint):
    result = modelyard(*args)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr and hint in result.stderr, result.stderr


def test_an_unknown_flag_with_nothing_close_keeps_argparse_message():
    result = modelyard("convert", "x", "--zzzzzz")
    assert result.returncode == 2
    assert "unrecognized arguments: --zzzzzz" in result.stderr and "did you mean" not in result.stderr


# -- train without a cluster -------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "parameter_server"])
def test_train_with_a_multi_worker_strategy_and_no_cluster_says_to_launch(tmp_path, strategy):
    config = write_config(tmp_path, "mw", strategy=strategy)
    result = modelyard("train", str(config))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"strategy {strategy} needs" in result.stderr
    assert "modelyard launch --workers N" in result.stderr and "TF_CONFIG" in result.stderr
    assert not (tmp_path / "job-mw").exists()  # stopped before training anything


# -- serve with TF Serving's environment variables ---------------------------------------------

def test_serve_error_names_the_environment_variables_set(tmp_path):
    result = modelyard("serve", env_extra={"MODEL_BASE_PATH": str(tmp_path / "nowhere")})
    assert result.returncode == 2
    assert f"model base path {tmp_path / 'nowhere' / 'model'} is not a directory" in result.stderr
    assert f"fix MODEL_BASE_PATH={tmp_path / 'nowhere'}" in result.stderr
    assert "MODEL_NAME is unset (default model)" in result.stderr
    assert "--model_base_path" not in result.stderr, result.stderr

    result = modelyard("serve", env_extra={"MODEL_BASE_PATH": str(tmp_path), "MODEL_NAME": "digits"})
    assert result.returncode == 2
    assert f"fix MODEL_BASE_PATH={tmp_path} / MODEL_NAME=digits" in result.stderr
    assert "--model_base_path" not in result.stderr, result.stderr


def test_building_the_command_line_loads_no_tensorflow():
    """--help, typos and -v are handled before TensorFlow loads (-v must be set before it does)."""
    code = "import sys, modelyard.cli as c; c.build_parser(); print('tensorflow' in sys.modules)"
    env_path = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": env_path})
    assert result.stdout.strip() == "False", result.stderr
