"""docs/*.md run as written (issue 27): each page's fenced blocks, in order, against real processes.

A fence's language says what a block is (tests/doc_blocks.py): shell blocks run with bash in a
temporary directory, a page's Python blocks run in one Python process, YAML and JSON blocks are
parsed (training configs through modelyard's own config loader), ``text`` and ``nginx`` blocks are
samples to read (docs/security.md's token-file and SSLConfig samples are still read by the parsers the
server uses). Ports, and paths under the user's home, are the test's own; the rest is verbatim.
A page's shell blocks run before its Python blocks, which is the pages' own order today.
The examples are small (two epochs, a study of 4 trials) so the pages run in CI as written: training's
several hosts are two tasks of this machine (the page's cluster.json is on localhost), tuning's hosts join
the session's PostgreSQL server (the page's `export TUNING_DB=` line names it). A block that cannot run on
one machine would go in NOT_RUN with the reason (empty today); it is still checked: bash parses it
(``bash -n``) and every ``--flag`` it gives a ``modelyard`` command is one its parser has. Blocks another
test runs are listed in RUN_ELSEWHERE.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from modelyard.ports import free_port
from tests.doc_blocks import Block, blocks, indented_blocks, sh, shell_commands, shell_env
from tests.serving.server_process import wait_for
from tests.tuning.conftest import postgres_url  # noqa: F401  (the session's PostgreSQL server)
from tests.warm_process import popen_python

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))
SHELL, PYTHON, DATA, SAMPLE = {"bash", "sh"}, {"python"}, {"yaml", "json"}, {"text", "nginx"}

# (page, the block's first line) -> why CI cannot run it. Empty: every shell and Python block runs (training's
# several hosts as tasks of this machine, tuning's PostgreSQL as the session's server). A block put here must
# be impossible on one machine; it is still parsed by bash and its flags checked against the parsers.
NOT_RUN: dict[tuple[str, str], str] = {}
FIRST_LOOK = "modelyard tune study.yaml --max-trials 2  # a first look: 2 trials (side by side) of the file's 4"
# Blocks another test runs as written: (page, first line) -> the test.
_FUNCTION_TRIALS = "tests/tuning/test_function_trials.py::test_tuning_page_function_trials_run_as_written"
RUN_ELSEWHERE: dict[tuple[str, str], str] = {
    ("docs/tuning.md", "# objective.py"): _FUNCTION_TRIALS,
    ("docs/tuning.md", "modelyard tune function_study.yaml"): _FUNCTION_TRIALS,
    ("docs/tuning.md", "# tune_digits.py"): _FUNCTION_TRIALS,
    ("docs/tuning.md", "python3 tune_digits.py"): _FUNCTION_TRIALS,
    # Needs a platform: run against the platform tests' session platform.
    ("docs/training.md", "cat > warm.yaml <<'YAML'"):
        "tests/platform/test_warm_jobs.py::test_a_training_config_starts_warm_and_ends_as_a_cold_run_does",
    # The container page's lines run through podman by the image tests (ports and names the tests' own).
    ("docs/containers.md", "./scripts/image"): "tests/image/test_serving_image.py::test_the_pages_build_line_makes_both_images",
    **{("docs/containers.md", first): "tests/image/test_serving_image.py::test_the_textbooks_docker_line_with_podman"
       for first in ("podman run -d --rm --name my_mnist_serving -v \"$MODELS/my_mnist_model:/models/my_mnist_model\" "
                     "-p 8500:8500 -p 8501:8501 -e MODEL_NAME=my_mnist_model localhost/modelyard-serving",
                     "curl -s --retry 60 --retry-connrefused --retry-delay 1 localhost:8501/v1/models/my_mnist_model",
                     "podman stop my_mnist_serving")},
    ("docs/containers.md", "podman run -d --rm --name my_models -v \"$MODELS:/models\" -p 8500:8500 -p 8501:8501 "
     "localhost/modelyard-serving --model_config_file=/models/models.config --model_config_file_poll_wait_seconds=60"):
        "tests/image/test_serving_image.py::test_a_model_config_file_with_two_models_and_labels",
    ("docs/containers.md", "podman volume create modelyard-state"):
        "tests/image/test_platform_image.py::test_the_textbooks_vertex_cells_against_the_platform_image_survive_a_restart",
    ("docs/containers.md", "podman kube play deploy/serving.yaml"):
        "tests/image/test_serving_image.py::test_kube_play_of_the_serving_manifest_becomes_ready_and_answers",
    **{("docs/vertex-sdk.md", first): "tests/platform/test_vertex_sdk_page.py::test_vertex_sdk_page_runs_as_written"
       for first in ("import os", "job = aiplatform.CustomJob(", "# trial.py",
                     "from google.cloud.aiplatform import hyperparameter_tuning as hpt", "# task.py",
                     "training_job = aiplatform.CustomTrainingJob(", "import json")},
}
# Pages whose test runs every shell and Python block not listed above -> that test. docs/tuning.md's test
# runs the blocks named in TUNING_RUN_HERE (the function-trial section is another test's).
PAGE_TESTS = {
    "docs/storage.md": "test_storage_page_runs_against_the_standalone_storage",
    "docs/open-inference-protocol.md": "test_open_inference_protocol_page_runs_against_modelyard_serve",
    "docs/training.md": "test_training_page_runs_as_written",
}


def page_blocks(page: str) -> list[Block]:
    return blocks((REPO / page).read_text())


def first_line(block: Block) -> str:
    return block.body.splitlines()[0] if block.body else ""


def to_run(page: str, kinds: set[str]) -> list[Block]:
    """The page's blocks of these kinds that this file runs (not listed in NOT_RUN or RUN_ELSEWHERE)."""
    return [b for b in page_blocks(page) if b.lang in kinds and (page, first_line(b)) not in NOT_RUN
            and (page, first_line(b)) not in RUN_ELSEWHERE]


