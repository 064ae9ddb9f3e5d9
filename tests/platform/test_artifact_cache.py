"""artifact_cache (issue 31), one layer below the Ray engine: a model directory published to the
session's Cloud Storage by content hash and fetched into a node's cache, checked against its hash,
bounded, never evicted from under a replica that holds it. (The engine's end-to-end case, on the
namespaced Ray cluster, is tests/platform/test_ray_engine.py.)"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from modelyard import objstore
from modelyard.platform.dataplane import artifact_cache


@pytest.fixture
def node_cache(tmp_path, monkeypatch, gcs_emulator):
    """This process as a node: its own cache dir; a store prefix of this test's own."""
    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path / "node-cache"))
    monkeypatch.setenv(artifact_cache.STORE_ENV, f"gs://artifact-cache-test/{tmp_path.name}")
    return tmp_path / "node-cache" / "artifacts"


def _model(root: Path, content: bytes = b"weights") -> Path:
    (root / "variables").mkdir(parents=True)
    (root / "saved_model.pb").write_bytes(b"graph")
    (root / "variables" / "variables.data-00000-of-00001").write_bytes(content)
    return root


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_published_once_fetched_into_the_node_cache(tmp_path, node_cache):
    model = _model(tmp_path / "m")
    source = artifact_cache.publish(model)
    assert source.digest == artifact_cache.digest_of(model) and source.uri.endswith(source.digest)
    assert objstore.read_text(f"{source.uri}/{artifact_cache.MANIFEST}") is not None
    assert artifact_cache.publish(model) == source  # already there: the same place, not uploaded again

    # A node without the platform's path: the files come from storage into <cache>/artifacts/<digest>.
    elsewhere = {**source.as_dict(), "path": str(tmp_path / "not-on-this-node")}
    lease = artifact_cache.fetch(elsewhere)
    assert lease.cached and lease.path == node_cache / source.digest
    assert _tree(lease.path) == _tree(model)
    again = artifact_cache.fetch(elsewhere)  # a second replica on the node: the same entry
    assert again.path == lease.path
    lease.release()
    again.release()

    # The platform's own host (the path exists with the same content): used in place, nothing cached.
    here = artifact_cache.fetch(source.as_dict())
    assert here.path == model and not here.cached

    # The same path with other content is a new digest, never the stale entry.
    (model / "variables" / "variables.data-00000-of-00001").write_bytes(b"retrained")
    assert artifact_cache.publish(model).digest != source.digest


def test_a_download_that_does_not_match_its_digest_is_refused(tmp_path, node_cache):
    model = _model(tmp_path / "m")
    source = artifact_cache.publish(model)
    fs = objstore.filesystem("gs")
    with fs.open(f"{source.uri}/files/saved_model.pb", "wb") as f:  # altered in storage
        f.write(b"tampered")
    fs.invalidate_cache()
    with pytest.raises(artifact_cache.ArtifactError, match="does not match its digest"):
        artifact_cache.fetch({**source.as_dict(), "path": "/nowhere"})
    assert not (node_cache / source.digest).exists()


def test_the_cache_is_bounded_but_keeps_what_a_replica_holds(tmp_path, node_cache, monkeypatch):
    monkeypatch.setenv(artifact_cache.MAX_MB_ENV, "0")  # every entry is over the bound
    a = artifact_cache.publish(_model(tmp_path / "a", b"a" * 1000))
    b = artifact_cache.publish(_model(tmp_path / "b", b"b" * 1000))
    held = artifact_cache.fetch({**a.as_dict(), "path": "/nowhere"})
    lease_b = artifact_cache.fetch({**b.as_dict(), "path": "/nowhere"})
    assert (node_cache / a.digest).is_dir(), "a replica holds a: not evicted"
    lease_b.release()
    held.release()
    c = artifact_cache.publish(_model(tmp_path / "c", b"c" * 1000))
    artifact_cache.fetch({**c.as_dict(), "path": "/nowhere"}).release()
    assert sorted(p.name for p in node_cache.iterdir() if p.is_dir()) == [c.digest]


