"""A replica whose port another process takes before it can listen is started again on new ports.

The engine picks a replica's ports (``modelyard.ports``), and the replica binds them only after
importing TensorFlow and loading its model, seconds later. Whatever takes one of them meanwhile
(another program's pick, an outgoing connection) made the deploy fail with "Address already in
use". Now ``modelyard serve`` exits with ``PORT_TAKEN_EXIT`` and the local engine starts it again
on new ports. (The Ray engine does not yet: its actor cannot tell its own child listening from
another process holding the port, see replicas_ray.)
"""
from __future__ import annotations

import asyncio
import socket
import subprocess
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import requests

from modelyard.platform.dataplane import replicas
from modelyard.ports import PORT_TAKEN_EXIT

from tests import aio


@contextmanager
def taken_port():
    """A loopback port another socket listens on, while the block runs."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@contextmanager
def first_rest_port_taken(monkeypatch):
    """The engine's ``free_ports`` hands out a taken port as the first REST port, then real ones. Yields
    that port and the picks made."""
    real = replicas.free_ports
    with taken_port() as port:
        picks: list[list[int]] = []

        def pick(count: int, host: str = "127.0.0.1") -> list[int]:
            got = real(count, host)
            picks.append(got)
            return [port, *got[1:]] if len(picks) == 1 else got

        monkeypatch.setattr(replicas, "free_ports", pick)
        yield port, picks


def _predict(row: dict, tiny_models) -> None:
    answer = requests.post(f"http://127.0.0.1:{row['port']}/v1/models/{replicas.MODEL}:predict",
                           headers={"Authorization": replicas.replica_secrets.authorization(row).decode()},
                           json={"instances": tiny_models["instances"]}, timeout=30)
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(answer.json()["predictions"], tiny_models["models"]["tiny1"]["predictions"],
                               rtol=1e-5, atol=1e-6)


def test_a_local_replica_whose_port_was_taken_starts_again_on_new_ports(tmp_path, monkeypatch, tiny_models):
    engine = replicas.LocalEngine(tmp_path / "state", warm_spare=False)
    model = Path(tiny_models["models"]["tiny1"]["path"])

    async def start_and_stop() -> dict:
        await engine.open()
        try:
            row = await engine.start("r1", "dm1", model)
            await asyncio.to_thread(_predict, row, tiny_models)
            await engine.stop(row)
            return row
        finally:
            await engine.close()

    with first_rest_port_taken(monkeypatch) as (port, picks):
        row = aio.run(start_and_stop())
    assert len(picks) == 2 and row["port"] == picks[1][0] != port
    # The first process said why it stopped, naming the port.
    assert f"cannot bind REST port 127.0.0.1:{port} (Address already in use)" in Path(row["log_path"]).read_text()


def test_serve_on_a_taken_port_exits_with_the_status_that_asks_for_new_ports(tiny_models):
    with taken_port() as port:
        result = subprocess.run(
            replicas.serve_command(Path(tiny_models["models"]["tiny1"]["path"]).parent, "127.0.0.1",
                                   replicas.free_ports(1)[0], port, 0, []),
            env=replicas.serve_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == PORT_TAKEN_EXIT, result.stderr[-2000:]
    assert f"cannot bind gRPC port 127.0.0.1:{port} (Address already in use)" in result.stderr


def test_a_platform_whose_api_or_storage_port_is_taken_exits_port_taken(tmp_path):
    """The platform itself says the same (so a supervisor or a test fixture picks other ports), for
    its API port and for its Cloud Storage's."""
    import sys

    from modelyard.ports import free_port
    from tests.platform.conftest import _env

    for which in ("--storage-port", "--port"):
        with taken_port() as port:
            other = free_port()
            ports = {"--port": other, "--storage-port": other}
            ports[which] = port
            done = subprocess.run(
                [sys.executable, "-m", "modelyard.platform", "--port", str(ports["--port"]),
                 "--storage-port", str(ports["--storage-port"]), "--state-dir", str(tmp_path / which),
                 # its own database too: the default one is the user's (XDG data), never a test's to migrate
                 "--store", str(tmp_path / f"{which.strip('-')}.db")],
                capture_output=True, text=True, timeout=120, env=_env())  # its own storage: no STORAGE_EMULATOR_HOST
        assert done.returncode == PORT_TAKEN_EXIT, (which, done.stderr[-2000:])
        assert "modelyard platform: error" in done.stderr and "in use" in done.stderr, done.stderr[-2000:]
