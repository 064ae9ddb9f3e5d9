"""The README: its set-up commands (and CI running the test command), and its quickstart snippets.

The quickstart's Python runs as written where a test can run it: the requests and gRPC
client snippets are executed against the served demo model, and every snippet is checked to
define the names it uses (the client snippets each on their own).
"""
from __future__ import annotations

import ast
import builtins
import re
import shlex
import subprocess
import sys
from pathlib import Path

import requests

from modelyard.ports import free_port
from tests.serving.server_process import wait_for

REPO = Path(__file__).resolve().parents[1]
SERVE_COMMAND = "python3 -m pip install -e . && modelyard serve"
TEST_COMMAND = "./scripts/test"
VENV_COMMANDS = ["python3 -m venv .venv", ". .venv/bin/activate"]


def python_blocks(readme: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", readme, re.M | re.S)


def client_snippet(readme: str, marker: str) -> str:
    (block,) = [b for b in python_blocks(readme) if marker in b]
    return block


def undefined_names(code: str, known: set[str] = frozenset()) -> set[str]:
    """Names ``code`` reads that neither it, ``known`` nor Python's builtins define."""
    tree = ast.parse(code)
    defined = set(known) | set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - defined


def test_readme_holds_both_commands_and_ci_runs_the_test_command():
    readme = (REPO / "README.md").read_text()
    indented = [line.strip() for line in readme.splitlines() if line.startswith("    ")]
    assert SERVE_COMMAND in indented
    assert TEST_COMMAND in indented
    assert TEST_COMMAND in (REPO / ".ci" / "run").read_text()
    # The script installs the package with its test extra and runs the whole suite.
    script = (REPO / "scripts" / "test").read_text()
    assert "python3 -m pip install -e '.[test]'" in script and "python3 -m pytest -q" in script
    # The venv comes first: made, then activated, then the install.
    at = [indented.index(command) for command in VENV_COMMANDS + [SERVE_COMMAND]]
    assert at == sorted(at) and at[1] == at[0] + 1, at


def test_quickstart_snippets_define_what_they_use():
    readme = (REPO / "README.md").read_text()
    known: set[str] = set()
    for block in python_blocks(readme):  # read in order, as one session runs them
        assert undefined_names(block, known) == set(), block
        known |= {n.id for n in ast.walk(ast.parse(block)) if isinstance(n, ast.Name)}
        known |= {(a.asname or a.name).split(".")[0] for n in ast.walk(ast.parse(block))
                  if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert "better_model = " in readme
    for marker in ("requests.post", "PredictRequest()"):  # client scripts: each stands alone
        assert undefined_names(client_snippet(readme, marker)) == set(), marker


def test_readme_shows_what_export_prints(capsys):
    from modelyard.model.export import _announce

    readme = (REPO / "README.md").read_text()
    for version in (1, 2):
        _announce(version, Path("models/my_mnist_model") / f"{version:04d}")
        printed = capsys.readouterr().err.strip()
        assert f"# prints: {printed}\n" in readme, printed


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
        _run_client_snippets(rest, grpc_port)
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def _run_client_snippets(rest_port: int, grpc_port: int) -> None:
    """The README's requests and gRPC snippets, as written but for the ports, each in a fresh namespace."""
    import numpy as np

    readme = (REPO / "README.md").read_text()
    for marker, port in (("requests.post", rest_port), ("PredictRequest()", grpc_port)):
        code = client_snippet(readme, marker)
        code = code.replace("localhost:8501", f"127.0.0.1:{port}").replace("localhost:8500", f"127.0.0.1:{port}")
        namespace: dict = {}
        exec(compile(code, f"README.md ({marker} snippet)", "exec"), namespace)
        y_proba = np.asarray(namespace["y_proba"])
        assert y_proba.shape == (3, 10), marker
        # demo_instances(3) is a 0, a 1 and a 2: the served model tells them apart.
        assert list(y_proba.argmax(axis=1)) == [0, 1, 2], (marker, y_proba.round(3))
