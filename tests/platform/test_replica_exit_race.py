"""A replica whose load fails fast is reported as failed even when another call reaps it first.

``LocalEngine.start`` polls the new process until its model is AVAILABLE or it exits. Other
calls (``want_spare``, run by ``start`` itself and by the supervisor) reap exited children; a
replica that died before the next poll was once reaped there, and its start then waited out the
whole start timeout (180 s) for a process that was gone. Seen in a full suite run as
``test_bad_requests_get_google_errors_and_create_nothing`` failing with DEADLINE_EXCEEDED.
"""
from __future__ import annotations

import pytest

from modelyard.platform.dataplane import replicas
from modelyard.platform.api.errors import ApiError

from tests import aio


@pytest.mark.e2e  # LocalEngine starts a real `modelyard serve` (inside the package, where tests/classify.py does not read)
def test_a_replica_reaped_by_another_call_still_fails_its_start_at_once(tmp_path, monkeypatch):
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "saved_model.pb").write_bytes(b"not a SavedModel")
    engine = replicas.LocalEngine(tmp_path / "state", warm_spare=False)
    real_want_spare = engine.want_spare

    def reap_after_the_replica_exits(wanted: bool) -> None:
        # The race, made certain: the replica's process has exited and someone reaps it first.
        for proc in list(engine._children.values()):
            proc.wait(timeout=120)
        real_want_spare(wanted)

    monkeypatch.setattr(engine, "want_spare", reap_after_the_replica_exits)
    wait_available = engine.probe.wait_available
    # 30 s instead of 180: enough for the failed load to be noticed; the bug waited out the whole of it.
    monkeypatch.setattr(engine.probe, "wait_available", lambda *a, **k: wait_available(*a, **k, timeout_s=30))

    async def start() -> None:
        await engine.open()
        try:
            await engine.start("r1", "dm1", corrupt)
        finally:
            await engine.close()

    with pytest.raises(ApiError) as raised:
        aio.run(start())
    assert raised.value.status == "FAILED_PRECONDITION", raised.value  # not DEADLINE_EXCEEDED
    assert "exited with code 1" in raised.value.message and "could not load" in raised.value.message
