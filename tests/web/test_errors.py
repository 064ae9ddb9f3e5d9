"""Bad input to the web commands: clear errors, nothing half-written."""
from __future__ import annotations

import subprocess
import sys

import pytest

from modelyard.cli import main
from modelyard.model.tflite import ConvertError


def test_to_web_needs_an_output_folder(demo_base, capsys):
    assert main(["convert", str(demo_base), "--to", "web"]) == 2
    assert "--to web writes a folder: give -o SITE_DIR" in capsys.readouterr().err


def test_missing_npm_says_how_to_get_it(demo_base, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path / "empty-cache"))  # no runtime cached
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # and no npm
    monkeypatch.delenv("MODELYARD_LITERTJS_DIR", raising=False)
    out = tmp_path / "site"
    assert main(["convert", str(demo_base), "--to", "web", "-o", str(out), "--no-report"]) == 1
    err = capsys.readouterr().err
    assert "npm was not found" in err and "apt-get install -y npm" in err and "MODELYARD_LITERTJS_DIR" in err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".site")]


def test_a_model_the_page_cannot_feed_is_refused():
    import tensorflow as tf

    from modelyard.web.site import describe

    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32)])
    def double(x):
        return x * 2.0

    content = tf.lite.TFLiteConverter.from_concrete_functions([double.get_concrete_function()], double).convert()
    with pytest.raises(ConvertError, match=r"one \[1, 28, 28\] or \[1, 28, 28, 1\] input"):
        describe(content)


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
