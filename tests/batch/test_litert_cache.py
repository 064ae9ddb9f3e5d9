"""The verified-conversion cache batch workers load from: the first load converts, checks LiteRT
against TensorFlow and keeps the result; the next loads it without importing TensorFlow, answer
alike, and still give TensorFlow's error for what LiteRT refuses."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.batch.conftest import SRC

# Loads the model as a batch worker does, predicts a good batch and a bad one, and says how.
_LOAD = r"""
import json, sys
import numpy as np
from pathlib import Path
from modelyard.batch.predictor import load_servable
from modelyard.errors import ServingError
servable = load_servable(Path(sys.argv[1]))
sig = servable.signatures["serving_default"]
(alias,) = sig.inputs
good = np.asarray(json.loads(sys.argv[2]), np.float32)
(out,) = servable.run(sig, {alias: good}, tuple(sig.outputs)).values()
before_bad = "tensorflow" in sys.modules
try:
    servable.run(sig, {alias: np.zeros((2, 5), np.float32)}, tuple(sig.outputs))
    error = None
except ServingError as exc:
    error = [exc.code.name, str(exc)]
print(json.dumps({"from_cache": servable.from_cache, "runtime": servable.runtime, "out": out.tolist(),
                  "tensorflow_before_bad_batch": before_bad, "error": error}))
"""


def _load(version_dir: Path, cache: Path, rows: list[list[float]]) -> dict:
    env = dict(os.environ, MODELYARD_CACHE=str(cache), PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", _LOAD, str(version_dir), json.dumps(rows)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _load_here(version_dir: Path, cache: Path, rows: list[list[float]], monkeypatch, bad_batch: bool = False) -> dict:
    """``_load`` in this process (TensorFlow is imported here already): what the cache does on a miss,
    a hit or a damaged entry, without a fresh interpreter's TensorFlow import per load; with
    ``bad_batch``, ``_load``'s bad batch too (its ``error``)."""
    from modelyard.batch.predictor import load_servable
    from modelyard.errors import ServingError

    monkeypatch.setenv("MODELYARD_CACHE", str(cache))
    servable = load_servable(version_dir)
    try:
        sig = servable.signatures["serving_default"]
        (alias,) = sig.inputs
        (out,) = servable.run(sig, {alias: np.asarray(rows, np.float32)}, tuple(sig.outputs)).values()
        said = {"from_cache": servable.from_cache, "runtime": servable.runtime, "out": out.tolist()}
        if bad_batch:
            try:
                servable.run(sig, {alias: np.zeros((2, 5), np.float32)}, tuple(sig.outputs))
                said["error"] = None
            except ServingError as exc:
                said["error"] = [exc.code.name, str(exc)]
        return said
    finally:
        servable.close()


def test_a_verified_conversion_loads_again_without_tensorflow(tiny_model, tmp_path: Path, monkeypatch):
    """The first load (here: converting needs TensorFlow anyway) fills the cache; a fresh interpreter's
    load takes it without importing TensorFlow."""
    version = tiny_model.base / "0001"
    rows = np.random.default_rng(3).normal(size=(7, 4)).astype(np.float32)
    first = _load_here(version, tmp_path / "cache", rows.tolist(), monkeypatch, bad_batch=True)
    assert first["from_cache"] is False and first["runtime"] == "litert"
    assert list((tmp_path / "cache" / "litert").glob("*/serving_default/model.tflite"))

    again = _load(version, tmp_path / "cache", rows.tolist())
    assert again["from_cache"] is True and again["runtime"] == "litert"
    assert again["tensorflow_before_bad_batch"] is False
    assert again["out"] == first["out"]  # the same flatbuffer on the same interpreter: the same bits
    np.testing.assert_allclose(again["out"], tiny_model.reference(rows), rtol=1e-5, atol=1e-6)
    # What LiteRT refuses goes to TensorFlow, loaded then: its answer, as without the cache.
    assert again["error"] == first["error"] and again["error"][0] == "INVALID_ARGUMENT"


