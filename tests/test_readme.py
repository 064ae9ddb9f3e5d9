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
from tests.doc_blocks import fenced, shell_commands
from tests.doc_blocks import sh as _sh
from tests.doc_blocks import shell_env as _shell_env
from tests.serving.server_process import wait_for
from tests.warm_process import popen_python

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


def test_ci_makes_the_readmes_venv_and_runs_the_test_command_in_it():
    """CI takes the README's path: its two venv lines, as written, then the test command, all in one shell."""
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    at = [lines.index(command) for command in VENV_COMMANDS + [TEST_COMMAND]]
    assert at == [at[0], at[0] + 1, at[0] + 2], lines


def test_in_the_readmes_venv_the_docs_tests_python_sees_the_venvs_packages(tmp_path):
    """The README's venv lines in a fresh folder, modelyard in it as `pip install -e .` puts it (a path file to
    src/; the install itself is the test command's, and slow) beside a module only that venv has, then the
    `python3` the doc tests put on PATH (tests/doc_blocks.shell_env) for that interpreter: it must be the
    venv's, not the base interpreter a symlink to it starts."""
    from tests.doc_blocks import put_python_on_path

    clone = tmp_path / "clone"
    clone.mkdir()
    # --without-pip would be quicker, but the lines run are the README's own.
    script = " && ".join([*VENV_COMMANDS, 'python3 -c "import site, sys; print(sys.executable); '
                                           'print(site.getsitepackages()[0])"'])
    done = subprocess.run(["bash", "-e", "-c", script], cwd=clone, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    executable, site_packages = done.stdout.split()
    assert Path(executable).parent == clone / ".venv" / "bin", executable
    (Path(site_packages) / "only_in_this_venv.py").write_text("")
    (Path(site_packages) / "modelyard-src.pth").write_text(str(REPO / "src") + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    put_python_on_path(bin_dir, executable)  # what shell_env does for the pytest running in that venv
    for name in ("python3", "python"):
        seen = subprocess.run([name, "-c", "import modelyard, only_in_this_venv, sys; print(sys.prefix)"],
                              capture_output=True, text=True, timeout=60, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
        assert seen.returncode == 0, seen.stderr
        assert Path(seen.stdout.strip()) == clone / ".venv", seen.stdout


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


STORAGE_URL = "http://127.0.0.1:8601"  # the storage line `modelyard platform --port 8600` prints


def test_vertex_snippet_points_at_the_platforms_storage_before_anything_uses_it():
    """Forgetting `export STORAGE_EMULATOR_HOST` gives google-auth's DefaultCredentialsError with no word of the
    variable: the README's SDK snippet sets it in code first, as docs/storage.md does, and the text says why."""
    readme = (REPO / "README.md").read_text()
    block = client_snippet(readme, "aiplatform.init(")
    statements = [ast.unparse(node) for node in ast.parse(block).body]
    sets = next(i for i, stmt in enumerate(statements) if stmt.startswith("os.environ['STORAGE_EMULATOR_HOST']"))
    assert statements[sets] == f"os.environ['STORAGE_EMULATOR_HOST'] = '{STORAGE_URL}'", statements[sets]
    uses = [i for i, stmt in enumerate(statements) if "storage.Client(" in stmt or "aiplatform." in stmt]
    assert uses and sets < min(uses), statements
    section = readme[:readme.index(block)].rsplit("## ", 1)[1]
    assert "STORAGE_EMULATOR_HOST" in section and "DefaultCredentialsError" in section


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
    env = {**__import__("os").environ, "MODELYARD_CACHE": str(tmp_path / "cache")}
    # Forked from the worker's warm interpreter (tests/warm_process.py): the same command, its output
    # and what it builds, without importing TensorFlow again.
    proc = popen_python(cmd, env, tmp_path / "serve.log")
    try:
        def ready():
            try:
                return requests.get(f"http://127.0.0.1:{rest}/v1/models/my_mnist_model", timeout=5).ok
            except requests.RequestException:  # not listening yet, or busy building the demo
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


# ---- The vertex extra and the README's batch and endpoints command blocks (docs/tuning.md's quick start:
# tests/test_docs.py::test_tuning_page_runs_as_written) ----
def test_the_vertex_extra_brings_the_sdk_storage_and_hypertune():
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[<>=\[ ]", d)[0] for d in extras["vertex"]}
    assert names == {"google-cloud-aiplatform", "google-cloud-storage", "cloudml-hypertune", "google-vizier"}
    test_names = {re.split(r"[<>=\[ ]", d)[0] for d in extras["test"]}
    assert names <= test_names  # the test install has them too
    readme = (REPO / "README.md").read_text()
    indented = [line.strip() for line in readme.splitlines() if line.startswith("    ")]
    assert "python3 -m pip install -e '.[vertex]'" in indented
    assert "pip install gcsfs" not in readme  # a dependency already
    assert "Two commands do everything" not in readme


def test_batch_and_endpoints_commands_run_as_written(tmp_path):
    """From a project folder holding the Quickstart's models/my_mnist_model: the batch prediction block,
    then `modelyard platform` (its README line, on a free port), the Endpoints section's Python session
    (Vertex SDK, scikit-learn and registry snippets) and the CLI block against it."""
    import json
    import shutil

    from modelyard.demo import ensure_demo_model
    from tests.platform.conftest import PlatformProcess

    readme = (REPO / "README.md").read_text()
    project = tmp_path / "project"
    shutil.copytree(ensure_demo_model(log=lambda _m: None), project / "models" / "my_mnist_model")
    env = _shell_env(tmp_path)

    (batch,) = [shell_commands(b) for b in fenced(readme, "bash") if "modelyard batch-predict" in b]
    for command in batch:
        _sh(command, project, env)
    (job,) = (project / "out").glob("prediction-my_mnist_model-*")
    rows = [json.loads(line) for shard in sorted(job.glob("prediction.results-*")) for line in shard.read_text().splitlines()]
    assert len(rows) == 100
    assert [max(range(10), key=r["prediction"].__getitem__) for r in rows[:3]] == [0, 1, 2]

    (line,) = [c.strip() for c in readme.splitlines() if c.strip().startswith("modelyard platform --port 8600")]
    args = shlex.split(re.sub(r"\s{2,}#.*$", "", line))[2:]  # after `modelyard platform`
    assert args[:2] == ["--port", "8600"], args
    args = args[2:]  # the port (and the store, beside the project) are the test's own
    # The platform serves its own storage (this process's STORAGE_EMULATOR_HOST, set by other tests'
    # storage, must not point it elsewhere); the Python session gets the line the platform prints.
    env.pop("STORAGE_EMULATOR_HOST", None)
    platform = PlatformProcess(project, env, [*args, "--storage-port", str(free_port())])
    platform.start()
    try:
        log = (project / "platform-1.log").read_text()
        assert f"accepted only under {project / 'models'}, gs://my-staging" in log, log
        export = re.search(r"^\s*export (STORAGE_EMULATOR_HOST)=(\S+)$", log, re.M)  # the line it prints
        assert export, log
        # ...and, below it, what forgetting it raises (google-auth's error names no variable).
        assert "looks for Google's credentials: DefaultCredentialsError" in log[export.end():].split("\n")[1], log
        # Without STORAGE_EMULATOR_HOST in the environment: the snippet sets it in code (a user who forgot the
        # export still reaches the platform's storage, not google-auth's DefaultCredentialsError).
        _run_platform_python_session(readme, project, platform, env, export.group(2))
        (cli,) = [shell_commands(b) for b in fenced(readme, "bash") if "modelyard endpoints predict" in b]
        cli_env = dict(env, MODELYARD_PLATFORM=platform.url)
        for command in cli:
            out = _sh(command, project, cli_env).stdout
        predictions = json.loads(out)["predictions"]
        assert [max(range(10), key=p.__getitem__) for p in predictions] == [0, 1, 2]
    finally:
        platform.cleanup()


# One Python session over the given README blocks, as a user types them: a bare expression's value is
# kept (as Jupyter shows it), everything else executed; the values are printed as JSON at the end.
_SESSION = """
import ast, json, sys
ns, values = {}, []
for path in sys.argv[1:]:
    for stmt in ast.parse(open(path).read()).body:
        if isinstance(stmt, ast.Expr):
            values.append(eval(compile(ast.Expression(stmt.value), path, "eval"), ns))
        else:
            exec(compile(ast.Module([stmt], []), path, "exec"), ns)
print(json.dumps(values, default=repr))
"""


def _run_platform_python_session(readme: str, project: Path, platform, env: dict, storage_url: str) -> None:
    """The Endpoints section's Python (the Vertex SDK snippet, the scikit-learn snippet, the registry
    snippet), in README order, in one session, as written but for the platform's and its storage's ports."""
    import json

    import joblib
    import numpy as np
    from sklearn.datasets import load_digits

    markers = ("aiplatform.init(", "upload_scikit_learn_model_file", "ModelRegistry(")
    blocks = [b for b in python_blocks(readme) if any(m in b for m in markers)]
    assert [next(m for m in markers if m in b) for b in blocks] == list(markers), blocks
    assert (project / "models" / "my_mnist_model" / "0002").is_dir()  # the demo has both of the Quickstart's versions
    paths = []
    for i, block in enumerate(blocks):
        assert "localhost:8600" in block or i > 0
        path = project / f"readme_block_{i}.py"
        path.write_text(block.replace("http://localhost:8600", platform.url).replace(STORAGE_URL, storage_url))
        paths.append(str(path))
    done = subprocess.run([sys.executable, "-c", _SESSION, *paths], cwd=project, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    values = json.loads(done.stdout.strip().splitlines()[-1])
    # Vertex snippet: the demo model tells the Quickstart's 0, 1 and 2 apart through the SDK.
    predictions = next(v for v in values if isinstance(v, list) and v and isinstance(v[0], list))
    assert [int(np.argmax(p)) for p in predictions] == [0, 1, 2], predictions
    # scikit-learn snippet: the endpoint answers the estimator's own predict().
    X_digits, _ = load_digits(return_X_y=True)
    own = joblib.load(project / "digits.joblib").predict(X_digits[:3]).tolist()
    assert own in values, (own, values)
    # Registry snippet: what its comments say happened.
    model = requests.get(f"{platform.url}/v1/projects/local/locations/us-central1/models/my_mnist", timeout=10).json()
    assert model["versionId"] == "2" and model["description"] == "digits", model
    assert set(model["versionAliases"]) == {"default", "champion"}, model
    versions = requests.get(f"{platform.url}/v1/projects/local/locations/us-central1/models/my_mnist:listVersions",
                            timeout=10).json()["models"]
    assert {v["versionId"]: sorted(v.get("versionAliases", [])) for v in versions} == {"1": [], "2": ["champion", "default"]}
    # The staged copies are in the bucket the snippet made, as files under the platform's storage root.
    assert any(p.name == "saved_model.pb" for p in (platform.workdir / "state" / "storage" / "my-staging").rglob("*"))
