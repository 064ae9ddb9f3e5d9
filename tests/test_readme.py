"""Must-show 6: the README's two set-up commands, and CI running the test command."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import requests

from tests.serving.server_process import free_port, wait_for

REPO = Path(__file__).resolve().parents[1]
SERVE_COMMAND = "python3 -m pip install -e . && modelyard serve"
TEST_COMMAND = "python3 -m pip install -e '.[test]' && python3 -m pytest -q"


def test_readme_holds_both_commands_and_ci_runs_the_test_command():
    readme = (REPO / "README.md").read_text()
    indented = [line.strip() for line in readme.splitlines() if line.startswith("    ")]
    assert SERVE_COMMAND in indented
    assert TEST_COMMAND in indented
    assert TEST_COMMAND in (REPO / ".ci" / "run").read_text()


def test_serve_command_builds_and_serves_the_demo(tmp_path):
    """The serve half of the README command (the install half is what this test run already did)."""
    serve = SERVE_COMMAND.split("&&")[1].strip()
    rest, grpc_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "modelyard", *shlex.split(serve)[1:], "--host", "127.0.0.1",
           "--rest_api_port", str(rest), "--port", str(grpc_port)]
    log = open(tmp_path / "serve.log", "wb")
    env = {**__import__("os").environ, "MODELYARD_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        def ready():
            try:
                return requests.get(f"http://127.0.0.1:{rest}/v1/models/my_mnist_model", timeout=1).ok
            except requests.ConnectionError:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                return False

        wait_for(ready, 240, what="the demo server")
        output = (tmp_path / "serve.log").read_text()
        assert "building demo model" in output.lower()
        assert str(tmp_path / "cache") in output
        curl = re.search(r"^\s*(curl .*)$", output, re.M).group(1)
        result = subprocess.run(shlex.split(curl), capture_output=True, text=True, timeout=30)
        assert '"predictions"' in result.stdout
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
