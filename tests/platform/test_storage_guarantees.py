"""Cloud Storage's guarantees under concurrency, faults and hostile clients (issue 43), against the real
storage process (``python -m modelyard.platform.storage``: one for this module, with short connection
limits) through google-cloud-storage and requests: a full disk during a resumable upload, copies and
downloads racing overwrites, a chunk sent twice at once, bucket deletes racing uploads, names that are
not UTF-8, a bucket symlinked out of the root, huge and deep JSON, slow and silent connections, and the
storage's default port after a restart. The races run for a few seconds each and check every answer."""
from __future__ import annotations

import base64
import hashlib
import os
import random
import resource
import socket
import threading
import time
from urllib.parse import parse_qs, quote, urlsplit

import google_crc32c
import pytest
import requests

from tests.platform.conftest import require, wait_http
from tests.storage_server import StorageProcess

BUCKET = "guarantees"
TIMEOUT_S = 2  # --client_timeout_seconds of this module's storage
MAX_CONNECTIONS = 40
LIMIT_FLAGS = ["--client_timeout_seconds", str(TIMEOUT_S), "--max_connections", str(MAX_CONNECTIONS)]
RACE_S = 2.0  # how long each race runs


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    work = tmp_path_factory.mktemp("guarantees")
    p = StorageProcess(work / "root", work / "storage.log", LIMIT_FLAGS)
    try:
        wait_http(p.url + "/healthz", 30, p.proc, p.log)
        requests.post(p.url + "/storage/v1/b", json={"name": BUCKET}).raise_for_status()
        yield p
    finally:
        p.stop()


@pytest.fixture
def gcs(srv, monkeypatch):
    storage = require("google.cloud.storage", "pip install -e '.[test]'")
    import google.auth.credentials

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", srv.url)
    return storage.Client(project="local", credentials=google.auth.credentials.AnonymousCredentials())


def _crc(data: bytes) -> str:
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


def _media(srv, name: str) -> str:
    return f"{srv.url}/download/storage/v1/b/{BUCKET}/o/{quote(name, safe='')}?alt=media"


def _google_error(resp: requests.Response, code: int, reason: str) -> None:
    assert resp.status_code == code, resp.text
    assert resp.json()["error"]["errors"][0]["reason"] == reason, resp.text


