"""node_cache: a directory packed to bytes named by their hash, unpacked once per node, bounded."""
from __future__ import annotations

import hashlib
import os
import time

import pytest

from modelyard import node_cache


def _tree(root, files: dict[str, bytes]):
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def test_pack_is_deterministic_and_materialize_fetches_once(tmp_path):
    files = {"saved_model.pb": b"graph" * 100, "variables/variables.index": b"idx", "assets/vocab.txt": b"a\nb\n"}
    one, two = _tree(tmp_path / "one", files), _tree(tmp_path / "two", files)
    os.utime(two / "saved_model.pb", (1, 1))  # times and places do not change the digest
    digest, data = node_cache.pack(one)
    assert node_cache.pack(two) == (digest, data)
    assert digest == hashlib.sha256(data).hexdigest()
    assert node_cache.pack(_tree(tmp_path / "three", {**files, "assets/vocab.txt": b"c\n"}))[0] != digest

    calls = []
    fetch = lambda: calls.append(1) or data  # noqa: E731
    cache = tmp_path / "cache"
    entry, fetched = node_cache.materialize(digest, fetch, cache)
    assert fetched and entry == cache / digest
    assert {p.relative_to(entry).as_posix(): p.read_bytes() for p in entry.rglob("*") if p.is_file()} == files
    again, fetched = node_cache.materialize(digest, fetch, cache)
    assert again == entry and not fetched and calls == [1], "a node with a whole copy fetches nothing"
    assert not [p for p in cache.iterdir() if p.is_dir() and p.name.startswith(".")], "no partial entry left behind"


def test_damaged_bytes_are_refused(tmp_path):
    digest, data = node_cache.pack(_tree(tmp_path / "m", {"a": b"x" * 1000}))
    with pytest.raises(ValueError, match=f"bytes fetched for {digest[:12]} hash to"):
        node_cache.materialize(digest, lambda: data[:-1] + b"y", tmp_path / "cache")
    assert not (tmp_path / "cache" / digest).exists()


def test_a_held_entry_is_not_dropped(tmp_path, monkeypatch):
    monkeypatch.setenv(node_cache.MAX_MB_ENV, "0")  # every entry is over the bound
    cache = tmp_path / "cache"
    digests = [node_cache.pack(_tree(tmp_path / f"m{k}", {"w": bytes([k]) * 100})) for k in range(3)]
    first = node_cache.materialize(digests[0][0], lambda: digests[0][1], cache)[0]
    held = node_cache.hold(first)
    try:
        node_cache.materialize(digests[1][0], lambda: digests[1][1], cache)
        assert first.is_dir(), "held: not dropped although over the bound"
    finally:
        held.close()
    node_cache.materialize(digests[2][0], lambda: digests[2][1], cache)
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == [digests[2][0]]


def test_the_cache_drops_the_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setenv(node_cache.MAX_MB_ENV, str(2.5 / 1024))  # 2.5 KiB: two 1 KiB entries fit, not three
    cache = tmp_path / "cache"
    entries = []
    for k in range(3):
        digest, data = node_cache.pack(_tree(tmp_path / f"m{k}", {"w": bytes([k]) * 1024}))
        entries.append(node_cache.materialize(digest, lambda data=data: data, cache)[0])
        if k == 1:
            old = time.time() - 100
            os.utime(entries[1], (old, old))  # m1 last used long ago, m0 just before
            os.utime(entries[0], (old + 50, old + 50))
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == sorted([entries[0].name, entries[2].name])