def test_changed_model_bytes_miss_the_cache(tiny_model, tmp_path: Path, monkeypatch):
    from modelyard.model.runtime import litert_cache

    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path / "cache"))
    version = tmp_path / "copy" / "0001"
    shutil.copytree(tiny_model.base / "0001", version)
    key = litert_cache.model_key(version)
    assert litert_cache.model_key(version) == key
    assert litert_cache.load(version, "serving_default") is None
    _load_here(version, tmp_path / "cache", [[0.0] * 4], monkeypatch)
    assert litert_cache.load(version, "serving_default") is not None
    assert litert_cache.load(version, "no_such_signature") is None
    data = next(version.glob("variables/variables.data-*"))
    data.write_bytes(data.read_bytes()[:-1] + bytes([data.read_bytes()[-1] ^ 1]))
    assert litert_cache.model_key(version) != key
    assert litert_cache.load(version, "serving_default") is None


def test_a_cache_that_cannot_be_written_only_means_converting_again(tiny_model, tmp_path: Path, monkeypatch):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the cache directory would go")
    for _ in range(2):
        loaded = _load_here(tiny_model.base / "0001", blocked, [[1.0, 2.0, 3.0, 4.0]], monkeypatch)
        assert loaded["from_cache"] is False
        np.testing.assert_allclose(loaded["out"], tiny_model.reference([[1.0, 2.0, 3.0, 4.0]]), rtol=1e-5, atol=1e-6)


def test_a_torn_entry_is_a_miss(tiny_model, tmp_path: Path, monkeypatch):
    from modelyard.model.runtime import litert_cache

    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path / "cache"))
    version = tiny_model.base / "0001"
    _load_here(version, tmp_path / "cache", [[0.0] * 4], monkeypatch)
    (entry,) = (tmp_path / "cache" / "litert").glob("*/serving_default")
    (entry / "signature.json").write_text('{"name": "serving_default", "inp')
    assert litert_cache.load(version, "serving_default") is None
    assert _load_here(version, tmp_path / "cache", [[0.0] * 4], monkeypatch)["from_cache"] is False
    assert _load_here(version, tmp_path / "cache", [[0.0] * 4], monkeypatch)["from_cache"] is True  # rewritten


def test_a_flipped_byte_in_a_cached_flatbuffer_is_a_miss_not_a_crash(tiny_model, tmp_path: Path, monkeypatch):
    from modelyard.model.runtime import litert_cache

    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path / "cache"))
    version = tiny_model.base / "0001"
    _load_here(version, tmp_path / "cache", [[0.0] * 4], monkeypatch)
    (flatbuffer,) = (tmp_path / "cache" / "litert").glob("*/serving_default/model.tflite")
    good = flatbuffer.read_bytes()
    # The signature and the file's length stay whole: only the checksum can tell.
    flatbuffer.write_bytes(good[:len(good) // 2] + bytes([good[len(good) // 2] ^ 0x40]) + good[len(good) // 2 + 1:])
    assert litert_cache.load(version, "serving_default") is None
    rows = [[1.0, 2.0, 3.0, 4.0]]
    loaded = _load_here(version, tmp_path / "cache", rows, monkeypatch)
    assert loaded["from_cache"] is False  # converted and verified again
    np.testing.assert_allclose(loaded["out"], tiny_model.reference(rows), rtol=1e-5, atol=1e-6)
    assert flatbuffer.read_bytes() == good  # and the entry rewritten
    assert _load_here(version, tmp_path / "cache", rows, monkeypatch)["from_cache"] is True


def test_the_server_takes_a_cached_conversion_instead_of_converting_again(tiny_model, tmp_path: Path, monkeypatch):
    from modelyard.model.runtime import choose_runtime as chooser
    from modelyard.model.runtime.tf_session import load_saved_model

    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path / "cache"))
    version = tiny_model.base / "0001"
    x = np.random.default_rng(9).normal(size=(5, 4)).astype(np.float32)
    first = chooser.choose_runtime(load_saved_model(version), "auto")
    try:
        assert first.runtime_of("serving_default") == "litert"
        sig = first.signatures["serving_default"]
        expected = first.run(sig, {"x": x}, tuple(sig.outputs))
    finally:
        first.close()

    def convert_again(*_args):
        raise AssertionError("converted again")

    monkeypatch.setattr(chooser, "_convert", convert_again)  # a conversion now fails the litert load
    again = chooser.choose_runtime(load_saved_model(version), "litert")
    try:
        assert again.runtime_of("serving_default") == "litert"
        sig = again.signatures["serving_default"]
        got = again.run(sig, {"x": x}, tuple(sig.outputs))
        assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in expected.items()}
    finally:
        again.close()


