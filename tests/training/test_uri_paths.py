"""gs:// paths in a training config (training/uri_paths): kept as URIs, never resolved as local paths.
``modelyard train`` against a real storage is tests/platform/test_tf_gcs.py's."""
from __future__ import annotations

from pathlib import Path

from modelyard.training import config, uri_paths
from tests.training.conftest import write_config


def test_a_gs_path_is_a_uri_with_the_path_operations_the_trainer_uses():
    run = uri_paths.UriPath("gs://b/runs/one/")
    assert str(run) == "gs://b/runs/one" and run.name == "one" and str(run.parent) == "gs://b/runs"
    assert str(run / "checkpoints" / "ckpt-{epoch:04d}") == "gs://b/runs/one/checkpoints/ckpt-{epoch:04d}"
    assert str((run / "metrics.json").with_name(".metrics.json.1.tmp")) == "gs://b/runs/one/.metrics.json.1.tmp"
    assert uri_paths.is_uri("gs://b/x") and uri_paths.is_uri(run) and not uri_paths.is_uri("runs/x")
    assert not uri_paths.is_uri(Path("gs:/b/x"))


def test_a_config_keeps_gs_paths_as_the_storage_s(tmp_path, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    cfg = config.load(write_config(tmp_path, "gs", job_dir="gs://b/run", export_to="gs://b/model",
                                   data={"source": "gs://b/data.npz"}))
    assert cfg.job_dir == uri_paths.UriPath("gs://b/run") and cfg.export_to == uri_paths.UriPath("gs://b/model")
    assert cfg.data["source"] == "gs://b/data.npz" and config.uses_storage(cfg)
    assert cfg.raw["job_dir"] == "gs://b/run" and cfg.raw["export_to"] == "gs://b/model"  # config.resolved.json
    local = config.load(write_config(tmp_path, "local"))
    assert isinstance(local.job_dir, Path) and not config.uses_storage(local)
