"""Replicas trust only their platform (issue 43, findings 1 and 3), on the ``guarded`` platform
(``--auth-token`` with ``--auth-predict``):

- a replica's REST and gRPC ports refuse a call without the replica's own secret (TF Serving's 401
  body, gRPC UNAUTHENTICATED), while the platform's routing, which sends it, serves;
- the reload attack: ``HandleReloadConfigRequest`` naming a pickled model (whose unpickling would create
  a marker file) is refused, by anyone (even with the replica's secret: no replica token holds
  ``admin``), and so is the Open Inference Protocol's repository load; the marker never appears;
- no replica carries the platform's token in its environment, nor its secret on its command line;
- the state directory is private (0700, files 0600, the SQLite store too);
- ``/metrics`` needs the token.
"""
from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests

from modelyard.platform.dataplane import replica_secrets
from tests.platform.client import Api
from tests.platform.conftest import TOKEN
from tests.platform.test_bad_input import google_error

RELOAD = "/tensorflow.serving.ModelService/HandleReloadConfigRequest"
PREDICT = "/tensorflow.serving.PredictionService/Predict"


class _Marker:
    """A pickle that creates ``path`` when it is loaded: harmless proof that the pickle ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (wire type 2); lengths here stay below 2**14."""
    def varint(n: int) -> bytes:
        out = b""
        while n >= 0x80:
            out, n = out + bytes([n & 0x7F | 0x80]), n >> 7
        return out + bytes([n])
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def reload_request(name: str, base_path: str) -> bytes:
    """ReloadConfigRequest{config: ModelServerConfig{model_config_list: {config: [ModelConfig{name, base_path}]}}},
    encoded by hand (TensorFlow Serving's generated classes would import TensorFlow into the test process)."""
    model_config = _field(1, name.encode()) + _field(2, base_path.encode())
    return _field(1, _field(1, _field(1, model_config)))


@pytest.fixture(scope="module")
def deployed(guarded, tiny_models):
    p, _root = guarded
    api = Api(p.url, TOKEN)
    model = api.upload(tiny_models["models"]["tiny1"]["path"], "trusted")
    endpoint = api.create_endpoint("trusted")
    dm = api.deploy(endpoint, model)
    (replica,) = [r for r in api.replicas() if r["deployedModelId"] == dm]
    yield {"p": p, "api": api, "endpoint": endpoint, "replica": replica}
    api.undeploy(endpoint, dm)