def test_a_store_that_is_not_object_storage_is_refused(tmp_path, node_cache, monkeypatch):
    monkeypatch.setenv(artifact_cache.STORE_ENV, str(tmp_path / "shared"))
    with pytest.raises(artifact_cache.ArtifactError, match="name a gs:// or s3:// bucket every node can reach"):
        artifact_cache.publish(_model(tmp_path / "m"))
    monkeypatch.setenv(artifact_cache.STORE_ENV, "gs://no-such-bucket-here/x")
    source = artifact_cache.Source("0" * 40, "gs://no-such-bucket-here/x/" + "0" * 40, "/nowhere")
    with pytest.raises(artifact_cache.ArtifactError, match="cannot fetch the model /nowhere"):
        artifact_cache.fetch(source.as_dict())
    assert not os.path.exists(node_cache / ("0" * 40))


# ---- gs:// artifact_uri copies (resources/artifacts.py), issue 43 finding 9 -------------------------

def _upload_tree(bucket, prefix: str, root: Path) -> None:
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        bucket.blob(f"{prefix}/{path.relative_to(root).as_posix()}").upload_from_filename(str(path))


def test_a_gs_artifact_is_copied_by_its_objects_not_by_its_uri(tmp_path, gcs_emulator):
    from modelyard.platform.resources import artifacts

    bucket = gcs_emulator["client"].bucket("modelyard-staging")
    uri = f"gs://modelyard-staging/cache-by-content/{tmp_path.name}"
    _upload_tree(bucket, uri.split("/", 3)[3], _model(tmp_path / "a", b"first weights"))
    first = artifacts.resolve(uri, ["gs://modelyard-staging"], tmp_path / "state")
    assert _tree(first) == _tree(tmp_path / "a")
    assert artifacts.resolve(uri + "/", [], tmp_path / "state") == first  # unchanged objects: the same copy

    # Same URI, same names, same size: only the bytes (and so the generations) differ.
    _upload_tree(bucket, uri.split("/", 3)[3], _model(tmp_path / "b", b"other weights"))
    second = artifacts.resolve(uri, [], tmp_path / "state")
    assert second != first and _tree(second) == _tree(tmp_path / "b")
    assert _tree(first) == _tree(tmp_path / "a")  # a version registered from the first copy keeps its files


def test_a_copy_that_does_not_match_its_listing_is_made_again(tmp_path, gcs_emulator, monkeypatch):
    """An object rewritten between the listing and the copy: the copy is checked and made again."""
    from modelyard.platform.resources import artifacts

    bucket = gcs_emulator["client"].bucket("modelyard-staging")
    prefix = f"cache-by-content/{tmp_path.name}"
    _upload_tree(bucket, prefix, _model(tmp_path / "a", b"first weights"))
    real, listings = artifacts._listing, []

    def listing_then_rewrite(fs, src):
        out = real(fs, src)
        if not listings:  # the first listing is made stale before the copy
            _upload_tree(bucket, prefix, _model(tmp_path / "b", b"newer weights"))
        listings.append(out)
        return out

    monkeypatch.setattr(artifacts, "_listing", listing_then_rewrite)
    path = artifacts.resolve(f"gs://modelyard-staging/{prefix}", [], tmp_path / "state")
    assert len(listings) == 2 and listings[0] != listings[1]
    assert _tree(path) == _tree(tmp_path / "b")
    assert [p.name for p in (tmp_path / "state" / "artifacts").iterdir()] == [path.name]  # no partial copy left


def test_a_model_uploaded_again_from_a_changed_uri_serves_its_new_files(platform, gcs_emulator, tiny_models):
    """The Vertex workflow of the finding: upload from gs://, change the files at the same URI, upload again
    as a new model: the new model serves the new files (tiny2's answers, not tiny1's)."""
    import numpy as np

    from tests.platform.client import Api

    api = Api(platform.url)
    client = gcs_emulator["client"]  # the session's storage: the platform serves the same root
    bucket = client.bucket("modelyard-staging")
    prefix = "reuploaded-uri/model"
    _upload_tree(bucket, prefix, Path(tiny_models["models"]["tiny1"]["path"]))
    api.upload(f"gs://modelyard-staging/{prefix}", "first")
    for blob in list(client.list_blobs(bucket, prefix=prefix + "/")):
        blob.delete()
    _upload_tree(bucket, prefix, Path(tiny_models["models"]["tiny2"]["path"]))
    second = api.upload(f"gs://modelyard-staging/{prefix}", "second")
    endpoint = api.create_endpoint("reuploaded")
    dm = api.deploy(endpoint, second)
    try:
        r = api.predict(endpoint, tiny_models["instances"])
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["predictions"], tiny_models["models"]["tiny2"]["predictions"],
                                   rtol=1e-5, atol=1e-6)
    finally:
        api.undeploy(endpoint, dm)
