"""TFRecord (serialized tf.Examples, raw bytes) and file-list inputs: each record or file is ``{"b64": ...}``."""
from __future__ import annotations

import base64

import numpy as np

import modelyard
from modelyard.batch import job as jobs
from tests.batch.conftest import read_lines, rows


def _example(values) -> bytes:
    import tensorflow as tf

    feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write_tfrecord(path, records) -> None:
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)


def test_tfrecord_of_tf_examples(bytes_model, tmp_path):
    x = rows(250, seed=8)
    records = [_example(v) for v in x]
    records[100] = b"not an example"  # the model refuses it: isolated into one error line
    _write_tfrecord(tmp_path / "a.tfrecord", records[:120])
    _write_tfrecord(tmp_path / "b.tfrecord", records[120:])
    job = modelyard.batch_predict(str(bytes_model), str(tmp_path / "*.tfrecord"), tmp_path / "out",
                                  format="tf-record", chunk_rows=50, workers=0)
    assert job.state == jobs.SUCCEEDED, job.error
    assert job.completion_stats == {"successful_count": 249, "failed_count": 1, "incomplete_count": 0}
    out = list(job.iter_outputs())
    got = {base64.b64decode(o["instance"]["b64"]): o["prediction"] for o in out}
    for i in (0, 99, 101, 120, 249):
        assert abs(got[records[i]] - float(x[i].sum())) < 1e-4
    (error,) = read_lines(job.job_dir / "prediction.errors_stats-00000-of-00001")
    assert error["instance"] == {"b64": base64.b64encode(b"not an example").decode()}
    assert error["error"]["status"] == "INVALID_ARGUMENT"
    assert "Could not parse example input" in error["error"]["message"]


def test_tfrecord_of_raw_bytes_on_a_named_signature(bytes_model, tmp_path):
    records = [bytes(range(n % 256)) * (1 + n // 256) for n in range(300)]
    _write_tfrecord(tmp_path / "raw.tfrecord", records)
    job = modelyard.batch_predict(str(bytes_model), str(tmp_path / "raw.tfrecord"), tmp_path / "out",
                                  format="tf-record", signature_name="length", chunk_rows=128, workers=0)
    assert job.state == jobs.SUCCEEDED, job.error
    lengths = {base64.b64decode(o["instance"]["b64"]): o["prediction"] for o in job.iter_outputs()}
    assert lengths == {r: len(r) for r in records}


def test_corrupt_tfrecord_fails_the_job_with_its_offset(bytes_model, tmp_path):
    _write_tfrecord(tmp_path / "ok.tfrecord", [b"abc", b"defg"])
    data = (tmp_path / "ok.tfrecord").read_bytes()
    (tmp_path / "bad.tfrecord").write_bytes(data[:-3])  # truncated last record
    job = modelyard.batch_predict(str(bytes_model), str(tmp_path / "bad.tfrecord"), tmp_path / "out",
                                  format="tf-record", signature_name="length", workers=0)
    assert job.state == jobs.FAILED
    assert "bad.tfrecord: truncated TFRecord data" in job.error
    (tmp_path / "junk.tfrecord").write_bytes(b'{"json": "not a tfrecord"}\n' * 3)
    job = modelyard.batch_predict(str(bytes_model), str(tmp_path / "junk.tfrecord"), tmp_path / "out2",
                                  format="tf-record", signature_name="length", workers=0)
    assert job.state == jobs.FAILED and "corrupt TFRecord length at byte 0" in job.error


def test_file_list(bytes_model, tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    sizes = {f"f{i}.bin": i * 37 for i in range(40)}
    for name, size in sizes.items():
        (files / name).write_bytes(np.random.default_rng(size).bytes(size))
    listing = tmp_path / "list.txt"
    names = list(sizes) + ["missing.bin"]
    listing.write_text("\n".join(f"files/{n}" for n in names) + "\n")
    job = modelyard.batch_predict(str(bytes_model), str(listing), tmp_path / "out", format="file-list",
                                  signature_name="length", workers=0)
    assert job.state == jobs.SUCCEEDED, job.error
    out = {o["instance"]: o["prediction"] for o in job.iter_outputs()}
    assert out == {f"files/{n}": s for n, s in sizes.items()}
    (error,) = read_lines(job.job_dir / "prediction.errors_stats-00000-of-00001")
    assert error["instance"] == "files/missing.bin"
    assert "cannot read" in error["error"]["message"] and "No such file" in error["error"]["message"]


def test_jsonl_included_excluded_and_instance_type(tiny_model, tmp_path):
    from tests.batch.conftest import write_jsonl

    x = rows(30, seed=9)
    src = write_jsonl(tmp_path / "in.jsonl",
                      [{"id": i, "a": float(v[0]), "b": float(v[1]), "c": float(v[2]), "d": float(v[3]), "note": "n"}
                       for i, v in enumerate(x)])
    job = modelyard.batch_predict(str(tiny_model.base), str(src), tmp_path / "out", key_field="id",
                                  excluded_fields=["note"], instance_type="array", workers=0)
    assert job.state == jobs.SUCCEEDED, job.error
    out = {o["key"]: o["prediction"] for o in job.iter_outputs()}
    np.testing.assert_allclose([out[i] for i in range(30)], tiny_model.reference(x), atol=1e-5)
    arrays = write_jsonl(tmp_path / "arr.jsonl", [v.tolist() for v in x[:3]])
    job = modelyard.batch_predict(str(tiny_model.base), str(arrays), tmp_path / "out2", instance_type="object",
                                  workers=0)
    assert job.completion_stats["failed_count"] == 3
    errors = read_lines(job.job_dir / "prediction.errors_stats-00000-of-00001")
    assert "instance_type object needs object instances" in errors[0]["error"]["message"]


def test_a_relayed_chunk_reads_its_local_files_from_what_was_sent(tmp_path):
    """file_list.relay reads a chunk's local entries where the list is; decode then takes them from
    there, as a node without those files must (a name that could not be read stays that row's error)."""
    from modelyard.batch.readers import file_list

    (tmp_path / "a.bin").write_bytes(b"aaa")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"bb")
    data = b"a.bin\nsub/b.bin\nfile://" + str(tmp_path / "a.bin").encode() + b"\nmissing.bin\n"
    context = file_list.relay(data, str(tmp_path))
    for name in ("a.bin", "sub/b.bin"):
        (tmp_path / name).unlink()  # gone here, as on another node
    rows = file_list.decode(data, context, "list.txt", 0)
    assert [r.instance for r in rows[:3]] == [{"b64": "YWFh"}, {"b64": "YmI="}, {"b64": "YWFh"}]
    assert "list.txt line 4: cannot read " in rows[3].message and "missing.bin" in rows[3].message
