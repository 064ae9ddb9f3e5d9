"""Bad input to the web commands: clear errors, nothing half-written."""
from __future__ import annotations

import subprocess
import sys

import pytest

from modelyard.cli import main
from modelyard.model.tflite import ConvertError


def test_to_web_needs_an_output_folder(tmp_path, capsys):
    assert main(["convert", str(tmp_path), "--to", "web"]) == 2  # refused before the model is read
    assert "--to web writes a folder: give -o SITE_DIR" in capsys.readouterr().err


@pytest.mark.e2e  # loads TensorFlow, which asks `uname -p` for the processor on first import
def test_missing_npm_says_how_to_get_it(demo_base, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path / "empty-cache"))  # no runtime cached
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # and no npm
    monkeypatch.delenv("MODELYARD_LITERTJS_DIR", raising=False)
    out = tmp_path / "site"
    assert main(["convert", str(demo_base), "--to", "web", "-o", str(out), "--no-report"]) == 1
    err = capsys.readouterr().err
    assert "npm was not found" in err and "apt-get install -y npm" in err and "MODELYARD_LITERTJS_DIR" in err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".site")]


@pytest.mark.e2e  # loads TensorFlow, which asks `uname -p` for the processor on first import
def test_a_model_the_page_cannot_feed_is_refused():
    import tensorflow as tf

    from modelyard.web.site import describe

    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32)])
    def double(x):
        return x * 2.0

    content = tf.lite.TFLiteConverter.from_concrete_functions([double.get_concrete_function()], double).convert()
    with pytest.raises(ConvertError, match=r"one \[1, H, W\] \(grey\), \[1, H, W, 1\] or \[1, H, W, 3\] input, not \[1, 4\]"):
        describe(content)


GREY = {"name": "x", "shape": [1, 28, 28], "dtype": "float32", "scale": 0.0, "zero_point": 0}
TEN = [{"name": "y", "shape": [1, 10], "dtype": "float32", "scale": 0.0, "zero_point": 0}]


def test_preprocessing_flags_are_checked(tmp_path):
    """--channels, --scale, --resize and --labels that cannot fit the model are refused with the reason."""
    from modelyard.web.preprocess import PreprocessFlags, preprocessing

    with pytest.raises(ConvertError, match="--channels 3: the model takes a grey image"):
        preprocessing(GREY, TEN, PreprocessFlags(channels=3))
    for bad in ("white", "1,1", "0,1,2"):
        with pytest.raises(ConvertError, match=f"--scale '{bad}'"):
            preprocessing(GREY, TEN, PreprocessFlags(scale=bad))
    with pytest.raises(ConvertError, match="--resize 'zoom'"):
        preprocessing(GREY, TEN, PreprocessFlags(resize="zoom"))
    (tmp_path / "three.txt").write_text("a\nb\n\nc\n")
    with pytest.raises(ConvertError, match="has 3 names; the model's output has 10 classes"):
        preprocessing(GREY, TEN, PreprocessFlags(labels=tmp_path / "three.txt"))
    with pytest.raises(ConvertError, match="--labels .*missing.txt: No such file"):
        preprocessing(GREY, TEN, PreprocessFlags(labels=tmp_path / "missing.txt"))
    rgb = {**GREY, "shape": [1, 224, 224, 3], "dtype": "uint8", "scale": 0.5, "zero_point": 3}
    got = preprocessing(rgb, TEN, PreprocessFlags(channels=1, scale="-1,1", invert=True, resize="pad"))
    assert got["draw"] is False and got["labels"] is None
    assert got["preprocess"] == {"height": 224, "width": 224, "channels": 3, "channel_axis": True, "grey": True,
                                 "fit": "pad", "range": [-1.0, 1.0], "invert": True, "dtype": "uint8",
                                 "quant_scale": 0.5, "quant_zero_point": 3}
    assert preprocessing(GREY, TEN, PreprocessFlags(scale="1"))["preprocess"]["range"] == [0.0, 1.0]
    assert preprocessing(GREY, TEN, PreprocessFlags())["draw"] is True


def test_web_flags_need_to_web(tmp_path, capsys):
    assert main(["convert", str(tmp_path), "-o", "x.tflite", "--labels", "labels.txt"]) == 2
    assert "--labels are for --to web" in capsys.readouterr().err


def test_web_on_a_folder_without_a_site(tmp_path):
    done = subprocess.run([sys.executable, "-m", "modelyard", "web", str(tmp_path), "--port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "holds no index.html" in done.stderr and "--to web" in done.stderr


def test_console_off_leaves_no_console_route(tmp_path):
    from modelyard.serving.options import add_flags, resolve
    from modelyard.serving.protocol.rest import RestApp
    import argparse

    parser = argparse.ArgumentParser()
    add_flags(parser)
    options = resolve(parser.parse_args(["--console=false", "--model_name", "m", "--model_base_path", str(tmp_path)]))
    assert options.console is False
    app = RestApp(core=None, threads=1)  # the server sets .console only when options.console
    status, _headers, body = app.immediate("GET", "/console")
    assert status == 404 and b"Not found" in body
    app.pool.shutdown()
