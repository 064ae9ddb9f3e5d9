"""docs/*.md run as written (issue 27): each page's fenced blocks, in order, against real processes.

A fence's language says what a block is (tests/doc_blocks.py): shell blocks run with bash in a
temporary directory, a page's Python blocks run in one Python process, YAML and JSON blocks are
parsed (training configs through modelyard's own config loader), ``text`` and ``nginx`` blocks are
samples to read (docs/security.md's token-file and SSLConfig samples are still read by the parsers the
server uses). Ports, and paths under the user's home, are the test's own; the rest is verbatim.
A page's shell blocks run before its Python blocks, which is the pages' own order today.
Blocks too expensive for CI are listed in NOT_RUN with the reason; they are still checked: bash
parses them (``bash -n``) and every ``--flag`` they give a ``modelyard`` command is one its parser
has. Blocks another test runs are listed in RUN_ELSEWHERE.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from modelyard.ports import free_port
from tests.doc_blocks import Block, blocks, sh, shell_env
from tests.serving.server_process import wait_for

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))
SHELL, PYTHON, DATA, SAMPLE = {"bash", "sh"}, {"python"}, {"yaml", "json"}, {"text", "nginx"}

# (page, the block's first line) -> why CI does not run it.
NOT_RUN: dict[tuple[str, str], str] = {
    ("docs/training.md", "modelyard train mnist.yaml"):
        "a TensorFlow training (5 epochs under mirrored); tests/training trains the same config",
    ("docs/training.md", "modelyard launch --workers 2 -- modelyard train mwms.yaml      # strategy: multi_worker_mirrored"):
        "a two-worker MultiWorkerMirrored launch (two TF processes); tests/training/ runs launches",
    ("docs/training.md", "modelyard launch --cluster-spec cluster.json --task worker:1 -- modelyard train job.yaml"):
        "one task of a job spread over several hosts: it waits for the other hosts' tasks",
    ("docs/training.md", "modelyard serve --model_name my_mnist_model --model_base_path models/my_mnist_model &"):
        "a server plus a second training; its curl's instance is elided (`...`), a 784-number image",
    ("docs/tuning.md", "modelyard tune hpt_job.json"):
        "needs a Vertex HyperparameterTuningJob JSON the page describes but does not show in full",
    ("docs/tuning.md", "modelyard tune study.yaml --join --storage postgresql://user@db-host/tuning   # on each host"):
        "needs a PostgreSQL server on db-host shared by several hosts",
}
FIRST_LOOK = "modelyard tune study.yaml --max-trials 2  # a first look: 2 trials (side by side) of the file's 20"
# Blocks another test runs as written: (page, first line) -> the test.
RUN_ELSEWHERE: dict[tuple[str, str], str] = {
    ("docs/tuning.md", "# train.py"): "tests/test_readme.py::test_tuning_quick_start_runs_as_written",
    ("docs/tuning.md", "# study.yaml"): "tests/test_readme.py::test_tuning_quick_start_runs_as_written",
    ("docs/tuning.md", FIRST_LOOK):  # its middle line (20 trainings, minutes) is not run anywhere
        "tests/test_readme.py::test_tuning_quick_start_runs_as_written: the first-look and status lines",
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
        assert len(codes) == 3 and all(base in c or str(root) in c or "TOKEN" in c for c in codes)
        out = run_python(page, codes, tmp_path, env).splitlines()
        assert out[:3] == ["b'hello'", "['notes/hello.txt']", "b'hello'"], out
        assert out[3] == out[4] == str(root / "my-staging" / "notes" / "hello.txt"), out
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
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "modelyard", "serve", "--host", "127.0.0.1", "--rest_api_port",
                             str(rest), "--port", str(grpc_port)], cwd=tmp_path, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
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
        log.close()


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


# ---- docs/training.md: configs through the real loader, my_model.py built, the CLI's help ----
def test_training_page_configs_load_and_my_model_builds(tmp_path):
    from modelyard.training import config

    page = "docs/training.md"
    yamls = to_run(page, {"yaml"})
    assert first_line(yamls[0]) == "# mnist.yaml"
    (tmp_path / "mnist.yaml").write_text(yamls[0].body)
    base, base_raw = config.load(tmp_path / "mnist.yaml"), yaml.safe_load(yamls[0].body)
    assert base.global_batch_size == 64 and base.epochs == 5
    (my_model,) = to_run(page, PYTHON)
    assert first_line(my_model) == "# my_model.py"
    (tmp_path / "my_model.py").write_text(my_model.body)
    (tmp_path / "data").mkdir()
    for b in yamls[1:]:
        raw = yaml.safe_load(b.body)
        # A whole config (it names its model) loads as it is; a section is added to mnist.yaml's model and data.
        mapping = raw if "model" in raw else {"model": base_raw["model"], "data": base_raw["data"], **raw}
        try:
            config.from_mapping(mapping, tmp_path / "job.yaml")
        except config.ConfigError as exc:
            pytest.fail(f"{b.where(page)}: {exc}")
    # my_model.py as written, then the build_model() the trainer calls.
    env = shell_env(tmp_path)
    out = run_python(page, [my_model.body, "print(build_model().output_shape)"], tmp_path, env)
    assert out.strip() == "(None, 10)", out