def test_the_cache_keeps_to_its_cap_dropping_the_models_used_least_recently(tmp_path: Path, monkeypatch):
    import time

    from modelyard.model.runtime import litert_cache
    from modelyard.model.signatures import Signature, TensorSpec

    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(litert_cache.MAX_MB_ENV, "3")
    signature = Signature("serving_default", "tensorflow/serving/predict",
                          {"x": TensorSpec("x", "x:0", 1, (-1, 4))}, {"y": TensorSpec("y", "y:0", 1, (-1, 3))})

    def model(k: int) -> Path:
        version = tmp_path / f"model{k}" / "1"
        version.mkdir(parents=True)
        (version / "saved_model.pb").write_bytes(bytes([k]) * 64)
        return version

    def stored(version: Path, k: int) -> Path:
        litert_cache.store(version, signature, bytes([k]) * SIZE, {"x": "x"}, {"y": "y"})
        return litert_cache.cache_root() / litert_cache.model_key(version)

    SIZE = 1000 << 10  # three entries (and their signature files) fit in 3 MiB, four do not
    now = time.time()
    versions = [model(k) for k in range(3)]
    for k, version in enumerate(versions):  # three fit, model 0 used longest ago
        os.utime(stored(version, k), (now - 3600 * (3 - k),) * 2)
    assert litert_cache.load(versions[0], "serving_default")[1] == bytes([0]) * SIZE  # used again now

    newest = model(3)
    assert stored(newest, 3).is_dir()  # a fourth against a 3 MiB cap: one model must go
    left = sorted(p.name for p in litert_cache.cache_root().iterdir())
    keys = [litert_cache.model_key(v) for v in versions + [newest]]
    assert left == sorted([keys[0], keys[2], keys[3]])  # model 1, the least recently used, went
    assert litert_cache.load(versions[1], "serving_default") is None  # a miss: the next load converts
    assert litert_cache.load(versions[2], "serving_default")[1] == bytes([2]) * SIZE

    monkeypatch.setenv(litert_cache.MAX_MB_ENV, "lots")
    assert litert_cache.max_bytes() == litert_cache.DEFAULT_MAX_MB << 20


# A batch-predict job in this process, which notes whether *it* (the coordinator) imported TensorFlow.
_COORDINATOR = r"""
import json, sys
from modelyard.cli import main
code = main(["batch-predict", "--model", sys.argv[1], "--input", sys.argv[2], "--output", sys.argv[3],
             "--workers", "1"])
print(json.dumps({"exit": code, "coordinator_imported_tensorflow": "tensorflow" in sys.modules}))
"""


def test_a_batch_jobs_coordinator_never_imports_tensorflow(tiny_model, tmp_path: Path):
    """Issue 29: reading the model's dtypes and planning must not cost the coordinator TensorFlow's
    import (3-8 s a job). Its workers import it only to convert on a cache miss."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in np.random.default_rng(5).normal(size=(9, 4)).tolist()))
    env = dict(os.environ, MODELYARD_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(SRC), TF_CPP_MIN_LOG_LEVEL="2")
    for turn in ("cache miss", "cache hit"):
        done = subprocess.run([sys.executable, "-c", _COORDINATOR, str(tiny_model.base), str(rows),
                               str(tmp_path / turn.replace(" ", "-"))], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        said = json.loads(done.stdout.strip().splitlines()[-1])
        assert said == {"exit": 0, "coordinator_imported_tensorflow": False}, (turn, said, done.stderr[-2000:])