# Python blocks of one page in one process, as a user types them into one session.
_SESSION = """
import sys
ns = {"__name__": "__main__"}
for path in sys.argv[1:]:
    exec(compile(open(path).read(), path, "exec"), ns)
"""


def run_python(page: str, codes: list[str], cwd: Path, env: dict, timeout: float = 300) -> str:
    paths = []
    for i, code in enumerate(codes):
        path = cwd / f"{Path(page).stem}_block_{i}.py"
        path.write_text(code)
        paths.append(str(path))
    done = subprocess.run([sys.executable, "-c", _SESSION, *paths], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{page}\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
    return done.stdout


# ---- every page: each block says what it is, and the lists above name real blocks ----
def test_every_block_says_what_it_is():
    known = SHELL | PYTHON | DATA | SAMPLE
    untyped = [b.where(page) for page in PAGES for b in page_blocks(page) if b.lang not in known]
    assert not untyped, f"fence these as bash/python/yaml/json, or ```text for a sample: {untyped}"
    firsts = {(page, first_line(b)) for page in PAGES for b in page_blocks(page)}
    assert set(NOT_RUN) <= firsts, set(NOT_RUN) - firsts
    assert set(RUN_ELSEWHERE) <= firsts, set(RUN_ELSEWHERE) - firsts


# Indented (unfenced) commands of docs/: (page, the command) -> the test that runs it as written.
INDENTED_RUN: dict[tuple[str, str], str] = {
    ("docs/storage.md", "python -m modelyard.platform.storage --root /tmp/gcs --port 8601"):
        "test_storage_page_runs_against_the_standalone_storage",
}
_INSTALL = re.compile(r"python3 -m pip install -e '\.\[(\w+)\]'")


def test_indented_commands_are_run_installed_or_samples():
    """Markdown's indented code blocks are commands too: each is a `$ `-prompted sample of a command with its
    output, an install of an extra that pyproject.toml has and this (installed) environment holds, or a
    command a named test of this file runs."""
    import importlib.metadata
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert indented_blocks("text\n\n    cmd --x\n\n- item\n\n    continued item text\n") == [
        Block("indented", "cmd --x\n", 3)]  # a list item's continuation is not code
    seen = set()
    for page in PAGES:
        for b in indented_blocks((REPO / page).read_text()):
            line = b.body.strip()
            if line.startswith("$ "):
                continue
            install = _INSTALL.fullmatch(line)
            if install:
                assert install.group(1) in extras, f"{b.where(page)}: pyproject.toml has no extra {install.group(1)}"
                for requirement in extras[install.group(1)]:
                    name = re.split(r"[<>=!~\[; ]", requirement)[0]
                    importlib.metadata.version(name)  # installed, as the page's line would have it
                continue
            assert (page, line) in INDENTED_RUN, f"{b.where(page)}: no test runs `{line}`; fence it as bash and run it"
            assert INDENTED_RUN[page, line] in globals()
            seen.add((page, line))
    assert seen == set(INDENTED_RUN)


def test_every_command_and_code_block_is_run():
    """Each shell and Python block of docs/ is run by a named test (or listed in NOT_RUN with the reason):
    a block added to a page without a test that runs it fails here."""
    unclaimed = []
    for page in PAGES:
        for b in page_blocks(page):
            if b.lang not in SHELL | PYTHON:
                continue
            key = (page, first_line(b))
            if key in NOT_RUN or key in RUN_ELSEWHERE or page in PAGE_TESTS:
                continue
            if page == "docs/tuning.md" and first_line(b) in TUNING_RUN_HERE:
                continue
            unclaimed.append(b.where(page))
    assert not unclaimed, f"no test runs these blocks: run them (tests/test_docs.py) or list them: {unclaimed}"
    assert all(name in globals() for name in PAGE_TESTS.values())
    for test in set(RUN_ELSEWHERE.values()):
        path, name = test.split("::")
        assert f"def {name}(" in (REPO / path).read_text(), test


def test_data_blocks_parse():
    for page in PAGES:
        for b in page_blocks(page):
            if b.lang == "json":
                json.loads(b.body)
            elif b.lang == "yaml":
                assert isinstance(yaml.safe_load(b.body), dict), b.where(page)


_HELP: dict[str, str] = {}


def _help(sub: str) -> str:
    if sub not in _HELP:
        done = subprocess.run([sys.executable, "-m", "modelyard", sub, "--help"], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, (sub, done.stderr[-2000:])
        _HELP[sub] = done.stdout
    return _HELP[sub]


def modelyard_calls(block: str) -> list[tuple[str, list[str]]]:
    """(subcommand, its --flags) of every `modelyard` command in a shell block, `launch ... -- CMD` split."""
    calls = []
    for line in block.splitlines():
        tokens = shlex.split(line, comments=True)
        segment: list[str] = []
        for token in tokens + ["&&"]:
            if token in ("--", "&", "&&", "|", ";"):
                if len(segment) > 1 and segment[0] == "modelyard":
                    calls.append((segment[1], [t.split("=")[0] for t in segment[2:] if t.startswith("--")]))
                segment = []
            else:
                segment.append(token.rstrip("&"))
    return calls


def test_blocks_not_run_parse_and_use_real_flags():
    assert all(reason.strip() for reason in NOT_RUN.values())
    # The flag lookup can fail: a flag no parser has is caught, and `launch -- CMD` is split in two.
    assert modelyard_calls("modelyard launch --workers 2 -- modelyard train x.yaml --fresh  # c") == [
        ("launch", ["--workers"]), ("train", ["--fresh"])]
    assert not re.search(r"--no-such-flag\b", _help("train"))
    for page in PAGES:
        for b in page_blocks(page):
            if (page, first_line(b)) not in NOT_RUN:
                continue
            assert b.lang in SHELL, b.where(page)
            done = subprocess.run(["bash", "-n"], input=b.body, capture_output=True, text=True)
            assert done.returncode == 0, (b.where(page), done.stderr)
            calls = modelyard_calls(b.body)
            assert calls, b.where(page)
            for sub, flags in calls:
                usage = _help(sub)
                missing = [f for f in flags if not re.search(rf"{re.escape(f)}\b", usage)]
                assert not missing, f"{b.where(page)}: `modelyard {sub}` has no {missing}"


# ---- the shells' `modelyard`: forked warm (tests/warm_shell.py), with the shell's output and exit status ----
def test_a_shell_modelyard_runs_warm_with_the_shells_output_and_exit_status(tmp_path):
    from tests import warm_shell

    env = shell_env(tmp_path)
    before = warm_shell.forked
    script = ('modelyard train missing.yaml || echo "exit $?"; modelyard serve --help | head -1; '
              'modelyard serve --help >> appended.txt; modelyard serve --help > truncated.txt')
    done = sh(script, tmp_path, env, timeout=300)
    assert done.stdout.splitlines() == ["exit 2", "usage: modelyard serve [-h] [--port PORT] [--rest_api_port REST_API_PORT]"]
    assert "modelyard train: error: config file missing.yaml not found" in done.stderr, done.stderr
    usage = (tmp_path / "appended.txt").read_text()
    assert usage.startswith("usage: modelyard serve") and (tmp_path / "truncated.txt").read_text() == usage
    # Warm: the two to a pipe and the one appending; `>` (an offset the shell shares) starts cold. All cold
    # only when this worker has no fork server for the shell's variables (warm_process.MAX_SERVERS kinds).
    from tests import warm_process

    with warm_process._lock:
        takes = not os.environ.get("MODELYARD_TEST_COLD") and warm_process._server_for(env) is not None
    assert warm_shell.forked - before == (3 if takes else 0), (warm_shell.forked - before, takes)


# ---- docs/storage.md: the standalone storage server, then the page's Python in one session ----
def test_storage_page_runs_against_the_standalone_storage(tmp_path):
    page = "docs/storage.md"
    text = (REPO / page).read_text()
    (line,) = [s.strip() for s in text.splitlines() if s.strip().startswith("python -m modelyard.platform.storage")]
    assert line == "python -m modelyard.platform.storage --root /tmp/gcs --port 8601", line
    root, port = tmp_path / "gcs", free_port()
    args = shlex.split(line.replace("/tmp/gcs", str(root)).replace("8601", str(port)))
    env = shell_env(tmp_path, HOME=str(tmp_path / "home"))
    env.pop("STORAGE_EMULATOR_HOST", None)
    log = open(tmp_path / "storage.log", "wb")
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "storage.log").read_text()
            try:
                return requests.get(f"{base}/storage/v1/b", params={"project": "local"}, timeout=2).ok
            except requests.ConnectionError:
                return False

        wait_for(ready, 60, what="the storage server")
        # The home's storage root is this server's root (the user's platform keeps it there).
        home_root = "~/.local/share/modelyard/platform-state/storage"
        codes = [b.body.replace("http://127.0.0.1:8601", base).replace(home_root, str(root))
                 for b in to_run(page, PYTHON)]
        assert len(codes) == 4 and all(base in c or str(root) in c or "TOKEN" in c or "tf_gcs" in c for c in codes)
        out = [line for line in run_python(page, codes, tmp_path, env).splitlines() if not line.startswith(("I0000",
                                                                                                             "W0000"))]
        assert out[:3] == ["b'hello'", "['notes/hello.txt']", "b'hello'"], out
        assert out[3] == out[4] == str(root / "my-staging" / "notes" / "hello.txt"), out
        # TensorFlow's own gs://, after modelyard.tf_gcs.enable(): the output the page says.
        assert out[-1] == "['gs://my-staging/notes/from-tf.txt', 'gs://my-staging/notes/hello.txt']", out
        assert (root / "my-staging" / "notes" / "hello.txt").read_bytes() == b"hello"
        # The error sample is what the server answers for an unknown bucket.
        (sample,) = [json.loads(b.body) for b in to_run(page, {"json"})]
        answer = requests.get(f"{base}/storage/v1/b/nope", timeout=10)
        assert answer.status_code == 404 and answer.json() == sample, answer.text
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


# ---- docs/open-inference-protocol.md: `modelyard serve` of the demo model, the curl block, tritonclient ----
def test_open_inference_protocol_page_runs_against_modelyard_serve(tmp_path):
    page = "docs/open-inference-protocol.md"
    rest, grpc_port = free_port(), free_port()
    env = shell_env(tmp_path)
    # Forked from the worker's warm interpreter (tests/warm_process.py): the page's server, not its start-up.
    proc = popen_python([sys.executable, "-m", "modelyard", "serve", "--host", "127.0.0.1", "--rest_api_port",
                         str(rest), "--port", str(grpc_port)], env, tmp_path / "serve.log", cwd=tmp_path)
    try:
        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                return requests.get(f"http://127.0.0.1:{rest}/v1/models/my_mnist_model", timeout=5).ok
            except requests.RequestException:  # not listening yet, or busy loading
                return False

        wait_for(ready, 240, what="modelyard serve of the demo model")
        (shell,) = to_run(page, SHELL)
        assert shell.body.count("localhost:8501") == 3
        out = sh(shell.body.replace("localhost:8501", f"127.0.0.1:{rest}"), tmp_path, env).stdout
        # The three curls' JSON answers, back to back.
        decoder, rest_out, values = json.JSONDecoder(), out.strip(), []
        while rest_out:
            value, end = decoder.raw_decode(rest_out)
            values.append(value)
            rest_out = rest_out[end:].lstrip()
        metadata, ready, infer = values  # the model's metadata, version 2's readiness, the inference
        assert ready == {"name": "my_mnist_model", "ready": True}, ready
        assert metadata["name"] == "my_mnist_model" and metadata["inputs"][0]["name"] == "image", metadata
        (probabilities,) = infer["outputs"]
        assert probabilities["name"] == "probabilities" and probabilities["shape"] == [2, 10], infer
        (client,) = to_run(page, PYTHON)
        printed = run_python(page, [client.body.replace("localhost:8501", f"127.0.0.1:{rest}")], tmp_path, env)
        assert printed.strip() == "[0 1 2]", printed  # the demo's 0, 1 and 2, told apart
    finally:
        proc.terminate()
        proc.wait(20)


# ---- docs/security.md: samples only; the token file sample is what the real parser reads ----
def test_security_page_token_file_sample_parses():
    from modelyard.serving.security.auth import parse_token_file

    (tokens,) = [b.body for b in page_blocks("docs/security.md") if b.body.startswith("# token")]
    parsed = parse_token_file(tokens, "docs/security.md")
    assert sorted(sorted(s) for s in parsed.values()) == [["admin", "metrics", "predict", "read"], ["metrics", "read"],
                                                          ["predict"]]


def test_security_page_ssl_config_sample_is_an_ssl_config():
    """The SSLConfig sample (PEMs elided) parses with the reader --ssl_config_file uses, fields and all."""
    from modelyard.serving.security.tls import SSLConfigProto
    from modelyard.serving.textproto import parse_text_proto

    (sample,) = [b.body for b in page_blocks("docs/security.md") if b.body.startswith("server_key:")]
    proto = parse_text_proto(sample, SSLConfigProto(), "docs/security.md")
    assert proto.server_key.startswith("-----BEGIN PRIVATE KEY-----\n") and proto.client_verify
    assert proto.server_cert.endswith("-----END CERTIFICATE-----\n") and proto.custom_ca


# ---- docs/training.md: the page in order, in one folder: its files written, its commands run ----
def _bash_in_background(body: str, cwd: Path, env: dict, log: Path) -> subprocess.Popen:
    """A block that leaves a process running (`cmd &`): its own session, so the test stops everything it
    started; output to a file, since a background child keeps a pipe open after bash exits. The file is opened
    for appending, as a terminal takes every writer's lines where they come (a warm `modelyard` reopens it)."""
    return subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", body], cwd=cwd, env=env, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _stop_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    proc.wait(30)


def test_training_page_runs_as_written(tmp_path):
    """docs/training.md from the top: mnist.yaml trained and exported, mwms.yaml launched as two workers, then
    as the two hosts of cluster.json (both here), my_model.py built, every config section through the
    loader, and the export-to-serving block against its own server. Ports are the test's own."""
    from modelyard.training import config

    page = "docs/training.md"
    every = page_blocks(page)
    named = {first_line(b)[2:]: b for b in every if b.lang in ("yaml", "python") and first_line(b).startswith("# ")}
    assert set(named) == {"mnist.yaml", "mwms.yaml", "my_model.py"}, set(named)
    for name, b in named.items():
        (tmp_path / name).write_text(b.body)
    shells = to_run(page, SHELL)
    assert [first_line(b).split(" --")[0] for b in shells] == [
        "modelyard train mnist.yaml", "modelyard launch", "modelyard launch", "modelyard serve"], shells
    env = shell_env(tmp_path)
    train, launch, hosts, serve = shells

    # Quick start: two epochs on two logical CPUs, exported as version 1.
    out = sh(train.body, tmp_path, env).stdout
    assert re.search(r"^epoch 2/2 ", out, re.M) and "exported" in out, out
    assert (tmp_path / "models" / "my_mnist_model" / "0001" / "saved_model.pb").is_file()
    metrics = json.loads((tmp_path / "runs" / "mnist" / "metrics.json").read_text())
    (sample,) = [json.loads(b.body) for b in every if b.lang == "json" and '"epochs_planned"' in b.body]
    assert set(sample) <= set(metrics) and set(sample["epochs"][0]) <= set(metrics["epochs"][0]), (sample, metrics)
    assert metrics["replicas"] == 2 and metrics["epochs_completed"] == 2 and metrics["completed"]

    # Two workers on this machine.
    out = sh(launch.body, tmp_path, env).stdout
    assert "worker:1 | epoch 2/2" in out and "job finished (2 task(s))" in out, out
    # Warm tasks (the default): each task's first line says it was forked warm, as the page shows.
    assert sorted(re.findall(r"^(worker:\d) \| \[modelyard\] warm start: ", out, re.M)) == ["worker:0", "worker:1"], out

    # Several hosts: cluster.json (the JSON block before the commands) on free ports, both hosts' tasks here.
    (spec,) = [b for b in every if b.lang == "json" and b.line < hosts.line and "localhost:2222" in b.body]
    ports = [free_port(), free_port()]
    (tmp_path / "cluster.json").write_text(
        spec.body.replace("localhost:2222", f"localhost:{ports[0]}").replace("localhost:2223", f"localhost:{ports[1]}"))
    assert json.loads((tmp_path / "cluster.json").read_text()) == {"worker": [f"localhost:{p}" for p in ports]}
    out = sh(hosts.body, tmp_path, env).stdout
    assert out.count("job finished") == 2 and "epoch 2/2" in out, out

    # Configs: the whole ones load as they are, a section is added to mnist.yaml's model and data.
    base_raw = yaml.safe_load(named["mnist.yaml"].body)
    (tmp_path / "data").mkdir(exist_ok=True)
    for b in to_run(page, {"yaml"}):
        raw = yaml.safe_load(b.body)
        mapping = raw if "model" in raw else {"model": base_raw["model"], "data": base_raw["data"], **raw}
        try:
            config.from_mapping(mapping, tmp_path / "job.yaml")
        except config.ConfigError as exc:
            pytest.fail(f"{b.where(page)}: {exc}")
    # my_model.py as written, then the build_model() the trainer calls (in this process: TensorFlow is
    # loaded once for the whole suite, where a process of its own would load it again).
    import modelyard  # noqa: F401  (TF_USE_LEGACY_KERAS before tf_keras loads)

    namespace: dict = {"__name__": "my_model"}
    exec(compile(named["my_model.py"].body, f"{page} (my_model.py)", "exec"), namespace)
    assert namespace["build_model"]().output_shape == (None, 10)

    # Export to serving: the server in the background, a second training exports 0002, the curl answers.
    rest, grpc_port = free_port(), free_port()
    assert serve.body.count(" models/my_mnist_model &") == 1 and serve.body.count("localhost:8501") == 1
    body = serve.body.replace(" models/my_mnist_model &", f" models/my_mnist_model --port {grpc_port} "
                              f"--rest_api_port {rest} &").replace("localhost:8501", f"127.0.0.1:{rest}")
    log = tmp_path / "serve-block.log"
    proc = _bash_in_background(body, tmp_path, env, log)
    try:
        assert proc.wait(600) == 0, log.read_text()[-4000:]
        # The curl's answer (no newline of its own: the server's next log line may follow it on that line).
        answer = json.loads(re.search(r'\{"predictions":\[\[[^\]]*\]\]\}', log.read_text()).group(0))
        (probabilities,) = answer["predictions"]
        assert len(probabilities) == 10 and probabilities.index(max(probabilities)) == 0, answer  # a 0

        def on_version_2() -> bool:
            status = requests.get(f"http://127.0.0.1:{rest}/v1/models/my_mnist_model", timeout=5).json()
            return any(v["version"] == "2" and v["state"] == "AVAILABLE" for v in status["model_version_status"])

        wait_for(on_version_2, 60, what="the server moving to version 2")
    finally:
        _stop_session(proc)


# ---- docs/tuning.md: the quick start's three lines, the Vertex job file, two hosts joining on PostgreSQL ----
_DB_LINE = "export TUNING_DB=postgresql://user@db-host/tuning"
_JOIN_LINE = 'modelyard tune study.yaml --join --storage "$TUNING_DB"'
TUNING_RUN_HERE = {"# train.py", FIRST_LOOK, "modelyard tune hpt_job.json", _DB_LINE, _JOIN_LINE}


def test_tuning_page_runs_as_written(tmp_path, postgres_url):
    """docs/tuning.md's commands in page order, in the folder holding its train.py and study.yaml: the first
    look (2 trials), the study on to the file's 4, its status; hpt_job.json beside them; then two "hosts"
    (two folders with the same files, both here) joining one study on the test's PostgreSQL server: the one
    substitution is the database URL in the page's `export TUNING_DB=` line, the session's server."""
    page = "docs/tuning.md"
    every = page_blocks(page)
    (train,) = [b for b in every if b.lang == "python" and first_line(b) == "# train.py"]
    (study,) = [b for b in every if b.lang == "yaml" and first_line(b) == "# study.yaml"]
    (quick,) = [b for b in every if b.lang in SHELL and first_line(b) == FIRST_LOOK]
    (job,) = [b for b in every if b.lang == "json" and '"trialJobSpec"' in b.body]
    (tune_job,) = [b for b in every if b.lang in SHELL and b.body.strip() == "modelyard tune hpt_job.json"]
    (db,) = [b for b in every if b.lang in SHELL and b.body.strip() == _DB_LINE]
    (join,) = [b for b in every if b.lang in SHELL and b.body.strip() == _JOIN_LINE]
    assert train.line < study.line < quick.line < job.line < tune_job.line < db.line < join.line
    folder = tmp_path / "quick"
    folder.mkdir()
    for f in (folder, tmp_path / "host-1", tmp_path / "host-2"):
        f.mkdir(exist_ok=True)
        (f / "train.py").write_text(train.body)
        (f / "study.yaml").write_text(study.body)
    env = shell_env(tmp_path)

    first, rest_of_study, status = shell_commands(quick.body)
    out = sh(first, folder, env, timeout=900).stdout
    assert "2 trial(s), 2 at a time" in out, out
    out = sh(rest_of_study, folder, env, timeout=900).stdout
    assert "4 trial(s), 2 at a time" in out, out
    best = re.search(r"^best: trial \d+  accuracy = ([\d.]+)", out, re.M)
    assert best and float(best.group(1)) > 0.5, out  # a real model learnt the digits
    shown = sh(status, folder, env).stdout
    tally = re.search(r"study mnist-mlp: (\d+) complete, (\d+) pruned, 0 failed, 0 running of max_trial_count 4",
                      shown)
    assert tally and int(tally.group(1)) + int(tally.group(2)) == 4, shown
    assert (folder / "mnist-mlp.tuning.db").is_file() and (folder / "runs" / "mnist-mlp" / "trial-0004").is_dir()

    # The Vertex HyperparameterTuningJob JSON, saved beside train.py.
    (folder / "hpt_job.json").write_text(job.body)
    out = sh(tune_job.body, folder, env, timeout=900).stdout
    assert "study mnist-mlp-vertex" in out and "2 trial(s), 2 at a time" in out, out
    assert re.search(r"^best: trial \d+  accuracy = ", out, re.M), out
    assert {p.name for p in (folder / "runs" / "mnist-mlp-vertex").iterdir()} >= {"trial-0001", "trial-0002"}

    # Several hosts: the export line (URL swapped for the test's server), then the join line, in each folder.
    script = db.body.replace("postgresql://user@db-host/tuning", postgres_url) + join.body
    assert postgres_url in script
    logs = [tmp_path / f"host-{i}.log" for i in (1, 2)]
    hosts = [_bash_in_background(script, tmp_path / f"host-{i}", env, log) for i, log in zip((1, 2), logs)]
    try:
        codes = [h.wait(900) for h in hosts]
    finally:
        for h in hosts:
            _stop_session(h)
    outputs = [log.read_text() for log in logs]
    assert codes == [0, 0], outputs
    shown = sh(f"modelyard tune status study.yaml --storage {shlex.quote(postgres_url)}", tmp_path / "host-1", env).stdout
    tally = re.search(r"study mnist-mlp: (\d+) complete, (\d+) pruned, 0 failed", shown)
    assert tally and int(tally.group(1)) + int(tally.group(2)) == 4, shown
    assert not (tmp_path / "host-1" / "mnist-mlp.tuning.db").exists()  # nothing went to the default SQLite
