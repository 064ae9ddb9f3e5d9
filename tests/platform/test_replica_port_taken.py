"""A replica whose port another process takes before it can listen is started again on new ports.

The engine picks a replica's ports (``modelyard.ports``), and the replica binds them only after
importing TensorFlow and loading its model, seconds later. Whatever takes one of them meanwhile
(another program's pick, an outgoing connection) made the deploy fail with "Address already in
use". Now ``modelyard serve`` exits with ``PORT_TAKEN_EXIT`` and the engine starts the replica again.
"""
from __future__ import annotations

import asyncio
import socket
import subprocess
from pathlib import Path

import numpy as np
import requests

from modelyard.platform import replicas
from modelyard.ports import PORT_TAKEN_EXIT


def test_a_replica_whose_port_was_taken_starts_again_on_new_ports(tmp_path, monkeypatch, tiny_models):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        picks: list[list[int]] = []

        def first_rest_port_taken(count: int, host: str = "127.0.0.1") -> list[int]:
            got = replicas_free_ports(count, host)
            picks.append(got)
            return [port, *got[1:]] if len(picks) == 1 else got

        replicas_free_ports = replicas.free_ports
        monkeypatch.setattr(replicas, "free_ports", first_rest_port_taken)
        engine = replicas.LocalEngine(tmp_path / "state", warm_spare=False)
        model = Path(tiny_models["models"]["tiny1"]["path"])

        async def start_and_stop() -> dict:
            await engine.open()
            try:
                row = await engine.start("r1", "dm1", model)
                answer = await asyncio.to_thread(
                    requests.post, f"http://127.0.0.1:{row['port']}/v1/models/{replicas.MODEL}:predict",
                    json={"instances": tiny_models["instances"]}, timeout=30)
                await engine.stop(row)
                return {"row": row, "answer": answer}
            finally:
                await engine.close()

        got = asyncio.run(start_and_stop())

    assert len(picks) == 2 and got["row"]["port"] == picks[1][0] != port
    assert got["answer"].status_code == 200, got["answer"].text
    np.testing.assert_allclose(got["answer"].json()["predictions"], tiny_models["models"]["tiny1"]["predictions"],
                               rtol=1e-5, atol=1e-6)
    log = Path(got["row"]["log_path"]).read_text()
    # The first process said why it stopped, naming the port.
    assert f"cannot bind REST port 127.0.0.1:{port} (Address already in use)" in log


def test_serve_on_a_taken_port_exits_with_the_status_that_asks_for_new_ports(tmp_path, tiny_models):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            replicas.serve_command(Path(tiny_models["models"]["tiny1"]["path"]).parent, "127.0.0.1",
                                   replicas.free_ports(1)[0], port, 0, []),
            env=replicas.serve_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == PORT_TAKEN_EXIT, result.stderr[-2000:]
    assert f"cannot bind gRPC port 127.0.0.1:{port} (Address already in use)" in result.stderr
