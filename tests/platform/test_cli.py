"""``modelyard models ...`` / ``modelyard endpoints ...`` against a real platform (the token-guarded one
of the bad-input tests). The commands run in this process (their parser and client code, the real
HTTP calls): a subprocess per command would spend seconds building every area's parser."""
from __future__ import annotations

import argparse
import json

from modelyard.platform import client_cli
from tests.platform.conftest import TOKEN


def run(capsys, *argv: str) -> tuple[int, object, str]:
    parser = argparse.ArgumentParser(prog="modelyard")
    client_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else None, err


def test_models_and_endpoints_commands(guarded, tiny_models, capsys):
    p, _ = guarded
    auth = ["--platform", p.url, "--token", TOKEN]
    code, up, _ = run(capsys, "models", "upload", *auth, "--display-name", "cli",
                      "--artifact-uri", tiny_models["models"]["tiny1"]["path"])
    assert code == 0 and up["modelVersionId"] == "1"
    model = up["model"].rsplit("/", 1)[-1]
    code, v2, _ = run(capsys, "models", "upload", *auth, "--display-name", "cli",
                      "--artifact-uri", tiny_models["models"]["tiny1"]["path"], "--parent-model", model)
    assert code == 0 and v2["modelVersionId"] == "2"
    code, desc, _ = run(capsys, "models", "describe", *auth, f"{model}@1")
    assert code == 0 and desc["versionId"] == "1" and desc["versionAliases"] == []
    assert run(capsys, "models", "describe", *auth, model)[1]["versionAliases"] == ["default"]
    assert model in [m["name"].rsplit("/", 1)[-1] for m in run(capsys, "models", "list", *auth)[1]]

    code, ep, _ = run(capsys, "endpoints", "create", *auth, "--display-name", "cli-ep")
    endpoint = ep["name"].rsplit("/", 1)[-1]
    assert run(capsys, "endpoints", "describe", *auth, endpoint)[1]["displayName"] == "cli-ep"
    code, _, err = run(capsys, "endpoints", "update-traffic", *auth, endpoint, "123=100")
    assert code == 1 and "INVALID_ARGUMENT" in err and "not deployed" in err
    code, _, err = run(capsys, "endpoints", "describe", "--platform", p.url, "--token", "wrong", endpoint)
    assert code == 1 and "UNAUTHENTICATED" in err
    assert run(capsys, "endpoints", "delete", *auth, endpoint)[0] == 0
    assert run(capsys, "models", "delete", *auth, model)[0] == 0
    code, _, err = run(capsys, "models", "describe", *auth, model)
    assert code == 1 and "NOT_FOUND" in err