def _args(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [os.fsdecode(a) for a in f.read().split(b"\0")]


def _secret(pid: int) -> str:
    token_file = replica_secrets.token_file_of(pid)
    assert token_file is not None, f"replica {pid} runs without --auth_token_file: {_args(pid)}"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    return replica_secrets.read_secret(token_file)


def test_a_replica_port_needs_the_replicas_secret(deployed, tiny_models):
    replica, instances = deployed["replica"], tiny_models["instances"]
    url = f"http://127.0.0.1:{replica['port']}/v1/models/model:predict"
    for headers in ({}, {"Authorization": f"Bearer {TOKEN}"}, {"Authorization": "Bearer not-the-secret"}):
        r = requests.post(url, json={"instances": instances}, headers=headers, timeout=10)
        assert r.status_code == 401, (headers, r.status_code, r.text[:300])
        assert set(r.json()) == {"error"} and r.headers["WWW-Authenticate"].startswith("Bearer")  # TF Serving's body
    assert requests.get(f"http://127.0.0.1:{replica['port']}/v1/models/model", timeout=10).status_code == 401

    grpc_port = _args(replica["pid"])[_args(replica["pid"]).index("--port") + 1]
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as err:
            channel.unary_unary(PREDICT)(b"", timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED

    # The platform's own routing sends the secret: predicts through the endpoint are served.
    r = deployed["api"].predict(deployed["endpoint"], instances)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["predictions"], tiny_models["models"]["tiny1"]["predictions"],
                               rtol=1e-5, atol=1e-6)
    # And the replica itself answers its own secret.
    r = requests.post(url, json={"instances": instances}, timeout=10,
                      headers={"Authorization": f"Bearer {_secret(replica['pid'])}"})
    assert r.status_code == 200, r.text


def test_the_reload_attack_is_refused_and_its_pickle_never_runs(deployed, tiny_models, tmp_path):
    replica = deployed["replica"]
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil"
    (evil / "1").mkdir(parents=True)
    (evil / "1" / "model.pkl").write_bytes(pickle.dumps(_Marker(marker)))
    args = _args(replica["pid"])
    grpc_port = args[args.index("--port") + 1]

    def attempt(metadata, code: grpc.StatusCode) -> None:
        with pytest.raises(grpc.RpcError) as err:
            reload(reload_request("evil", str(evil)), metadata=metadata, timeout=60)
        assert err.value.code() == code, (metadata, err.value.code(), err.value.details())
        assert not marker.exists()

    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        reload = channel.unary_unary(RELOAD)
        attempt(None, grpc.StatusCode.UNAUTHENTICATED)  # a neighbour on the host
        attempt((("authorization", f"Bearer {TOKEN}"),), grpc.StatusCode.UNAUTHENTICATED)  # the platform's token
        secret = _secret(replica["pid"])  # even the replica's own secret has no admin scope
        attempt((("authorization", f"Bearer {secret}"),), grpc.StatusCode.PERMISSION_DENIED)
    # The Open Inference Protocol's model repository: load and unload are management calls too.
    base = f"http://127.0.0.1:{replica['port']}/v2/repository/models/model"
    for verb in ("load", "unload"):
        assert requests.post(f"{base}/{verb}", json={}, timeout=10).status_code == 401
        assert requests.post(f"{base}/{verb}", json={}, timeout=10,
                             headers={"Authorization": f"Bearer {secret}"}).status_code == 403
    assert not marker.exists()
    # Only what the platform registered is served: the same model, through the platform.
    r = deployed["api"].predict(deployed["endpoint"], tiny_models["instances"])
    assert r.status_code == 200 and not marker.exists()
    np.testing.assert_allclose(r.json()["predictions"], tiny_models["models"]["tiny1"]["predictions"],
                               rtol=1e-5, atol=1e-6)


def test_replicas_never_hold_the_platforms_token(deployed):
    p = deployed["p"]
    pids = p.replica_pids(spares=True)
    assert deployed["replica"]["pid"] in pids
    for pid in pids:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        holding = sorted(k.decode() for k, v in env.items() if TOKEN.encode() in v)
        assert not holding, f"replica {pid} has the platform's token in {holding}"
        assert _secret(pid) not in " ".join(_args(pid))  # the secret is in its file, not on its command line


def test_the_state_directory_is_private(deployed):
    p = deployed["p"]
    state = p.workdir / "state"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((p.workdir / "platform.db").stat().st_mode) == 0o600
    opened = []
    for root, dirs, files in os.walk(state):
        for name in dirs + files:
            path = Path(root) / name
            if not path.is_symlink() and stat.S_IMODE(path.lstat().st_mode) & 0o077:
                opened.append(f"{path.relative_to(state)} {stat.filemode(path.lstat().st_mode)}")
    assert not opened, opened
    assert (state / "storage.log").exists()


def test_metrics_need_the_token(deployed):
    url = deployed["p"].url + "/metrics"
    google_error(requests.get(url, timeout=10), 401, "UNAUTHENTICATED")
    r = requests.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert r.status_code == 200 and deployed["endpoint"] in r.text


# ---- one layer down, without processes ------------------------------------------------------------

def test_private_env_drops_the_platforms_credentials_by_name_and_by_value():
    env = {"PATH": "/bin", "MODELYARD_PLATFORM_TOKEN": "admin-secret", "MODELYARD_STORAGE_TOKEN": "admin-secret",
           "MY_COPY": "admin-secret", "HOME": "/home/u"}
    assert replica_secrets.private_env(env) == {"PATH": "/bin", "HOME": "/home/u"}


def test_a_token_file_is_private_even_over_an_open_one(tmp_path):
    (tmp_path / replica_secrets.TOKEN_FILE).write_text("old predict\n")
    (tmp_path / replica_secrets.TOKEN_FILE).chmod(0o644)
    path = replica_secrets.write_token_file(tmp_path, "s" * 43)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert replica_secrets.read_secret(path) == "s" * 43 and path.read_text().split()[1] == replica_secrets.SCOPES
    assert "admin" not in replica_secrets.SCOPES.split(",")
    flags = replica_secrets.serve_flags(path, [tmp_path, tmp_path / "model"])
    assert flags[:2] == ["--auth_token_file", str(path)] and flags[2] == "--model_roots"
    assert replica_secrets.serve_flags(path, [tmp_path / "a,b"]) == ["--auth_token_file", str(path)]


def test_make_private_tightens_an_existing_state_dir_and_store(tmp_path):
    from modelyard.platform.private_state import make_private

    state, db = tmp_path / "state", tmp_path / "platform.db"
    state.mkdir(mode=0o755)
    db.write_bytes(b"")
    Path(f"{db}-wal").write_bytes(b"")
    for path in (db, Path(f"{db}-wal")):
        path.chmod(0o644)
    before = os.umask(0o022)
    try:
        make_private(state, f"sqlite:///{db}")
        assert os.umask(0o022) == 0o077  # what the platform and its children create from now on is private
    finally:
        os.umask(before)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in (db, Path(f"{db}-wal"))} == {0o600}


def test_make_private_refuses_a_directory_other_users_share(tmp_path):
    """A state dir such as /tmp (sticky, world-writable) is refused, never chmod-ed 0700 under its users."""
    from modelyard.platform.private_state import SharedStateDir, make_private

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    before = os.umask(0o022)
    try:
        with pytest.raises(SharedStateDir, match="shared with other users"):
            make_private(shared, f"sqlite:///{tmp_path / 'platform.db'}")
    finally:
        os.umask(before)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


@pytest.mark.e2e  # python -m venv
def test_a_jobs_virtualenv_is_private_too(tmp_path):
    """venv copies its activate scripts with their templates' 0644 past the umask: the job's env tightens them."""
    from modelyard.platform.jobs.job_env import PythonEnv

    before = os.umask(0o077)
    try:
        PythonEnv(tmp_path).create()
    finally:
        os.umask(before)
    opened = [str(path) for path in (tmp_path / "venv").rglob("*")
              if not path.is_symlink() and stat.S_IMODE(path.lstat().st_mode) & 0o077]
    assert not opened, opened