def _race(*workers, seconds: float = RACE_S) -> None:
    """Run ``workers(stop)`` in threads for ``seconds``; an exception in one fails the test."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(w):
        try:
            w(stop)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]


# ---- finding 3: names and buckets that must not be served -------------------------------------------

def test_a_bucket_directory_symlinked_out_of_the_root_is_neither_read_nor_written(srv, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    link = srv.root / "evil"
    link.symlink_to(outside)
    try:
        _google_error(requests.get(f"{srv.url}/storage/v1/b/evil/o/secret"), 400, "invalid")
        _google_error(requests.get(f"{srv.url}/download/storage/v1/b/evil/o/secret?alt=media"), 400, "invalid")
        _google_error(requests.get(f"{srv.url}/storage/v1/b/evil/o"), 400, "invalid")
        _google_error(requests.post(f"{srv.url}/upload/storage/v1/b/evil/o?uploadType=media&name=planted",
                                    data=b"x"), 400, "invalid")
        assert not (outside / "planted").exists()
        assert "evil" not in [b["name"] for b in requests.get(f"{srv.url}/storage/v1/b").json().get("items", [])]
    finally:
        link.unlink()


def test_names_that_are_not_utf8_are_refused_not_merged(srv):
    for raw in ("%FF", "%FE", "bad%C3", "x%80y"):  # each decoded leniently would be a name with U+FFFD
        _google_error(requests.post(f"{srv.url}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={raw}",
                                    data=raw.encode()), 400, "invalid")
        _google_error(requests.get(f"{srv.url}/storage/v1/b/{BUCKET}/o/{raw}"), 400, "invalid")
    body = (b'--xx\r\nContent-Type: application/json\r\n\r\n{"name": "lone\\udcff"}\r\n'
            b"--xx\r\nContent-Type: text/plain\r\n\r\nhello\r\n--xx--\r\n")
    _google_error(requests.post(f"{srv.url}/upload/storage/v1/b/{BUCKET}/o?uploadType=multipart", data=body,
                                headers={"Content-Type": "multipart/related; boundary=xx"}), 400, "invalid")
    names = [o["name"] for o in requests.get(f"{srv.url}/storage/v1/b/{BUCKET}/o").json().get("items", [])]
    assert not [n for n in names if "\ufffd" in n or "lone" in n]


# ---- finding 4: a full disk during a resumable upload ----------------------------------------------

def test_a_resumable_upload_that_fills_the_disk_resumes_with_exactly_its_bytes(srv, gcs):
    data = os.urandom(12 << 20)
    url = gcs.bucket(BUCKET).blob("full/obj").create_resumable_upload_session(size=len(data))
    chunk = 4 << 20
    # The process may write no file past this size (RLIMIT_FSIZE: the kernel's short write, then EFBIG, as
    # a full disk gives a short write, then ENOSPC); it falls inside the second chunk, off any read boundary.
    limit = (5 << 20) + 12345
    r = requests.put(url, data=data[:chunk], headers={"Content-Range": f"bytes 0-{chunk - 1}/{len(data)}"})
    assert r.status_code == 308, r.text
    resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        r = requests.put(url, data=data[chunk:2 * chunk],
                         headers={"Content-Range": f"bytes {chunk}-{2 * chunk - 1}/{len(data)}"})
        assert r.status_code >= 500, r.text  # the disk refused: not acknowledged
    finally:
        resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    # The disk has room again: the client asks what is kept and sends from there (as google-resumable-media does).
    status = requests.put(url, headers={"Content-Range": f"bytes */{len(data)}"})
    assert status.status_code == 308
    kept = int(status.headers["Range"].split("-")[1]) + 1
    assert chunk <= kept <= limit  # what reached the file, never what was only offered
    r = requests.put(url, data=data[kept:], headers={"Content-Range": f"bytes {kept}-{len(data) - 1}/{len(data)}"})
    assert r.status_code == 200, r.text
    assert r.json()["size"] == str(len(data)) and r.json()["crc32c"] == _crc(data)
    got = requests.get(_media(srv, "full/obj"))
    assert len(got.content) == len(data) and got.content == data


# ---- findings 5 and 6: copies and downloads racing overwrites ---------------------------------------

def _overwriter(srv, name: str, written: dict, sizes: tuple[int, int] = (1 << 20, 3 << 20)):
    """Overwrite ``name`` again and again with bodies of different sizes; ``written[generation]`` = sha256."""
    def work(stop):
        while not stop.is_set():
            data = os.urandom(random.randint(*sizes))
            r = requests.post(f"{srv.url}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={quote(name)}",
                              data=data)
            assert r.status_code == 200, r.text
            written[int(r.json()["generation"])] = hashlib.sha256(data).hexdigest()
    return work


def test_copies_while_the_source_is_overwritten_hold_one_generation(srv, gcs):
    src = "race/copy-src"
    written: dict[int, str] = {}
    copies: list[tuple[str, int]] = []
    refused = []
    requests.post(f"{srv.url}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={quote(src)}", data=b"first")

    def copier(stop):
        k = 0
        while not stop.is_set():
            gen = int(requests.get(f"{srv.url}/storage/v1/b/{BUCKET}/o/{quote(src, safe='')}").json()["generation"])
            dest = f"race/copy-{threading.get_ident()}-{k}"
            k += 1
            verb = random.choice(["rewriteTo", "copyTo"])
            cond = random.random() < 0.5  # half compare-and-set on the source; half whatever is current
            r = requests.post(f"{srv.url}/storage/v1/b/{BUCKET}/o/{quote(src, safe='')}/{verb}/b/{BUCKET}/o/"
                              f"{quote(dest, safe='')}" + (f"?ifSourceGenerationMatch={gen}" if cond else ""))
            if r.status_code == 412:
                refused.append(gen)  # the source moved on: compare-and-set said no
                continue
            assert r.status_code == 200, r.text
            copies.append((dest, gen if cond else None))

    small = (1, 4 << 10)  # small bodies: many overwrites a second, each a chance to land inside a copy
    _race(_overwriter(srv, src, written, small), _overwriter(srv, src, written, small), copier, copier)
    assert copies
    bucket = gcs.bucket(BUCKET)
    shas = {*written.values(), hashlib.sha256(b"first").hexdigest()}
    for dest, gen in copies:
        data = bucket.blob(dest).download_as_bytes(checksum="crc32c")  # DataCorruption if the CRC32C is wrong
        if gen in written:  # (the first body was not ours to record)
            assert hashlib.sha256(data).hexdigest() == written[gen], f"{dest}: not the bytes of generation {gen}"
        assert hashlib.sha256(data).hexdigest() in shas, f"{dest}: bytes no write sent"


def test_downloads_while_the_object_is_overwritten_get_one_generation(srv):
    name = "race/read"
    written: dict[int, str] = {}
    requests.post(f"{srv.url}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={quote(name)}", data=b"0" * 100)
    reads = []

    def reader(stop):
        while not stop.is_set():
            r = requests.get(_media(srv, name), timeout=10)
            assert r.status_code == 200, r.text
            crc = r.headers["x-goog-hash"].split("crc32c=")[1].split(",")[0]
            assert len(r.content) == int(r.headers["x-goog-stored-content-length"]), "a body of another length"
            assert _crc(r.content) == crc, "bytes of one generation, headers of another"
            reads.append((int(r.headers["x-goog-generation"]), hashlib.sha256(r.content).hexdigest()))

    _race(_overwriter(srv, name, written), _overwriter(srv, name, written), reader, reader, reader)
    assert len(reads) > 10
    for gen, sha in reads:
        if gen in written:
            assert written[gen] == sha


# ---- finding 7: one chunk sent twice at once ------------------------------------------------------

def test_a_chunk_sent_again_while_its_first_attempt_is_arriving_is_taken_once(srv, gcs):
    data = os.urandom(6 << 20)
    chunk = 4 << 20
    url = gcs.bucket(BUCKET).blob("twice/obj").create_resumable_upload_session(size=len(data))
    upload_id = parse_qs(urlsplit(url).query)["upload_id"][0]
    session_file = srv.root / ".modelyard" / "uploads" / upload_id
    target = urlsplit(url)
    head = (f"PUT {target.path}?{target.query} HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n"
            f"Content-Length: {chunk}\r\nContent-Range: bytes 0-{chunk - 1}/{len(data)}\r\n\r\n").encode()
    first = socket.create_connection(("127.0.0.1", srv.port))
    try:
        first.sendall(head + data[:chunk // 2])
        deadline = time.monotonic() + 10
        while (not session_file.exists() or session_file.stat().st_size < chunk // 2) and time.monotonic() < deadline:
            time.sleep(0.01)  # the first attempt's half is in the session
        retry: dict = {}
        t = threading.Thread(target=lambda: retry.update(r=requests.put(
            url, data=data[:chunk], headers={"Content-Range": f"bytes 0-{chunk - 1}/{len(data)}"}, timeout=30)))
        t.start()  # the client's retry of the same chunk, while the first is still sending
        time.sleep(0.3)  # let the retry arrive while the first attempt is still open (either order must hold)
        first.sendall(data[chunk // 2:chunk])
        answer = first.recv(4096)
        t.join(30)
    finally:
        first.close()
    assert answer.startswith(b"HTTP/1.1 308"), answer[:200]
    assert retry["r"].status_code == 308, retry["r"].text
    assert retry["r"].headers["Range"] == f"bytes=0-{chunk - 1}"
    r = requests.put(url, data=data[chunk:], headers={"Content-Range": f"bytes {chunk}-{len(data) - 1}/{len(data)}"})
    assert r.status_code == 200, r.text
    assert requests.get(_media(srv, "twice/obj")).content == data


def test_a_resent_chunk_that_differs_from_the_kept_bytes_is_refused(srv, gcs):
    data = os.urandom(1 << 20)
    url = gcs.bucket(BUCKET).blob("twice/differs").create_resumable_upload_session(size=2 * len(data))
    rng = f"bytes 0-{len(data) - 1}/{2 * len(data)}"
    assert requests.put(url, data=data, headers={"Content-Range": rng}).status_code == 308
    _google_error(requests.put(url, data=os.urandom(len(data)), headers={"Content-Range": rng}), 400, "invalid")
    r = requests.put(url, data=data, headers={"Content-Range": rng})  # the same bytes again: taken once
    assert r.status_code == 308 and r.headers["Range"] == f"bytes=0-{len(data) - 1}"


# ---- finding 8: bucket deletes racing uploads -------------------------------------------------------

def test_bucket_deletes_racing_uploads_lose_no_acknowledged_object(srv):
    acked: list[str] = []
    violations: list[str] = []

    def uploader(bucket):
        def work(stop):
            k = 0
            while not stop.is_set():
                name = f"o-{threading.get_ident()}-{k}"
                k += 1
                r = requests.post(f"{srv.url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}",
                                  data=os.urandom(random.randint(1, 16 << 10)))
                if r.status_code != 200:
                    assert r.status_code == 404, r.text  # the bucket was gone: refused, nothing stored
                    continue
                acked.append(name)
                # Acknowledged: it stays until deleted, and keeps its bucket from being deleted meanwhile.
                if requests.get(f"{srv.url}/storage/v1/b/{bucket}/o/{name}").status_code != 200:
                    violations.append(f"acknowledged {bucket}/{name} vanished")
                    return
                r = requests.delete(f"{srv.url}/storage/v1/b/{bucket}/o/{name}")  # empty again: a delete may win
                if r.status_code != 204:
                    violations.append(f"acknowledged {bucket}/{name} could not be deleted: {r.status_code}")
                    return
        return work

    def deleter(bucket):
        def work(stop):
            while not stop.is_set():
                r = requests.delete(f"{srv.url}/storage/v1/b/{bucket}")
                if r.status_code == 204:
                    r = requests.post(f"{srv.url}/storage/v1/b", json={"name": bucket})
                    if r.status_code != 200:  # an upload brought the folder back without its record
                        violations.append(f"{bucket} re-created behind its delete: {r.status_code} {r.text[:100]}")
                        return
                else:
                    assert r.status_code == 409, r.text
        return work

    workers = []
    for i in range(3):  # three buckets, each with its deleter and two uploaders
        bucket = f"racing-deletes-{i}"
        assert requests.post(f"{srv.url}/storage/v1/b", json={"name": bucket}).status_code == 200
        workers += [uploader(bucket), uploader(bucket), deleter(bucket)]
    _race(*workers, seconds=2 * RACE_S)
    assert acked
    assert not violations, violations[:5]


# ---- finding 11: slow, silent and too many connections ---------------------------------------------

def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_slow_and_silent_connections_are_closed_and_capped(srv):
    addr = ("127.0.0.1", srv.port)
    slow_head = socket.create_connection(addr)
    slow_head.sendall(b"GET /storage/v1/b HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    paused_body = socket.create_connection(addr)
    paused_body.sendall(f"POST /upload/storage/v1/b/{BUCKET}/o?uploadType=media&name=slow HTTP/1.1\r\n"
                        "Host: x\r\nContent-Length: 1000\r\n\r\nabc".encode())
    silent = [socket.create_connection(addr) for _ in range(MAX_CONNECTIONS + 10)]  # more than the cap
    try:
        # An active client still gets in: the longest-silent connections made room for it.
        assert requests.get(f"{srv.url}/storage/v1/b/{BUCKET}", timeout=10).status_code == 200
        for s in (slow_head, paused_body):
            assert _closed_within(s, 3 * TIMEOUT_S + 5)
        assert all(_closed_within(s, 3 * TIMEOUT_S + 5) for s in silent)
        # Past the cap with only heads under way, a newcomer gets a 503: tested one layer down, where the
        # test can wait until the server has read those heads (test_storage_connection_limits.py).
    finally:
        for s in (slow_head, paused_body, *silent):
            s.close()
    assert not (srv.root / BUCKET / "slow").exists()


# ---- finding 12: JSON bodies: size and depth ------------------------------------------------------

def test_huge_and_deep_json_bodies_get_4xx_not_memory_or_500(srv):
    name = "json/target"
    requests.post(f"{srv.url}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={quote(name)}", data=b"x")
    url = f"{srv.url}/storage/v1/b/{BUCKET}/o/{quote(name, safe='')}"
    huge = b'{"metadata": {"k": "' + b"x" * (4 << 20) + b'"}}'
    r = requests.patch(url, data=huge, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == 413, r.text[:300]
    for depth in (150, 50_000):  # past the nesting limit; past Python's recursion limit
        deep = b'{"metadata": {"k": ' + b"[" * depth + b"]" * depth + b"}}"
        _google_error(requests.patch(url, data=deep, headers={"Content-Type": "application/json"}), 400, "invalid")
        _google_error(requests.post(f"{srv.url}/storage/v1/b", data=b'{"name": "deep-b", "labels": '
                                    + b"[" * depth + b"]" * depth + b"}"), 400, "invalid")
    assert requests.patch(url, json={"metadata": {"k": "v"}}).json()["metadata"] == {"k": "v"}


# ---- finding 14: the default storage port after a restart ------------------------------------------

def test_the_default_storage_port_is_kept_while_in_time_wait():
    from modelyard.platform.cli import _default_storage_port
    from modelyard.ports import free_port

    port = free_port()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()  # the server side closes first: its end (port) waits in TIME_WAIT, as after a kill
    client.close()
    listener.close()
    assert _default_storage_port("127.0.0.1", port - 1) == port


# ---- one layer down: a resumable session across failures and restarts (seen by bench/chaos.py) --------

def _session(tmp_path, data: bytes):
    from modelyard.platform.storage.objects import Store
    from modelyard.platform.storage.uploads import Uploads

    store = Store(tmp_path / "root")
    store.create_bucket({"name": "bkt"})
    uploads = Uploads(store)
    upload_id = uploads.start("bkt", "obj", {}, {}, len(data))
    uploads.session(upload_id).writer.write(data)
    return store, uploads, upload_id


def test_a_session_stopped_after_its_object_is_in_place_is_complete_after_a_restart(tmp_path, monkeypatch):
    import sqlite3

    from modelyard.platform.storage.objects import Store
    from modelyard.platform.storage.uploads import Uploads

    store, uploads, upload_id = _session(tmp_path, b"hello")
    real = store.db.update_upload

    def disk_gone_after_the_rename(uid, extra):
        if "done" in extra:  # the object is in place; the row cannot say so (full disk, or a kill -9 here)
            raise sqlite3.OperationalError("disk I/O error")
        real(uid, extra)

    monkeypatch.setattr(store.db, "update_upload", disk_gone_after_the_rename)
    with pytest.raises(sqlite3.OperationalError):
        uploads.finish(uploads.session(upload_id), None, None)
    restarted = Uploads(Store(tmp_path / "root"))
    s = restarted.session(upload_id)  # not a 404: the upload is complete
    assert s.extra["done"][:2] == ["bkt", "obj"]
    rec, f = restarted.store.open_read("bkt", "obj")
    with f:
        assert f.read() == b"hello" and rec.crc32c == _crc(b"hello")


def test_a_session_whose_commit_fails_on_the_disk_keeps_its_bytes_for_the_retry(tmp_path, monkeypatch):
    import errno

    store, uploads, upload_id = _session(tmp_path, b"hello")
    real = store._place

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "_place", full)
    with pytest.raises(OSError):
        uploads.finish(uploads.session(upload_id), None, None)
    monkeypatch.setattr(store, "_place", real)
    s = uploads.session(upload_id)  # read again from its row and file: all five bytes still held
    assert s.persisted == 5
    rec = uploads.finish(s, None, None)
    assert rec.size == 5 and rec.crc32c == _crc(b"hello")
