"""``--engine ray`` on the shared local two-node Ray cluster, whose second node sees none of this
host's temp dirs (tests/ray_cluster.py): the same results as the local engine, a gs:// and a local
input through a node killed half-way (every row once, the job SUCCEEDED), exactly-once resume
after a kill -9 of the driver, a local file list and one in s3:// (whose files the actors read from
storage) in one job, and
clear errors for a bad address or a missing Ray.

Every ray run is a real ``modelyard batch-predict`` process joining the cluster as a Ray driver
(so this test process never becomes one); its actors get the model through Ray's object store
into their node's cache, never by a path of this host.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import modelyard
from modelyard import node_cache
from modelyard.demo import default_cache_dir
from modelyard.ports import free_ports
from tests.batch.conftest import S3_BUCKET, cli_command, cli_env, read_lines, rows, write_jsonl
from tests.platform.conftest import STAGING_BUCKET
from tests.ray_cluster import ask_cluster, ensure_nodes, session_cluster

PART = re.compile(r"^c\d{6}-ok\d+-err\d+\.results$")


def _job_files(out: Path) -> tuple[list[bytes], list[bytes], int]:
    (job_dir,) = out.iterdir()
    shards = sorted(job_dir.glob("prediction.results-*"))
    results = sorted(line for s in shards for line in s.read_bytes().splitlines())
    errors = sorted((job_dir / "prediction.errors_stats-00000-of-00001").read_bytes().splitlines())
    return results, errors, len(shards)


def _run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cli_command("--no-progress", *args), env=cli_env(), capture_output=True, text=True,
                          timeout=timeout)


def test_ray_and_local_engines_write_the_same_bytes(tiny_model, ray_cluster, tmp_path):
    lines = [{"id": i, "x": v.tolist()} for i, v in enumerate(rows(3_000, seed=11))]
    lines[7] = {"id": 7, "x": [1.0]}  # the model refuses these two: error lines in both engines
    lines[2_500] = {"id": 2_500, "x": "nope"}
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    common = ["--model", str(tiny_model.base), "--input", str(src), "--key-field", "id", "--chunk-rows", "250",
              "--batch-size", "32"]
    ray_run = _run_cli(*common, "--output", str(tmp_path / "ray"), "--engine", "ray", "--ray-address", ray_cluster)
    assert ray_run.returncode == 0, ray_run.stderr[-3000:]
    assert "JOB_STATE_SUCCEEDED: 2,998 results, 2 errors, 3,000 rows" in ray_run.stdout
    # One actor per CPU of the cluster; each node has one (another test's Ray work may hold one).
    assert re.search(r"ray: [12] workers of 2 ran on [12] nodes", ray_run.stderr), ray_run.stderr
    local = modelyard.batch_predict(str(tiny_model.base), str(src), tmp_path / "local", key_field="id",
                                    chunk_rows=250, batch_size=32, workers=0)
    assert local.state == "JOB_STATE_SUCCEEDED"
    ray_results, ray_errors, ray_shards = _job_files(tmp_path / "ray")
    local_results, local_errors, local_shards = _job_files(tmp_path / "local")
    assert ray_shards == local_shards == 12
    assert len(ray_results) == 2_998 and ray_results == local_results, "byte-identical result lines"
    assert len(ray_errors) == 2 and ray_errors == local_errors
    assert {e["key"] for e in map(json.loads, ray_errors)} == {7, 2_500}


def test_an_input_without_rows_succeeds_on_ray(tiny_model, ray_cluster, tmp_path):
    """The actors start before the plan's first chunk is known: an input with no row at all ends them
    again and the job succeeds with nothing to predict, as with the local engine."""
    src = tmp_path / "empty.jsonl"
    src.write_bytes(b"")
    done = _run_cli("--model", str(tiny_model.base), "--input", str(src), "--output", str(tmp_path / "out"),
                    "--engine", "ray", "--ray-address", ray_cluster)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "JOB_STATE_SUCCEEDED" in done.stdout, (done.stdout, done.stderr[-3000:])
    (job_dir,) = (tmp_path / "out").iterdir()
    assert json.loads((job_dir / "job.json").read_text())["completion_stats"] == {
        "successful_count": 0, "failed_count": 0, "incomplete_count": 0}
    assert not list(job_dir.glob("prediction.results-*"))


def _committed(out: Path) -> int:
    return sum(1 for job in out.glob("prediction-*") for p in (job / ".parts").glob("*.results") if PART.match(p.name))


def test_ray_kill_9_half_way_then_resume_exactly_once(tiny_model, ray_cluster, tmp_path):
    total_rows, chunk = 40_000, 500
    x = rows(total_rows, seed=12)
    lines = [{"id": i, "x": v.tolist()} for i, v in enumerate(x)]
    lines[39_999] = {"id": 39_999, "x": [0.0]}
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out"
    command = cli_command("--no-progress", "--model", str(tiny_model.base), "--input", str(src), "--output",
                          str(out), "--key-field", "id", "--chunk-rows", str(chunk), "--batch-size", "32",
                          "--engine", "ray", "--ray-address", ray_cluster)
    total = total_rows // chunk
    first = subprocess.Popen(command, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while _committed(out) < total * 2 // 5 and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        _, err = first.communicate()
    at_kill = _committed(out)
    assert 0 < at_kill < total, f"the kill should land mid-job: {at_kill} of {total} chunks; {err[-2000:]!r}"
    # Only the driver commits (actors answer with the part's bytes): nothing lands after its death, not even
    # from its actors, which Ray ends with their dead owner: once every CPU is free again (no actor of the
    # job is left to write anything), the count is what it was at the kill.
    assert ask_cluster(ray_cluster, "held", 60) == [], "the killed driver's actors still hold the cluster's CPUs"
    frozen = _committed(out)
    assert frozen == at_kill, (at_kill, frozen)

    second = subprocess.run(command, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert re.search(rf"resuming .*: {frozen} of {total} chunks", second.stderr), second.stderr
    assert "JOB_STATE_SUCCEEDED: 39,999 results, 1 errors, 40,000 rows" in second.stdout
    (job_dir,) = out.iterdir()
    keys = [o["key"] for s in sorted(job_dir.glob("prediction.results-*")) for o in read_lines(s)]
    errors = read_lines(job_dir / "prediction.errors_stats-00000-of-00001")
    keys += [e["key"] for e in errors]
    assert len(keys) == total_rows and set(keys) == set(range(total_rows)), "every row exactly once"
    assert [e["key"] for e in errors] == [39_999]
    assert not (job_dir / ".parts").exists()


def test_gs_and_local_inputs_through_a_node_killed_half_way(tiny_model, ray_cluster, gcs_emulator, tmp_path):
    """Must-show 2 of issue 31: the second node (which cannot see this host's files) is killed, raylet
    and all its processes, once half the chunks are committed: its chunks run again on the head."""
    cluster = session_cluster()
    ensure_nodes(cluster, 2)
    (worker,) = cluster.workers()
    # Long enough that the job outlasts the second node's model load on a busy machine. The actors start at
    # once (the plan no longer waits for a scan of the whole gs:// object first), and one actor predicts
    # 200,000 rows in ~3 s: with 500-row chunks it sometimes finished the job before the second was ready.
    # Small chunks make the job last longer (a round trip and a commit each) without more rows to write.
    per_file, chunk, batch = 100_000, 100, 32
    local_lines = [{"id": f"l{i}", "x": v.tolist()} for i, v in enumerate(rows(per_file, seed=21))]
    remote_lines = [{"id": f"g{i}", "x": v.tolist()} for i, v in enumerate(rows(per_file, seed=22))]
    remote_lines[5] = {"id": "g5", "x": "nope"}  # refused by the model: an error line, once
    local = write_jsonl(tmp_path / "local.jsonl", local_lines)
    staged = write_jsonl(tmp_path / "to-upload.jsonl", remote_lines)
    gcs_emulator["client"].bucket(STAGING_BUCKET).blob("ray-kill/in.jsonl").upload_from_filename(str(staged))
    staged.unlink()  # the gs:// input exists only in storage
    out = tmp_path / "out"
    command = cli_command("--no-progress", "--model", str(tiny_model.base), "--input",
                          f"gs://{STAGING_BUCKET}/ray-kill/in.jsonl", "--input", str(local), "--output", str(out),
                          "--key-field", "id", "--chunk-rows", str(chunk), "--batch-size", str(batch),
                          "--engine", "ray", "--ray-address", ray_cluster)
    # The local input's chunks are counted (100 rows each); the gs:// input's are found by probes, about
    # 100 rows each by its first 64 KiB: the job's count of chunks is known at the end (its shards).
    total = 2 * per_file // chunk
    digest, _ = node_cache.pack(next(tiny_model.base.iterdir()))
    cached = cluster.node_root(worker) / str(default_cache_dir()).lstrip("/") / "node" / digest
    dying = cluster.node_id(worker)
    run = subprocess.Popen(command, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err_lines: list[str] = []

    def read_stderr() -> None:
        for line in iter(run.stderr.readline, ""):
            err_lines.append(line)

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        # Half-way, once the second node's worker runs too (a fresh node loads the model slowly).
        deadline = time.monotonic() + 600
        while run.poll() is None and time.monotonic() < deadline:
            ready = [line for line in err_lines if "ray: a worker is ready on" in line]
            if len(ready) >= 2 and _committed(out) >= total // 2:
                break
            time.sleep(0.01)
        node_had_model = (cached / "saved_model.pb").is_file()  # its own copy, in its own cache
        at_kill = _committed(out)
        cluster.kill_node(worker)
        stdout = run.stdout.read()
        run.wait(timeout=600)
        reader.join(timeout=30)
    finally:
        run.kill()
    stderr = "".join(err_lines)
    (job_dir,) = out.iterdir()
    total = len(list(job_dir.glob("prediction.results-*")))  # every chunk has results: one shard each
    assert 0 < at_kill < total, f"the kill should land mid-job: {at_kill} of {total}; {stderr[-2000:]}"
    assert f"ray: a worker is ready on node {dying[:12]}" in stderr, stderr[-3000:]
    assert node_had_model, f"no model copy in the second node's cache ({cached})"
    assert run.returncode == 0, stderr[-3000:]
    assert re.search(rf"ray: a worker on node {dying[:12]} \([\d.]+\) died \(\w+Error", stderr), stderr[-3000:]
    assert "JOB_STATE_SUCCEEDED: 199,999 results, 1 errors, 200,000 rows" in stdout, (stdout, stderr[-3000:])
    keys = [o["key"] for s in sorted(job_dir.glob("prediction.results-*")) for o in read_lines(s)]
    errors = read_lines(job_dir / "prediction.errors_stats-00000-of-00001")
    assert [e["key"] for e in errors] == ["g5"]
    keys += [e["key"] for e in errors]
    assert len(keys) == 2 * per_file, "every row exactly once"
    assert set(keys) == {f"l{i}" for i in range(per_file)} | {f"g{i}" for i in range(per_file)}
    assert not (job_dir / ".inputs").exists(), "the gs:// input was never staged on the driver's disk"
    ensure_nodes(cluster, 2)  # the next test gets two nodes again


def test_a_local_file_list_on_ray_sends_its_files_with_each_chunk(bytes_model, ray_cluster, s3_server, gcs_emulator,
                                                                   tmp_path):
    """Two file lists in one job on the Ray cluster (one job's actors instead of two). A file list on the
    driver's disk naming files beside it: the driver sends each chunk's files with it (file_list.relay)
    and every row succeeds wherever it ran. A file list in s3://: the driver plans it by ranged reads
    pinned to its ETag, and the actors, one on a node that sees none of this host's files, read the files
    it names from storage (relative names from the list's own prefix, a gs:// name from Cloud Storage),
    as Vertex AI's file lists name objects. In each, a name that is nowhere is that row's error. (Which
    node's actor takes the local chunks is Ray's choice here, so a node that sees none of this host's
    files is not certain to decode one: that case is test_tfrecord_filelist's, one layer down.)"""
    here = tmp_path / "here"  # named apart from the s3:// list's files/: each row's instance is its name
    here.mkdir()
    local_sizes = {f"f{i}.bin": 7 * i + 3 for i in range(20)}
    for name, size in local_sizes.items():
        (here / name).write_bytes(b"l" * size)
    (tmp_path / "list.txt").write_text("".join(f"here/{n}\n" for n in local_sizes) + "here/missing.bin\n")
    s3_sizes = {f"f{i}.bin": 11 * i + 1 for i in range(24)}
    for name, size in s3_sizes.items():
        s3_server.put_object(Bucket=S3_BUCKET, Key=f"ray-list/files/{name}", Body=b"b" * size)
    gcs_emulator["client"].bucket(STAGING_BUCKET).blob("ray-list/g.bin").upload_from_string(b"g" * 5)
    names = [f"files/{n}" for n in s3_sizes] + [f"gs://{STAGING_BUCKET}/ray-list/g.bin", "files/missing.bin"]
    s3_server.put_object(Bucket=S3_BUCKET, Key="ray-list/list.txt", Body="\n".join(names).encode() + b"\n")

    done = _run_cli("--model", str(bytes_model), "--input", str(tmp_path / "list.txt"), "--input",
                    f"s3://{S3_BUCKET}/ray-list/list.txt", "--format", "file-list", "--signature-name", "length",
                    "--chunk-rows", "3", "--output", str(tmp_path / "out"), "--engine", "ray",
                    "--ray-address", ray_cluster)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "JOB_STATE_SUCCEEDED: 45 results, 2 errors, 47 rows" in done.stdout, (done.stdout, done.stderr[-3000:])
    assert re.search(r"ray: [12] workers of 2 ran on [12] nodes", done.stderr), done.stderr
    (job_dir,) = (tmp_path / "out").iterdir()
    results = {o["instance"]: o["prediction"] for s in job_dir.glob("prediction.results-*") for o in read_lines(s)}
    assert results == {**{f"here/{n}": size for n, size in local_sizes.items()},
                       **{f"files/{n}": size for n, size in s3_sizes.items()}, f"gs://{STAGING_BUCKET}/ray-list/g.bin": 5}
    errors = {e["instance"]: e["error"]["message"]
              for e in read_lines(job_dir / "prediction.errors_stats-00000-of-00001")}
    assert sorted(errors) == ["files/missing.bin", "here/missing.bin"], errors
    assert "cannot read" in errors["here/missing.bin"], errors
    assert f"cannot read s3://{S3_BUCKET}/ray-list/files/missing.bin" in errors["files/missing.bin"], errors


def test_unreachable_ray_address_is_a_clear_error(tiny_model, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"x": [0.0, 1.0, 2.0, 3.0]}])
    (port,) = free_ports(1)  # nothing listens there
    proc = _run_cli("--model", str(tiny_model.base), "--input", str(src), "--output", str(tmp_path / "out"),
                    "--engine", "ray", "--ray-address", f"127.0.0.1:{port}", timeout=120)
    assert proc.returncode == 2
    assert f"--ray-address 127.0.0.1:{port}: no Ray cluster reachable there (Connection refused)" in proc.stderr
    assert not (tmp_path / "out").exists(), "no job is created for a bad address"
    proc = _run_cli("--model", str(tiny_model.base), "--input", str(src), "--output", str(tmp_path / "out"),
                    "--engine", "ray", "--ray-address", "head-node", timeout=120)
    assert proc.returncode == 2 and "--ray-address head-node: expected HOST:PORT" in proc.stderr
    proc = _run_cli("--model", str(tiny_model.base), "--input", str(src), "--output", str(tmp_path / "out"),
                    "--ray-address", f"127.0.0.1:{port}", timeout=120)
    assert proc.returncode == 2 and "--ray-address goes with --engine ray" in proc.stderr


def test_missing_ray_says_how_to_install_it(tiny_model, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"x": [0.0, 1.0, 2.0, 3.0]}])
    # This interpreter with Ray made unimportable, as on a machine without the extra.
    code = ("import sys; sys.modules['ray'] = None; from modelyard.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    args = ["batch-predict", "--no-progress", "--model", str(tiny_model.base), "--input", str(src), "--output",
            str(tmp_path / "out"), "--engine", "ray"]
    proc = subprocess.run([sys.executable, "-c", code, *args], env=cli_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--engine ray needs Ray: pip install 'modelyard[ray]'" in proc.stderr
    assert not (tmp_path / "out").exists()
